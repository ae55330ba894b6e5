"""The repair capability: what a backend offers the core's repair loop (`ipam_provider/repair`).

The loop compares what a backend holds under this controller's ownership mark (its *holdings*: the in-cluster
reservations, the NetBox IP objects with our tag and claim-uid field, the Infoblox objects with our extensible
attributes) with the live IPAddresses and claims, read fresh from the API server, and heals the difference:

- a holding that no live IPAddress or claim accounts for is a suspected leak, released (`release_holding`) only
  after it stayed unaccounted for across consecutive passes spanning a grace period, and never while its claim is
  being reconciled;
- a live IPAddress whose address the backend no longer holds for its claim is restored (`restore`): recorded again
  if the address is free, or reported as a duplicate if something else holds it, and never handed out again;
- a live IPAddress outside its pool is reported (`outside_pool`).

A backend offers the capability by having all three methods; `repairer_of` finds them. A backend may also offer
`sweep_orphaned(grace_seconds)` (see `orphan_sweeper_of`) for holdings of pools that no longer exist, and
`list_pools_holdings(pools, pacer)` (see `pools_lister_of`) when it can list every pool's holdings in fewer
requests than one listing per pool.

Contract shared by the methods:
- They read the backend's own record, never a cache that could lag, and call `pacer.wait()` before each request to
  the external system or the API server they make for the listing, so that a pass never bursts.
- They never touch an object that does not carry this controller's ownership mark.
- They raise `BackendError` (or a subclass) when the external system cannot be used now; the loop then skips the
  pool for this pass and tries again on the next.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from ipam_provider.backend.contract import Allocation, ClaimContext, PoolRef
from ipam_provider.common import Object


@dataclass(frozen=True)
class Holding:
    """One allocation a backend holds under this controller's ownership mark, as its own record shows it.

    `address` is the canonical address text (`ipaddress.ip_address(...)` form; a prefix pool's child by its first
    address). `claim` is the claim recorded with it as `namespace/name` ("" when the record does not name one).
    `claim_uid` is the uid recorded with it; "" marks a holding that is not held for a claim (an in-cluster pin
    not yet taken, or a release record): such a holding is never a leak and the loop leaves it alone. `handle`
    identifies the record in the backend (a reservation name, a NetBox id, a WAPI reference); it appears in logs
    and Events and must never contain a credential. `created_at` is when the record was made (seconds since the
    epoch), when the backend knows it.

    `releasable` is False when the record does not prove it was made by this management cluster (for example an
    object made before the backend stamped the cluster's identity, in an external system several management
    clusters may share). Such a holding, when no live IPAddress or claim accounts for it, is reported as a
    suspected leak (its `RepairSuspectedLeak` Event says why it is not released) and is never released; `why_kept`
    says why, for people.
    """

    address: str
    claim: str
    claim_uid: str
    handle: str
    created_at: float | None = None
    releasable: bool = True
    why_kept: str = ""

    @property
    def claim_namespace(self) -> str:
        """The namespace of the recorded claim ("" when none is recorded)."""
        return self.claim.partition("/")[0] if "/" in self.claim else ""


class RestoreOutcome(StrEnum):
    """What `restore` found and did."""

    HELD = "Held"  # the backend already holds the address for the claim: nothing was done
    RECORDED = "Recorded"  # the address was free: it is now recorded again for the claim
    TAKEN = "Taken"  # something else holds the address: a duplicate, reported and never handed out again
    OUTSIDE = "Outside"  # the address is not an address of the pool: nothing was recorded


@dataclass(frozen=True)
class Restore:
    """The answer of `restore`. `detail` says, for people, who holds the address (TAKEN: for example "NetBox IP
    address 12 (not ours)" or "claim ns/other") or why it is outside the pool (OUTSIDE); never a credential."""

    outcome: RestoreOutcome
    detail: str = ""


class Pacer(Protocol):
    """Bounds a pass's request rate: `await pacer.wait()` before each request of a listing."""

    async def wait(self) -> None: ...


@runtime_checkable
class Repairable(Protocol):
    """The repair capability (see the module's contract)."""

    async def list_holdings(self, pool_ref: PoolRef, pool: Object, pacer: Pacer) -> Sequence[Holding]:
        """Every allocation the pool holds under this controller's mark, read from the backend's own record, page
        by page (one `pacer.wait()` before each page). Raises BackendError when the record cannot be read."""
        ...

    async def release_holding(self, pool_ref: PoolRef, pool: Object, holding: Holding) -> bool:
        """Release exactly this holding if it is still as listed (same record, same claim uid, still carrying our
        mark). Answers True when it was released, False when it had changed or was already gone. Raises
        BackendError when the external system cannot be used now."""
        ...

    async def restore(self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, allocation: Allocation) -> Restore:
        """Make the backend hold `allocation.address` for `claim` (its live IPAddress names that address), reading
        the backend's own record first, never a cache. Never takes the address from another holder, never creates
        a second record for it, and never frees anything. Raises BackendError when the external system cannot be
        used now."""
        ...

    async def outside_pool(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> Mapping[str, str]:
        """Of `addresses` (the pool's live IPAddresses' addresses), those that are not addresses of the pool as it
        is now (for example after the pool shrank), each with why, for people. Answers {} when the backend cannot
        tell now."""
        ...


def repairer_of(backend: object) -> Repairable | None:
    """The backend as a `Repairable`, or None when it does not offer the repair capability."""
    return backend if isinstance(backend, Repairable) else None


PoolsLister = Callable[[Sequence[tuple[PoolRef, Object]], Pacer], Awaitable[Mapping[PoolRef, Sequence[Holding]]]]


def pools_lister_of(backend: object) -> PoolsLister | None:
    """The backend's optional `async list_pools_holdings(pools, pacer)`, or None: what `list_holdings` answers for
    each of `pools` ((reference, object) pairs), read together in one paged listing of the backend's record (one
    `pacer.wait()` before each page), so that a pass costs requests by holdings, not by pools. A pool missing from
    the answer holds nothing. Raises BackendError when the record cannot be read: the loop then skips these pools
    for this pass."""
    lister = getattr(backend, "list_pools_holdings", None)
    return lister if callable(lister) else None


OrphanSweeper = Callable[[float], Awaitable[int]]


def orphan_sweeper_of(backend: object) -> OrphanSweeper | None:
    """The backend's optional `async sweep_orphaned(grace_seconds) -> int`, or None: it releases the holdings of
    pools that no longer exist, older than `grace_seconds`, that no live IPAddress names, and answers how many.
    The repair loop calls it once per pass (only when releasing leaks is on); a costly sweep may run less often
    (answering 0 when it does not run)."""
    sweep = getattr(backend, "sweep_orphaned", None)
    return sweep if callable(sweep) else None
