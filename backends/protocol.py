"""The backend contract, importable under its historical path for plugins; it lives in `ipam_provider.backend`."""

from ipam_provider.backend.contract import (
    AddressCounts,
    Allocation,
    AllocationFailedError,
    Backend,
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
    "ClaimContext",
    "Object",
    "PoolExhaustedError",
    "PoolKind",
    "PoolNotReadyError",
    "PoolRef",
    "PoolReport",
    "ReleaseImpossibleError",
]
