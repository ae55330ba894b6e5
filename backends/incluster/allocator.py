"""Allocation from an in-cluster pool (address or prefix pool): which address a claim gets, or why it cannot; the
`ledger` chooses candidates, makes every reservation and keeps the index in step.

- Dynamic: the next candidate of the index under the policy (`Ledger.reserve_any`); the reservation's
  create-uniqueness stays the arbiter.
- Requested (annotation) or pre-allocated: an address the pool does not hand out, pre-allocated to another claim,
  or contradicting the claim's pre-allocation is refused (AllocationFailed, `requested_address_outside`). Else it is
  taken by value (the policy does not apply), an own release record past its grace period taken over; held by
  another claim (a record in its grace period too): AllocationFailed, `requested_address_held`. An own reservation
  under the claim's namespace/name with another uid is taken over; an address another allocation of this process
  is trying is waited for.
- Adopted (the claim has an IPAddress): the claim ends up holding exactly its address with an own reservation and
  no other of the pool, else AllocationFailed naming the holder. An own live reservation under the claim's
  namespace/name, or an own release record, is taken over; another pool's of the domain never is.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from backends.incluster.index import PoolIndex
from backends.incluster.intervals import address_value, int_to_address
from backends.incluster.ledger import Ledger
from backends.incluster.naming import pool_hash
from backends.incluster.reservations import Reservation, ReservationClient, age_seconds
from backends.incluster.spec import ParsedPool, PreAllocations
from ipam_provider.api.capi import names_pool
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    ClaimContext,
    PoolRef,
    requested_address_held,
    requested_address_outside,
)
from ipam_provider.common import Object, normalized_address

log = structlog.get_logger(__name__)

ATTEMPTS = 5  # an address freed and taken again this many times in one call: try again later


def allocation_of(reservation: Reservation) -> Allocation:
    return Allocation(reservation.address, reservation.prefix, reservation.gateway)


class Allocator:
    """Decides which address a claim gets and why it cannot; the `ledger` makes and learns every reservation."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def allocate(self, pool: ParsedPool, claim: ClaimContext, existing: Allocation | None) -> Allocation:
        """The claim's address: adopted, else the one it holds, else the one it must get, else a dynamic one."""
        index = await self.ledger.index(pool)
        if existing is not None:
            return await self._hold_existing(pool, index, claim, existing)
        held = self.ledger.held(index, claim.uid)
        if held is not None:
            return allocation_of(held)
        wanted = pool.pre.wanted(claim)
        if wanted is not None:
            return await self._specific(pool, index, claim, wanted)
        return allocation_of(await self.ledger.reserve_any(pool, index, claim))

    async def _specific(self, pool: ParsedPool, index: PoolIndex, claim: ClaimContext, address: str) -> Allocation:
        """Reserve `address` (canonical) for the claim (see the module)."""
        why = pool.why_not(address)
        if why is not None:
            raise AllocationFailedError(requested_address_outside(address, pool.ref, why))
        value = address_value(address, pool.pre.family)
        others = pool.pre.pinned_for_others(value, claim) if value is not None else ()
        if others:
            why = f"it is pre-allocated to claim {', '.join(others)} by spec.preAllocations"
            raise AllocationFailedError(requested_address_outside(address, pool.ref, why))
        own = pool_hash(pool.ref)
        for _ in range(ATTEMPTS):
            held = await self.ledger.reserve_requested(pool, index, claim, address)
            if held is None:
                continue  # free again, or the index knew of a reservation that is gone now
            if held.claim_uid == claim.uid and held.pool_label == own:
                return allocation_of(held)
            if held.pool_label == own and held.claim == str(claim):
                taken = await self.ledger.reassign(pool.ref, index, held, claim.uid)
                if taken is None:
                    continue
                log.info("reservation taken over", pool=str(pool.ref), address=taken.address, claim=str(claim))
                return allocation_of(taken)
            raise AllocationFailedError(_held_message(pool, address, claim, held), retry_after=_grace_left(pool, held))
        raise AllocationFailedError(
            f"requested address {address} of {pool.ref} changed hands repeatedly while being reserved; retrying",
            retry_after=1.0,
        )

    async def _hold_existing(
        self, pool: ParsedPool, index: PoolIndex, claim: ClaimContext, existing: Allocation
    ) -> Allocation:
        """Make the claim hold exactly the address its IPAddress names (see the module)."""
        try:
            holder = await self.ledger.hold_existing(pool.ref, index, claim, existing)
        except ValueError as error:
            raise AllocationFailedError(
                f"IPAddress {claim} names {existing.address!r}, which is not an address of {pool.ref}'s family"
            ) from error
        if holder is None or holder.claim_uid != claim.uid or holder.pool_label != pool_hash(pool.ref):
            raise AllocationFailedError(_adopted_held_message(pool, claim, existing.address, holder))
        return existing


