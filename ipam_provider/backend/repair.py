"""The repair capability: what a backend offers the core's repair loop (`ipam_provider/repair`, docs/repair.md), by
naming a `Repairable` as its `Capabilities.repair`; optionally also `Capabilities.sweep_orphaned` (an
`OrphanSweeper`) and `Capabilities.list_pools_holdings` (a `PoolsLister`).

Every method reads the backend's own record, never a cache; calls `pacer.wait()` before each listing request; never
touches an object without this controller's ownership mark; and raises `BackendError` when the external system
cannot be used now (the pool is then skipped until the next pass).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from ipam_provider.backend.contract import Allocation, ClaimContext, PoolRef
from ipam_provider.common import Object


@dataclass(frozen=True)
class Holding:
    """One allocation a backend holds under this controller's ownership mark, as its own record shows it.

    `address`: canonical text (a prefix pool's child by its first address). `claim`: the recorded claim as
    `namespace/name` ("": none). `claim_uid`: the recorded uid; "" marks a holding not held for a claim (never a
    leak, left alone). `handle`: the record in the backend, shown in logs and Events (never a credential).
    `created_at`: seconds since the epoch, when known. `releasable` is False when the record does not prove this
    management cluster made it: then it is only reported, never released, with `why_kept` saying why.
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


class Made(StrEnum):
    """Which management cluster made a backend record, by the identity stamped on it (`made_by`)."""

    OURS = "ours"  # stamped with this cluster's identity, or this controller knows none: releasable
    UNSTAMPED = "unstamped"  # no identity recorded: listed and reported, never released
    OTHER = "other"  # another management cluster's: never listed


def made_by(stamped: str, identity: str) -> Made:
    """The verdict on a record stamped `stamped` ("": none) for a controller of `identity` ("": unknown)."""
    if not identity or stamped == identity:
        return Made.OURS
    return Made.UNSTAMPED if not stamped else Made.OTHER


class RestoreOutcome(StrEnum):
    """What `restore` found and did."""

    HELD = "Held"  # the backend already holds the address for the claim: nothing was done
    RECORDED = "Recorded"  # the address was free: it is now recorded again for the claim
    TAKEN = "Taken"  # something else holds the address: a duplicate, reported and never handed out again
    OUTSIDE = "Outside"  # the address is not an address of the pool: nothing was recorded


@dataclass(frozen=True)
class Restore:
    """The answer of `restore`; `detail` says, for people, who holds the address (TAKEN) or why it is outside the
    pool (OUTSIDE); never a credential."""

    outcome: RestoreOutcome
    detail: str = ""


class Pacer(Protocol):
    """Bounds a pass's request rate: `await pacer.wait()` before each request of a listing."""

    async def wait(self) -> None: ...


class Repairable(Protocol):
    """The repair capability (see the module's contract)."""

    async def list_holdings(self, pool_ref: PoolRef, pool: Object, pacer: Pacer) -> Sequence[Holding]:
        """Every allocation the pool holds under this controller's mark, page by page."""
        ...

    async def release_holding(self, pool_ref: PoolRef, pool: Object, holding: Holding) -> bool:
        """Release exactly this holding if it is still as listed (same record, claim uid and mark): True when
        released, False when it had changed or was gone."""
        ...

    async def restore(self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, allocation: Allocation) -> Restore:
        """Make the backend hold `allocation.address` (named by the claim's live IPAddress) for `claim`. Never takes
        the address from another holder, never records it twice, never frees anything."""
        ...

    async def outside_pool(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> Mapping[str, str]:
        """Of `addresses` (the pool's live IPAddresses'), those that are not addresses of the pool as it is now,
        each with why; {} when the backend cannot tell now."""
        ...


PoolsLister = Callable[[Sequence[tuple[PoolRef, Object]], Pacer], Awaitable[Mapping[PoolRef, Sequence[Holding]]]]
"""`async list_pools_holdings(pools, pacer)`: `list_holdings` of each of `pools` ((reference, object) pairs) from one
paged listing, so that a pass costs requests by holdings, not by pools. A pool missing from the answer holds
nothing."""


OrphanSweeper = Callable[[float], Awaitable[int]]
"""`async sweep_orphaned(grace_seconds) -> int`: releases the holdings of gone pools, older than `grace_seconds`, that
no live IPAddress names, and answers how many. Called once per pass when releasing is on (a costly sweep may run
less often, answering 0)."""
