"""The in-cluster backend: InClusterIPPool and GlobalInClusterIPPool (v1alpha2), wire-compatible with the Go
in-cluster provider."""

from backends.incluster.backend import InClusterBackend
from ipam_provider.backend.contract import BackendContext


def create_backend(context: BackendContext) -> InClusterBackend:
    return InClusterBackend(context)
