"""A claim that already has an IPAddress holds exactly the address it names (adoption after a migration, a move or
a restore, or the end of a race lost by some process).

Contract of `hold_existing`:
- The claim ends up holding the address with a reservation of its own pool, and with no other reservation of that
  pool; or it gets AllocationFailed naming who holds the address (claim and pool).
- A live reservation of the *same pool* held under the claim's namespace/name with another uid (made from the
  IPAddress before the claim existed, or with a uid that predates a restore) is taken over. A reservation of
  another pool of the uniqueness domain is never taken over, whoever it names: its pool's release and the repair
  loop would no longer find it, and the address could be handed out twice.
"""

from __future__ import annotations

from backends.incluster.pool_index import PoolIndex
from backends.incluster.released import take_over
from backends.incluster.reservations import Reservation, ReservationClient, pool_hash
from ipam_provider.backend.contract import Allocation, AllocationFailedError, ClaimContext, PoolRef


async def hold_existing(
    reservations: ReservationClient, ref: PoolRef, index: PoolIndex, claim: ClaimContext, existing: Allocation
) -> Allocation:
    """Make the claim hold exactly the address its IPAddress names (see the module's contract)."""
    try:
        value = index.value_of(existing.address)
    except ValueError as error:
        raise AllocationFailedError(
            f"IPAddress {claim} names {existing.address!r}, which is not an address of {ref}'s family"
        ) from error
    own = pool_hash(ref)
    holder = index.by_address.get(value)
    mine = holder is not None and holder.pool_label == own and holder.claim_uid == claim.uid
    if mine and claim.uid not in index.doubly_held:
        return existing  # the steady state: nothing to ask the API server
    if not mine:
        reservation = await reservations.create(
            ref, existing.address, existing.prefix, existing.gateway, claim.namespace, claim.name, claim.uid
        )
        if reservation is None:
            reservation = await reservations.get(ref, existing.address)
        if reservation is not None and _taken_over(reservation, claim, own):
            index.drop(reservation)
            reservation = await reservations.reassign(reservation, claim.uid)
        elif reservation is not None and _released_record(reservation, claim, own):
            reservation = await _take_record(reservations, index, reservation, claim, existing)
        if reservation is None or reservation.claim_uid != claim.uid or reservation.pool_label != own:
            if reservation is not None:
                index.hold(reservation)
            raise AllocationFailedError(_held_message(ref, claim, existing.address, reservation))
        index.hold(reservation)
    for other in await reservations.list_claim(ref, claim.uid):
        if other.address != existing.address:  # a reservation lost to a concurrent allocation
            await reservations.delete(other)
            index.drop(other)
    index.doubly_held.discard(claim.uid)
    held = index.by_address.get(value)
    if held is not None and index.owns(held):
        index.by_claim[claim.uid] = held
    return existing


def _taken_over(reservation: Reservation, claim: ClaimContext, own_label: str) -> bool:
    """Whether the claim may take the reservation over: one of its own pool, held (not released) under the claim's
    namespace/name but another uid."""
    return (
        reservation.pool_label == own_label
        and reservation.claim_uid != claim.uid
        and not reservation.released_at
        and reservation.claim == f"{claim.namespace}/{claim.name}"
    )


def _released_record(reservation: Reservation, claim: ClaimContext, own_label: str) -> bool:
    """Whether the reservation is one of the pool's released ones (a release record, or a release in its grace
    period): the claim's IPAddress shows the address in use (as after a restore), so the claim takes it."""
    return reservation.pool_label == own_label and reservation.claim_uid != claim.uid and bool(reservation.released_at)


async def _take_record(
    reservations: ReservationClient, index: PoolIndex, record: Reservation, claim: ClaimContext, existing: Allocation
) -> Reservation:
    """Give the released `record` to the claim, guarded by its resourceVersion; AllocationFailedError (retried
    soon) when it changed meanwhile or had another prefix or gateway (then deleted, to be reserved anew)."""
    index.drop(record)
    taken = await take_over(
        reservations, record, existing.prefix, existing.gateway, claim.namespace, claim.name, claim.uid
    )
    if taken is None:
        raise AllocationFailedError(
            f"the released reservation of {existing.address} changed while IPAddress {claim} took it; retrying",
            retry_after=1.0,
        )
    return taken


def _held_message(ref: PoolRef, claim: ClaimContext, address: str, holder: Reservation | None) -> str:
    if holder is None:
        owner = f"another claim in {ref}"
    elif holder.pool_label != pool_hash(ref):
        owner = holder.holder() + " (of the same uniqueness domain)"
    else:
        owner = f"claim {holder.claim} in {ref}"
    return f"address {address} of IPAddress {claim} is already held by {owner}; delete one of the two IPAddresses"
