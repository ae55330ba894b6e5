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

__all__ = [
    "JSON",
    "AddressCounts",
    "Allocation",
    "AllocationFailedError",
    "Backend",
    "BackendContext",
    "BackendError",
    "ClaimContext",
    "PoolExhaustedError",
    "PoolKind",
    "PoolNotReadyError",
    "PoolRef",
    "PoolReport",
    "ReleaseImpossibleError",
]
