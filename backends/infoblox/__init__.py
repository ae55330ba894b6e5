"""The Infoblox backend: InfobloxIPPool pools (v1alpha1) allocated on an Infoblox NIOS grid over WAPI, with the
grid described by a cluster-scoped InfobloxInstance. See docs/infoblox.md."""

from backends.infoblox.backend import InfobloxBackend
from ipam_provider.backend.contract import BackendContext


def create_backend(context: BackendContext) -> InfobloxBackend:
    return InfobloxBackend(context)
