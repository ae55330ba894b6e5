"""The backend contract, importable under its historical path for plugins; it lives in `ipam_provider.backend`
(`protocol`: `Backend`, `Capabilities`; `contract`: the types and errors)."""

from ipam_provider.backend.contract import (
    AddressCounts,
    Allocation,
    AllocationFailedError,
    BackendContext,
    BackendError,
    ClaimContext,
    PoolExhaustedError,
    PoolKind,
    PoolNotReadyError,
    PoolRef,
    PoolReport,
    ReleaseImpossibleError,
)
from ipam_provider.backend.protocol import Backend, Capabilities
from ipam_provider.common import Object

JSON = Object
"""The same type as `Object`: plugins may import either name."""

__all__ = [
    "JSON",
    "AddressCounts",
    "Allocation",
    "AllocationFailedError",
    "Backend",
    "BackendContext",
    "BackendError",
    "Capabilities",
    "ClaimContext",
    "Object",
    "PoolExhaustedError",
    "PoolKind",
    "PoolNotReadyError",
    "PoolRef",
    "PoolReport",
    "ReleaseImpossibleError",
]
