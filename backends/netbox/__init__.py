"""The NetBox backend: NetboxIPPool and GlobalNetboxIPPool (v1alpha1), addresses allocated in a real NetBox."""

from backends.netbox.backend import NetboxBackend, NetboxSettings
from ipam_provider.backend.contract import BackendContext

__all__ = ["NetboxBackend", "NetboxSettings", "create_backend"]


def create_backend(context: BackendContext) -> NetboxBackend:
    return NetboxBackend(context)