def holder_seen_from(reservation: Reservation, seen_from: str) -> str:
    """Who holds the reservation, for a message on a claim of namespace `seen_from`: its claim and, when known, its
    pool; a claim or pool of another namespace (a Global pool's, a shared uniqueness domain's) is not named."""
    pool = reservation.pool
    if reservation.claim.partition("/")[0] != seen_from or (
        pool is not None and pool.namespace not in (None, seen_from)
    ):
        return "a claim of another namespace"
    return f"claim {reservation.claim} of {pool}" if pool is not None else f"claim {reservation.claim}"


def _held_message(pool: ParsedPool, address: str, claim: ClaimContext, held: Reservation) -> str:
    visible = held.claim.partition("/")[0] == claim.namespace  # a Global pool's claims are of any namespace
    if held.pool_label != pool_hash(pool.ref):
        holder = holder_seen_from(held, claim.namespace)
    elif held.released_at:
        holder = f"claim {held.claim} (released; kept until the pool's addressReuseGracePeriodSeconds pass)"
    else:
        holder = f"claim {held.claim}" if visible else "a claim of another namespace"
    if claim.requested_address is None:  # the address comes from spec.preAllocations alone
        return (
            f"pre-allocated address {address} is already held by {holder} in {pool.ref}; delete that claim or "
            "change spec.preAllocations"
        )
    return requested_address_held(address, pool.ref, holder)


def _grace_left(pool: ParsedPool, held: Reservation) -> float | None:
    """For a release record: seconds until its reuse grace period is over (the claim is retried then)."""
    grace = pool.reuse_grace_seconds if held.pool_label == pool_hash(pool.ref) else held.grace_seconds
    if not held.released_at or not grace:
        return None
    return max(1.0, grace - age_seconds(held.released_at) + 1.0)


def _adopted_held_message(pool: ParsedPool, claim: ClaimContext, address: str, holder: Reservation | None) -> str:
    if holder is None:
        owner = f"another claim in {pool.ref}"
    elif holder.pool_label != pool_hash(pool.ref):
        owner = holder_seen_from(holder, claim.namespace) + " (of the same uniqueness domain)"
    elif holder.claim.partition("/")[0] == claim.namespace:
        owner = f"claim {holder.claim} in {pool.ref}"
    else:
        owner = f"a claim of another namespace in {pool.ref}"
    return f"address {address} of IPAddress {claim} is already held by {owner}; delete one of the two IPAddresses"


async def collisions(
    pre: PreAllocations,
    addresses: Sequence[Allocation],
    cached: Sequence[Object] | None,
    reservations: ReservationClient,
) -> tuple[list[str], int]:
    """The pre-allocated addresses already held by a claim they are not pre-allocated to (as problems), and how
    many pinned addresses no IPAddress names yet. Holders come from the pool's cached IPAddresses, else (the cache
    cannot answer for the pool) from one list of the pool's reservations."""
    used = {normalized_address(allocation.address) for allocation in addresses}
    taken = {value: int_to_address(value, pre.family) for value in pre.pinned}
    taken = {value: text for value, text in taken.items() if text in used}
    problems: list[str] = []
    if taken:
        if cached is not None:
            holders = _holders(pre.ref, cached)
        else:  # the claim of each live reservation of the pool
            listed = await reservations.list_pool(pre.ref)
            holders = {normalized_address(r.address): r.claim for r in listed if not r.released_at}
        for value, text in sorted(taken.items()):
            holder = holders.get(text)
            if holder is not None and not pre.held_by_named(value, holder):
                keys = ", ".join(pre.pinned[value])
                problems.append(f"spec.preAllocations[{keys}]: {text} is already held by claim {holder}")
    return problems, len(pre.pinned) - len(taken)


def _holders(ref: PoolRef, cached: Sequence[Object]) -> dict[str, str]:
    """Address → namespace/name of the claim of each cached IPAddress naming the pool."""
    holders: dict[str, str] = {}
    for address in cached:
        if names_pool(address, ref):
            spec, meta = address.get("spec") or {}, address["metadata"]
            claim_name = (spec.get("claimRef") or {}).get("name") or meta["name"]
            holders[normalized_address(str(spec.get("address", "")))] = f"{meta.get('namespace', '')}/{claim_name}"
    return holders
