"""The `Backend` protocol every pool backend implements (its types and errors are in `contract`, the repair
capability's in `repair`), and the typed `Capabilities` it declares by `Backend.capabilities()`, resolved once when
it is registered (`BackendRegistry.register`): the core calls an optional capability through them only."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from ipam_provider.backend.contract import (
    AdmissionReviewer,
    Allocation,
    ClaimContext,
    PoolKind,
    PoolObserver,
    PoolRef,
    PoolReport,
    Preparer,
)
from ipam_provider.backend.repair import OrphanSweeper, PoolsLister, Repairable
from ipam_provider.common import Object


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers besides the `Backend` methods (None: not offered).

    - `name`: the backend's name (its metrics' `backend` label) when registered without one; "": from its module.
    - `prepare(pool_ref, pool)`: called once per pool known at start, while the claim and IPAddress caches still
      sync, to warm what a first allocation needs. A failure is only logged.
    - `review_pool_change(pool_ref, old, new, in_use) -> list[str]`: the admission webhook calls it for a pool being
      created (`old` None), updated (not when `spec` is unchanged), or deleted (`new` None; once the core's delete
      check passed), with the live IPAddresses naming the pool. It answers the reasons to refuse, each a sentence a
      person can act on (empty: allowed); it must be quick, must not write, and must not raise for a spec it cannot
      parse (that is a reason to refuse).
    - `observe_pool(kind, old, new) -> Collection[PoolRef]`: for reports that depend on other pools (overlaps).
      Called in the watch's event handler for every change of the backend's pools (`old` None: added; `new` None:
      deleted), the initial list included, before any reconcile that follows; it answers the other pools whose
      report the change may alter (reported again). It must be quick and must not block.
    - `accept_reporter(report_soon)`: called once when a controller is built, with `report_soon(pool_ref)`, which
      has that pool reported again soon; for reports that follow a state several pools share and that a call
      outside their own reports may change (the health of an external system's connection).
    - `report_interval` (seconds, > 0): how often each live pool is reported again, for reports that follow an
      external system no watch shows; None: on changes and every `--sync-period`.
    - `concurrent_claims`: True when the backend accepts concurrent calls for several claims of one pool (else it
      gets them one at a time).
    - `repair`: the repair capability (`ipam_provider.backend.repair.Repairable`), with optionally
      `list_pools_holdings` and `sweep_orphaned` (see that module).
    """

    name: str = ""
    prepare: Preparer | None = None
    review_pool_change: AdmissionReviewer | None = None
    observe_pool: PoolObserver | None = None
    accept_reporter: Callable[[Callable[[PoolRef], None]], None] | None = None
    report_interval: float | None = None
    concurrent_claims: bool = False
    repair: Repairable | None = None
    list_pools_holdings: PoolsLister | None = None
    sweep_orphaned: OrphanSweeper | None = None

    def resolved(self) -> Capabilities:
        """These capabilities as the core uses them: `report_interval` None unless a positive number,
        `concurrent_claims` False unless exactly True (a plugin's declaration is not type-checked)."""
        interval = self.report_interval
        positive = isinstance(interval, int | float) and interval > 0
        return replace(
            self,
            report_interval=float(interval) if positive and interval is not None else None,
            concurrent_claims=self.concurrent_claims is True,
        )


@runtime_checkable
class Backend(Protocol):
    """A pool backend. One instance serves every pool of its kinds."""

    @property
    def kinds(self) -> Sequence[PoolKind]:
        """The pool kinds this backend serves."""
        ...

    def capabilities(self) -> Capabilities:
        """The optional capabilities this backend offers (`Capabilities()`: none)."""
        ...

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        """The address the pool holds for `claim.uid`, allocating one if it holds none; with `existing` (an
        IPAddress names the claim) exactly that address, or AllocationFailedError if another claim holds it.
        Raises PoolNotReadyError, PoolExhaustedError or AllocationFailedError. Never hands out an address another
        claim holds, even when several controller processes call at once."""
        ...

    async def release(
        self, pool_ref: PoolRef, pool: Object | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        """Release whatever the pool holds for `claim.uid` (what is gone already succeeds). `pool` is None when the
        pool is gone, `allocation` when no IPAddress recorded one. Never releases what this controller did not
        allocate for this claim."""
        ...

    async def report(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[Allocation]) -> PoolReport:
        """Validate the pool `pool_ref` and count its usage. `addresses` are the IPAddresses that name the pool."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...
