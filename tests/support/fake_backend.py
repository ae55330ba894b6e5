"""A pool backend that keeps its allocations in a dict, records every call, and fails on request.

It serves two pool kinds of a test group, one namespaced and one cluster-scoped. `allocate` hands out 10.0.0.10,
10.0.0.11, ... (prefix 24, gateway 10.0.0.1) and holds each for its claim's uid, as the contract asks: the same
claim gets the same address again, and `existing` is recorded as held. `release` forgets what the claim holds.
`report` answers `report_with`. `fail(method, error)` makes a method raise `error` until `fail(method, None)`.
`capabilities()` declares `name`, `concurrent_claims` and `report_interval`; subclasses add theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ipam_provider.backend.contract import AddressCounts, Allocation, ClaimContext, PoolKind, PoolRef, PoolReport
from ipam_provider.backend.protocol import Capabilities
from ipam_provider.common import Object

GROUP = "ipam.test.example"
FAKE_POOL = PoolKind(GROUP, "v1alpha1", "FakeIPPool", "fakeippools", namespaced=True)
GLOBAL_FAKE_POOL = PoolKind(GROUP, "v1alpha1", "GlobalFakeIPPool", "globalfakeippools", namespaced=False)
HANDLE = f"{GROUP}/handle"  # the backend's bookkeeping annotation, handed back on release


@dataclass(frozen=True)
class BackendCall:
    method: str  # allocate, release, report
    pool_ref: PoolRef
    pool: Object | None
    claim: ClaimContext | None = None
    allocation: Allocation | None = None  # `existing` for allocate, `allocation` for release
    addresses: tuple[Allocation, ...] = ()  # report

    def __str__(self) -> str:
        return f"backend {self.method} {self.claim.name if self.claim else self.pool_ref.name}"


@dataclass
class FakeBackend:
    name: ClassVar[str] = ""
    journal: list[str] = field(default_factory=list)
    calls: list[BackendCall] = field(default_factory=list)
    held: dict[str, Allocation] = field(default_factory=dict)  # by claim uid
    report_with: PoolReport = field(
        default_factory=lambda: PoolReport(
            True, "PoolReady", "ready", counts=AddressCounts(total=254, used=0, free=254)
        )
    )
    failures: dict[str, BaseException] = field(default_factory=dict)
    concurrent_claims: bool = False
    report_interval: float | None = None
    closed: bool = False
    _next: int = 10

    @property
    def kinds(self) -> Sequence[PoolKind]:
        return [FAKE_POOL, GLOBAL_FAKE_POOL]

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name=self.name, concurrent_claims=self.concurrent_claims, report_interval=self.report_interval
        )

    def fail(self, method: str, error: BaseException | None) -> None:
        """Make `method` ("allocate", "release", "report") raise `error` from now on; None heals it."""
        if error is None:
            self.failures.pop(method, None)
        else:
            self.failures[method] = error

    def calls_of(self, method: str) -> list[BackendCall]:
        return [call for call in self.calls if call.method == method]

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        self._record(BackendCall("allocate", pool_ref, pool, claim, existing))
        if existing is not None:
            self.held[claim.uid] = existing
            return existing
        held = self.held.get(claim.uid)
        if held is None:
            held = Allocation(f"10.0.0.{self._next}", 24, "10.0.0.1", {HANDLE: f"h-{self._next}"})
            self._next += 1
            self.held[claim.uid] = held
        return held

    async def release(
        self, pool_ref: PoolRef, pool: Object | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        self._record(BackendCall("release", pool_ref, pool, claim, allocation))
        self.held.pop(claim.uid, None)

    async def report(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[Allocation]) -> PoolReport:
        self._record(BackendCall("report", pool_ref, pool, addresses=tuple(addresses)))
        return self.report_with

    async def close(self) -> None:
        self.closed = True

    def _record(self, call: BackendCall) -> None:
        self.calls.append(call)
        self.journal.append(str(call))
        failure = self.failures.get(call.method)
        if failure is not None:
            raise failure
