"""Allocation from an in-cluster pool (address or prefix pool); every write goes through the `ledger`.

- Dynamic: the index chooses a candidate and marks it pending in one step, so concurrent allocations never try one
  address; the reservation's create-uniqueness stays the arbiter: a lost address is learned and the next candidate
  taken. An own release record chosen is taken over. A pool that looks exhausted is rebuilt once before
  PoolExhausted.
- Requested (annotation) or pre-allocated: an address the pool does not hand out, pre-allocated to another claim,
  or contradicting the claim's pre-allocation is refused (AllocationFailed, `requested_address_outside`). Else it is
  taken by value (the policy does not apply), an own release record past its grace period taken over; held by
  another claim (a record in its grace period too): AllocationFailed, `requested_address_held`. An own reservation
  under the claim's namespace/name with another uid is taken over; an address another allocation of this process
  is trying is waited for.
- Adopted (the claim has an IPAddress): the claim ends up holding exactly its address with an own reservation and
  no other of the pool, else AllocationFailed naming the holder. An own live reservation under the claim's
  namespace/name, or an own release record, is taken over; another pool's of the domain never is.
- Pins (`pin`, at each report): each address pre-allocated to one well-formed key that no IPAddress names nor known
  reservation holds gets a reservation for the named claim with uid "", so a process with a stale spec cannot hand
  it out; an own uid-"" live reservation no longer pinned to its claim and named by no IPAddress is deleted.
  Nothing is done for a caller that read an older spec than the index's.
"""

from __future__ import annotations

import asyncio
import time
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
    PoolExhaustedError,
    PoolRef,
    requested_address_held,
    requested_address_outside,
)
from ipam_provider.common import Object, cap_int64, normalized_address

log = structlog.get_logger(__name__)

PENDING_WAIT = 10.0  # how long to wait for another allocation's create of the same address to answer
PENDING_POLL = 0.05
ATTEMPTS = 5  # an address freed and taken again this many times in one call: try again later


def allocation_of(reservation: Reservation) -> Allocation:
    return Allocation(reservation.address, reservation.prefix, reservation.gateway)


