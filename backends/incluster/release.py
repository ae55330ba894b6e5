"""Releasing a claim's reservations of an in-cluster pool.

Contract (`release_claim`), for each reservation of the pool held by the claim:
- Its address pre-allocated to the claim (the spec still names it): the reservation goes back to its pin (claim
  uid ""), so the address stays free for that claim only (see `pins`).
- Else, when the pool keeps release records (a reuse grace period, or LeastRecentlyReleased, see `released`): it is
  marked released. The record carries the pool's grace period for the other pools of a uniqueness domain (see
  `domains`), except under LeastRecentlyReleased, whose records carry none: no other pool ever deletes them.
- Else it is deleted.
The pool's index, if this process has one, learns each change after its write.
"""

from __future__ import annotations

from backends.incluster.indexes import PoolIndexes
from backends.incluster.policy import AllocationStrategy
from backends.incluster.pool_spec import release_terms
from backends.incluster.released import keeps_release_records
from backends.incluster.reservations import Reservation, ReservationClient
from ipam_provider.api.meta import now_rfc3339
from ipam_provider.backend.contract import PoolRef
from ipam_provider.common import Object


async def release_claim(
    reservations: ReservationClient, indexes: PoolIndexes, ref: PoolRef, pool: Object | None, claim_uid: str
) -> None:
    """Release the claim's reservations of the pool `ref` (`pool`: its object, None when it is gone)."""
    grace, strategy, pre = release_terms(ref, pool)
    keep_record = keeps_release_records(strategy, grace)
    recorded_grace = None if strategy is AllocationStrategy.LEAST_RECENTLY_RELEASED else grace
    for reservation in await reservations.list_claim(ref, claim_uid):
        changed: Reservation | None = None
        if pre is not None and pre.pins(reservation):
            changed = await reservations.reassign(reservation, "")
        elif keep_record:
            changed = await reservations.mark_released(reservation, now_rfc3339(), recorded_grace)
        else:
            await reservations.delete(reservation)
        index = indexes.get(ref)  # as it is after the write
        if index is not None:
            index.drop(reservation)
            if changed is not None:
                index.hold(changed)
