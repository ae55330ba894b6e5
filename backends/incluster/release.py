"""Releasing a claim's reservations of an in-cluster pool.

Contract (`release_reservation`, for each reservation of the pool held by the claim in `release_claim`, and for a
leak the repair loop releases, see `repair`):
- Its address pre-allocated to the claim (the spec still names it): the reservation goes back to its pin (claim
  uid ""), so the address stays free for that claim only (see `pins`).
- Else, when the pool keeps release records (a reuse grace period, or LeastRecentlyReleased, see `released`): it is
  marked released. The record carries the pool's grace period for the other pools of a uniqueness domain (see
  `domains`), except under LeastRecentlyReleased, whose records carry none: no other pool ever deletes them.
- Else it is deleted.
Every write is guarded by the reservation's resourceVersion (and, for a delete, its uid). The pool's index, if this
process has one, learns each change after its write.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.incluster.indexes import PoolIndexes
from backends.incluster.policy import AllocationStrategy
from backends.incluster.pool_spec import release_terms
from backends.incluster.preallocations import PreAllocations
from backends.incluster.released import keeps_release_records
from backends.incluster.reservations import Reservation, ReservationClient
from ipam_provider.backend.contract import PoolRef
from ipam_provider.common import Object
from ipam_provider.runtime.kube.resources import now_rfc3339


@dataclass(frozen=True)
class ReleaseTerms:
    """What a release does with a reservation of the pool, from the pool's spec (see the module's contract)."""

    keep_record: bool
    recorded_grace: int | None
    pre: PreAllocations | None

    @classmethod
    def of(cls, ref: PoolRef, pool: Object | None) -> ReleaseTerms:
        """The terms of the pool `ref` (`pool`: its object, None when it is gone)."""
        grace, strategy, pre = release_terms(ref, pool)
        recorded_grace = None if strategy is AllocationStrategy.LEAST_RECENTLY_RELEASED else grace
        return cls(keeps_release_records(strategy, grace), recorded_grace, pre)


async def release_reservation(
    reservations: ReservationClient, indexes: PoolIndexes, ref: PoolRef, terms: ReleaseTerms, reservation: Reservation
) -> bool:
    """Release one reservation of the pool `ref` by `terms`. True when this call released it; False when a delete
    found it gone or changed (see `ReservationClient.delete`). A patch (back to its pin, or marked released) of a
    reservation that changed or went since it was read raises ApiError (conflict, not found)."""
    changed: Reservation | None = None
    deleted = False
    if terms.pre is not None and terms.pre.pins(reservation):
        changed = await reservations.reassign(reservation, "")
    elif terms.keep_record:
        changed = await reservations.mark_released(reservation, now_rfc3339(), terms.recorded_grace)
    else:
        deleted = await reservations.delete(reservation)
    index = indexes.get(ref)  # as it is after the write
    if index is not None and (deleted or changed is not None):  # one that changed meanwhile: its watch tells
        index.drop(reservation)
        if changed is not None:
            index.hold(changed)
    return changed is not None or deleted


async def release_claim(
    reservations: ReservationClient, indexes: PoolIndexes, ref: PoolRef, pool: Object | None, claim_uid: str
) -> None:
    """Release the claim's reservations of the pool `ref` (`pool`: its object, None when it is gone)."""
    terms = ReleaseTerms.of(ref, pool)
    for reservation in await reservations.list_claim(ref, claim_uid):
        await release_reservation(reservations, indexes, ref, terms, reservation)