class Allocator:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def allocate(self, pool: ParsedPool, claim: ClaimContext, existing: Allocation | None) -> Allocation:
        """The claim's address: adopted, else the one it holds, else the one it must get, else a dynamic one."""
        index = await self.ledger.index(pool)
        if existing is not None:
            return await self._hold_existing(pool, index, claim, existing)
        held = index.by_claim.get(claim.uid)
        if held is not None:
            return allocation_of(held)
        wanted = pool.pre.wanted(claim)
        if wanted is not None:
            return await self._specific(pool, index, claim, wanted)
        return await self._dynamic(pool, index, claim)

    async def _dynamic(self, pool: ParsedPool, index: PoolIndex, claim: ClaimContext) -> Allocation:
        refreshed = False
        while True:
            index = self.ledger.current(pool.ref, index)  # never one built from an older spec
            candidate = index.take_candidate(claim.uid)
            if candidate is None:
                if refreshed:
                    raise PoolExhaustedError(pool.exhausted(cap_int64(index.allocator.total)))
                index, refreshed = await self.ledger.refresh(pool.ref, index), True
                held = index.by_claim.get(claim.uid)
                if held is not None:
                    return allocation_of(held)
                continue
            address = index.address_of(candidate)
            learned = await self.ledger.reserve(pool.ref, index, Allocation(address, pool.prefix, pool.gateway), claim)
            if learned is not None and learned.claim_uid == claim.uid:
                return allocation_of(learned)
            if learned is not None:
                log.info("address already reserved elsewhere", pool=str(pool.ref), address=address)

    async def _specific(self, pool: ParsedPool, index: PoolIndex, claim: ClaimContext, address: str) -> Allocation:
        """Reserve `address` (canonical) for the claim (see the module)."""
        why = pool.why_not(address)
        if why is not None:
            raise AllocationFailedError(requested_address_outside(address, pool.ref, why))
        others = pool.pre.pinned_for_others(index.value_of(address), claim)
        if others:
            why = f"it is pre-allocated to claim {', '.join(others)} by spec.preAllocations"
            raise AllocationFailedError(requested_address_outside(address, pool.ref, why))
        own = pool_hash(pool.ref)
        for _ in range(ATTEMPTS):
            held = await self._holder(pool, index, claim, address)
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

    async def _holder(
        self, pool: ParsedPool, index: PoolIndex, claim: ClaimContext, address: str
    ) -> Reservation | None:
        """After one attempt to reserve `address` for the claim: its reservation, or None (look again)."""
        index = self.ledger.current(pool.ref, index)
        value = index.value_of(address)
        if index.take_specific(value, claim.uid):
            held = await self.ledger.reserve(pool.ref, index, Allocation(address, pool.prefix, pool.gateway), claim)
            if held is not None and held.claim_uid != claim.uid:
                log.info("requested address already reserved", pool=str(pool.ref), address=address, holder=held.claim)
            return held
        if value not in index.allocatable.addresses:  # the pool's spec changed meanwhile
            raise AllocationFailedError(requested_address_outside(address, pool.ref))
        if value not in index.pending:
            return await self.ledger.read(pool.ref, index, address)
        deadline = time.monotonic() + PENDING_WAIT
        while value in self.ledger.current(pool.ref, index).pending:
            if time.monotonic() > deadline:
                raise AllocationFailedError(
                    f"requested address {address} of {pool.ref} is being reserved for another claim; retrying",
                    retry_after=1.0,
                )
            await asyncio.sleep(PENDING_POLL)
        return None

    async def _hold_existing(
        self, pool: ParsedPool, index: PoolIndex, claim: ClaimContext, existing: Allocation
    ) -> Allocation:
        """Make the claim hold exactly the address its IPAddress names (see the module)."""
        try:
            value = index.value_of(existing.address)
        except ValueError as error:
            raise AllocationFailedError(
                f"IPAddress {claim} names {existing.address!r}, which is not an address of {pool.ref}'s family"
            ) from error
        holder = index.by_address.get(value)
        mine = holder is not None and holder.pool_label == pool_hash(pool.ref) and holder.claim_uid == claim.uid
        if mine and claim.uid not in index.doubly_held:
            return existing  # the steady state: nothing to ask the API server
        if not mine:
            await self._hold_address(pool, index, claim, existing)
        for other in await self.ledger.reservations.list_claim(pool.ref, claim.uid):
            if other.address != existing.address:  # a reservation lost to a concurrent allocation
                await self.ledger.delete(pool.ref, index, other)
        self.ledger.current(pool.ref, index).held_alone(claim.uid, value)
        return existing

    async def _hold_address(
        self, pool: ParsedPool, index: PoolIndex, claim: ClaimContext, existing: Allocation
    ) -> None:
        """Make or take the reservation of the IPAddress's address for the claim; AllocationFailedError when another
        claim holds it, or (retried soon) when the pool's own one changed while the claim took it over."""
        ref, own = pool.ref, pool_hash(pool.ref)
        reservation = await self.ledger.reservations.create(ref, existing, claim)
        reservation = reservation or await self.ledger.reservations.get(ref, existing.address)
        takes_over = reservation is not None and reservation.pool_label == own and reservation.claim_uid != claim.uid
        if reservation is not None and takes_over and (reservation.released_at or reservation.claim == str(claim)):
            if await self.ledger.give(ref, index, reservation, claim, existing) is None:
                raise AllocationFailedError(
                    f"the reservation of {existing.address} changed while IPAddress {claim} took it; retrying",
                    retry_after=1.0,
                )
            return
        if reservation is not None:
            self.ledger.learn(ref, reservation, index=index)
        if reservation is None or reservation.claim_uid != claim.uid or reservation.pool_label != own:
            raise AllocationFailedError(_adopted_held_message(pool, claim, existing.address, reservation))

    async def pin(self, pool: ParsedPool, addresses: Sequence[Allocation]) -> None:
        """Create the missing pin reservations of the pool and delete those of removed pins (see the module), for a
        reconcile that read `pool`, with the IPAddresses naming it. A pool without pins whose index (for that
        object) is not built has no pin reservations this process knows of: nothing to do."""
        index = self.ledger.get(pool.ref)
        if pool.pre.pinned:
            index = await self.ledger.index(pool)
        elif index is None or index.pool_uid != pool.uid:
            return
        if index.generation > pool.generation:
            return  # this reconcile read an older spec than the index's: the newer one decides
        backed = {normalized_address(allocation.address) for allocation in addresses}
        for value in sorted(pool.pre.pinned):
            named = pool.pre.named_claim(value)
            text = int_to_address(value, pool.pre.family)
            if named is None or text in backed:
                continue
            index = self.ledger.current(pool.ref, index)
            if not index.take_specific(value, ""):
                continue  # held (by the pin, its claim or another one: `collisions` tells) or being reserved now
            claim = ClaimContext(*named, uid="")
            learned = await self.ledger.reserve(pool.ref, index, Allocation(text, pool.prefix, pool.gateway), claim)
            if learned is not None and learned.claim == str(claim) and not (learned.claim_uid or learned.released_at):
                log.info("pre-allocated address pinned", pool=str(pool.ref), address=text, claim=str(claim))
        await self._unpin_removed(pool, index, backed)

    async def _unpin_removed(self, pool: ParsedPool, index: PoolIndex, backed: set[str]) -> None:
        current = self.ledger.current(pool.ref, index)
        for reservation in list(current.by_address.values()):
            if reservation.claim_uid or reservation.released_at or normalized_address(reservation.address) in backed:
                continue
            value = address_value(reservation.address, pool.pre.family)
            if not current.owns(reservation) or value is None:
                continue  # another pool's of the uniqueness domain: its pins are its own
            if pool.pre.held_by_named(value, reservation.claim):
                continue
            if await self.ledger.reservations.still_named(reservation, pool.ref):
                continue
            await self.ledger.delete(pool.ref, index, reservation)
            log.info("pin removed", pool=str(pool.ref), address=reservation.address, claim=reservation.claim)


def _held_message(pool: ParsedPool, address: str, claim: ClaimContext, held: Reservation) -> str:
    visible = held.claim.partition("/")[0] == claim.namespace  # a Global pool's claims are of any namespace
    if held.pool_label != pool_hash(pool.ref):
        holder = held.holder(claim.namespace)
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
        owner = holder.holder(claim.namespace) + " (of the same uniqueness domain)"
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
