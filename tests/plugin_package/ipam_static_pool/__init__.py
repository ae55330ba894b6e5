"""An example third-party backend: `StaticIPPool` (ipam.example.com/v1alpha1) hands out its listed addresses.

It exists to prove that an installed package can add a pool kind. It keeps its allocations in memory, so it is
not meant for production: a real backend must record allocations durably (see the in-cluster backend).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from backends.protocol import (
    AddressCounts,
    Allocation,
    BackendContext,
    Capabilities,
    ClaimContext,
    PoolExhaustedError,
    PoolKind,
    PoolRef,
    PoolReport,
)

STATIC_POOL = PoolKind("ipam.example.com", "v1alpha1", "StaticIPPool", "staticippools", namespaced=True)


class StaticPoolBackend:
    def __init__(self) -> None:
        self._held: dict[tuple[str, str], dict[str, str]] = {}  # pool key -> claim uid -> address

    @property
    def kinds(self) -> Sequence[PoolKind]:
        return (STATIC_POOL,)

    def capabilities(self) -> Capabilities:
        return Capabilities()  # no optional capability

    async def allocate(
        self, pool_ref: PoolRef, pool: Mapping[str, Any], claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        held = self._held.setdefault((pool["metadata"]["namespace"], pool["metadata"]["name"]), {})
        prefix = int(pool["spec"].get("prefix", 32))
        if claim.uid not in held:
            free = [a for a in pool["spec"]["addresses"] if a not in held.values()]
            if existing is not None:
                free = [existing.address]
            if not free:
                raise PoolExhaustedError(f"StaticIPPool {pool['metadata']['name']} has no free address")
            held[claim.uid] = free[0]
        return Allocation(held[claim.uid], prefix, annotations={"ipam.example.com/served-by": "static"})

    async def release(
        self, pool_ref: PoolRef, pool: Mapping[str, Any] | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        self._held.get((pool_ref.namespace or "", pool_ref.name), {}).pop(claim.uid, None)

    async def report(self, pool_ref: PoolRef, pool: Mapping[str, Any], addresses: Sequence[Allocation]) -> PoolReport:
        total = len(pool["spec"]["addresses"])
        counts = AddressCounts(total=total, used=len(addresses), free=total - len(addresses))
        return PoolReport(True, "PoolReady", f"{counts.free} of {total} free", counts=counts)

    async def close(self) -> None:
        self._held.clear()


def create_backend(context: BackendContext) -> StaticPoolBackend:
    return StaticPoolBackend()
