"""The fake backend with the repair capability: its holdings are records (handle → pool, address, claim, uid).

`allocate` and `release` keep the records in step with what the fake backend holds. `list_holdings` answers a
pool's records `page_size` at a time, one `pacer.wait()` before each page (each page is journalled as
`backend page <pool>`). `release_holding` removes a record still as listed; `restore` records an address for a
claim when no record holds it (TAKEN when one does for another claim, or when `foreign` names it: something
outside Kubernetes holds it; OUTSIDE when `outside` names it). `outside_pool` answers the addresses of `outside`.
`sweep_orphaned` counts its calls. Methods fail on request, as the fake backend's do (`fail(method, error)`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ipam_provider.backend.contract import Allocation, ClaimContext, PoolRef
from ipam_provider.backend.protocol import Capabilities
from ipam_provider.backend.repair import Holding, Pacer, Restore, RestoreOutcome
from ipam_provider.common import Object
from tests.support.fake_backend import BackendCall, FakeBackend


@dataclass
class Record:
    pool: PoolRef
    address: str
    claim: str
    claim_uid: str
    releasable: bool = True
    why_kept: str = ""


@dataclass
class RepairableFakeBackend(FakeBackend):
    records: dict[str, Record] = field(default_factory=dict)  # by handle
    foreign: dict[str, str] = field(default_factory=dict)  # address → who holds it outside Kubernetes
    outside: dict[str, str] = field(default_factory=dict)  # address → why it is outside every pool
    page_size: int = 2
    sweeps: list[float] = field(default_factory=list)
    _handles: int = 0

    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities(), repair=self, sweep_orphaned=self.sweep_orphaned)

    def hold(
        self, pool: PoolRef, address: str, claim: str, claim_uid: str, *, releasable: bool = True, why_kept: str = ""
    ) -> Holding:
        """Record a holding directly (as if made earlier, or behind the controller's back); `releasable` False: a
        record that does not prove this management cluster made it."""
        self._handles += 1
        handle = f"rec-{self._handles}"
        self.records[handle] = Record(pool, address, claim, claim_uid, releasable, why_kept)
        return Holding(address, claim, claim_uid, handle, releasable=releasable, why_kept=why_kept)

    def holdings(self, pool: PoolRef) -> list[Holding]:
        return [
            Holding(r.address, r.claim, r.claim_uid, handle, releasable=r.releasable, why_kept=r.why_kept)
            for handle, r in self.records.items()
            if r.pool == pool
        ]

    def addresses_held(self, pool: PoolRef) -> list[str]:
        return sorted(r.address for r in self.records.values() if r.pool == pool)

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        allocation = await super().allocate(pool_ref, pool, claim, existing)
        if not any(r.claim_uid == claim.uid and r.pool == pool_ref for r in self.records.values()):
            self.hold(pool_ref, allocation.address, str(claim), claim.uid)
        return allocation

    async def release(
        self, pool_ref: PoolRef, pool: Object | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        await super().release(pool_ref, pool, claim, allocation)
        self.records = {h: r for h, r in self.records.items() if not (r.pool == pool_ref and r.claim_uid == claim.uid)}

    async def list_holdings(self, pool_ref: PoolRef, pool: Object, pacer: Pacer) -> Sequence[Holding]:
        self._record(BackendCall("list_holdings", pool_ref, pool))
        held = self.holdings(pool_ref)
        result: list[Holding] = []
        for start in range(0, max(len(held), 1), self.page_size):
            await pacer.wait()
            self.journal.append(f"backend page {pool_ref.name}")
            result += held[start : start + self.page_size]
        return result

    async def release_holding(self, pool_ref: PoolRef, pool: Object, holding: Holding) -> bool:
        self._record(BackendCall("release_holding", pool_ref, pool))
        record = self.records.get(holding.handle)
        if record is None or record.claim_uid != holding.claim_uid or record.pool != pool_ref:
            return False
        del self.records[holding.handle]
        self.held.pop(holding.claim_uid, None)
        return True

    async def restore(self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, allocation: Allocation) -> Restore:
        self._record(BackendCall("restore", pool_ref, pool, claim, allocation))
        if allocation.address in self.outside:
            return Restore(RestoreOutcome.OUTSIDE, self.outside[allocation.address])
        if allocation.address in self.foreign:
            return Restore(RestoreOutcome.TAKEN, self.foreign[allocation.address])
        for handle, record in self.records.items():
            if record.pool == pool_ref and record.address == allocation.address:
                if record.claim_uid == claim.uid:
                    return Restore(RestoreOutcome.HELD)
                return Restore(RestoreOutcome.TAKEN, f"record {handle} (claim {record.claim})")
        self.hold(pool_ref, allocation.address, str(claim), claim.uid)
        self.held[claim.uid] = allocation
        return Restore(RestoreOutcome.RECORDED)

    async def outside_pool(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> Mapping[str, str]:
        self._record(BackendCall("outside_pool", pool_ref, pool))
        return {address: self.outside[address] for address in addresses if address in self.outside}

    async def sweep_orphaned(self, grace_seconds: float) -> int:
        self.sweeps.append(grace_seconds)
        return 0
