"""The ledger of the in-cluster pools: their reservations in the API server (`reservations`) and this process's
index of each pool (`index`), kept in step: a write and the index update it implies are one method of `Ledger`.

- An index is built from a fresh list of the pool's reservations (a domain pool's: the domain's) on first use (or
  by `prepare`), on each resync, and when the pool looks exhausted; one build per pool at a time; pending
  candidates move to it. It belongs to one pool object (uid), is never replaced by one of an older spec
  (generation), and keeps its holdings over a new allocatable set or policy.
- Before it serves, the *scan* gives each IPAddress naming the pool (a domain pool: any of the domain) without a
  reservation one, for its claim (`_claim_of`); an address reserved meanwhile is learned.
- A reservation made for a domain pool is held at once in the indexes of the domain's pools.
- Pins (`pin`, at each report): each address pre-allocated to one well-formed key that no IPAddress names nor known
  reservation holds gets a reservation for the named claim with uid "", so a process with a stale spec cannot hand
  it out; an own uid-"" live reservation no longer pinned to its claim and named by no IPAddress is deleted.
  Nothing is done for a caller that read an older spec than the index's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import structlog

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.index import PoolIndex
from backends.incluster.intervals import address_value, int_to_address
from backends.incluster.naming import pool_hash
from backends.incluster.policy import AllocationPolicy
from backends.incluster.reservations import Reservation, ReservationClient, unless_changed
from backends.incluster.spec import ParsedPool, PreAllocations, ReleaseTerms
from ipam_provider.api.capi import ADDRESSES, CLAIMS, names_pool
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    ClaimContext,
    PoolExhaustedError,
    PoolRef,
    requested_address_outside,
)
from ipam_provider.common import Object, cap_int64, normalized_address
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import now_rfc3339

log = structlog.get_logger(__name__)
RESYNC_SECONDS = 600.0
PENDING_WAIT = 10.0  # how long to wait for another allocation's create of the same address to answer
PENDING_POLL = 0.05
Parsed = TypeVar("Parsed", bound=ParsedPool)


# What a pool's index is built over: the allocatable set and policy of the pool object (uid) at a generation.
IndexBasis = tuple[AllocatableSet, AllocationPolicy, int, str]


class Ledger:
    def __init__(
        self,
        kube: KubeClient,
        cached_addresses: Callable[[PoolRef], Sequence[Object] | None],
        domain_pools: Callable[[str], Awaitable[Sequence[PoolRef]]],
    ) -> None:
        self.reservations = ReservationClient(kube)
        self.cached_addresses = cached_addresses
        self.domain_pools = domain_pools  # the pools naming a uniqueness domain (see `domains.domain_pools`)
        self._indexes: dict[PoolRef, PoolIndex] = {}
        self._building: dict[PoolRef, asyncio.Lock] = {}  # one index build (or scan) per pool at a time
        self._reclaiming: set[PoolRef] = set()  # pools whose expired releases are being deleted now
        self.reservations.on_domain_create = self._share

    def _share(self, ref: PoolRef, domain: str, reservation: Reservation) -> None:
        """Hold a reservation made for a pool of `domain` in the indexes of the domain's other pools."""
        for other, index in list(self._indexes.items()):
            if other != ref and self.reservations.domain_of(other) == domain:
                index.hold(reservation)

    def noted(self, pool: Parsed) -> Parsed:
        """`pool`, its uniqueness domain noted: a pool's reservations are named by it (see `reservation_name`)."""
        self.reservations.note_domain(pool.ref, pool.domain)
        return pool

    def get(self, ref: PoolRef) -> PoolIndex | None:
        return self._indexes.get(ref)

    def clear(self) -> None:
        self._indexes.clear()

    def forget(self, ref: PoolRef) -> None:
        """The pool is gone (its watch showed it deleted): drop its index, its noted domain, and its build lock
        unless a build holds it now (the backend forgets the pool again when that build's operation ends)."""
        self._indexes.pop(ref, None)
        self.reservations.forget(ref)
        lock = self._building.get(ref)
        if lock is not None and not lock.locked():
            del self._building[ref]

    def current(self, ref: PoolRef, index: PoolIndex) -> PoolIndex:
        """The pool's index now, if built for the same pool object from the same or a newer spec than `index`;
        else `index`."""
        current = self._indexes.get(ref)
        if current is None or current.pool_uid != index.pool_uid or current.generation < index.generation:
            return index
        return current

    async def index(self, pool: ParsedPool) -> PoolIndex:
        """The pool's index for a caller that read `pool`. A caller that read an older spec than the index's gets
        the index as it is. Release records whose reuse grace period is over are deleted first (all when the pool
        has no grace period), except under LeastRecentlyReleased."""
        ref, allocatable, index = pool.ref, pool.allocatable, self._indexes.get(pool.ref)
        if index is not None and index.pool_uid == pool.uid and pool.generation < index.generation:
            return index
        if (
            index is None
            or index.pool_uid != pool.uid
            or (index.allocatable.family, index.allocatable.host_bits) != (allocatable.family, allocatable.host_bits)
            or time.monotonic() - index.built_at > RESYNC_SECONDS
        ):
            index = await self._rebuild(ref, (allocatable, pool.policy, pool.generation, pool.uid), index, scan=True)
        elif index.allocator.allocatable != allocatable.addresses or index.policy != pool.policy:
            scanned = index.scanned
            if index.allocator.allocatable == allocatable.addresses:
                index.set_policy(pool.policy)
            else:
                index = self._indexes[ref] = index.with_allocatable(allocatable, pool.policy)
            index.generation, index.scanned = pool.generation, scanned
        index.reuse_grace_seconds = pool.reuse_grace_seconds or 0
        if not index.scanned:
            await self._scan_into(ref, index)
        if index.released:
            await self._reclaim_expired(ref, index, pool.reuse_grace_seconds or 0)
        return self.current(ref, index)

    async def prepare(self, pool: ParsedPool) -> None:
        """Build the pool's index from its reservations only (no scan), unless it has one."""
        known = self._indexes.get(pool.ref)
        if known is None or known.pool_uid != pool.uid:
            basis = (pool.allocatable, pool.policy, pool.generation, pool.uid)
            await self._rebuild(pool.ref, basis, known, scan=False)

    async def refresh(self, ref: PoolRef, index: PoolIndex) -> PoolIndex:
        """The pool's index rebuilt like `index`, which looks exhausted (others may have released addresses)."""
        basis = (index.allocatable, index.policy, index.generation, index.pool_uid)
        return await self._rebuild(ref, basis, index, scan=False)

    async def _rebuild(self, ref: PoolRef, basis: IndexBasis, replacing: PoolIndex | None, scan: bool) -> PoolIndex:
        """Build the pool's index from a fresh list of its reservations, unless another allocation replaced
        `replacing` with one of the same or a newer spec meanwhile. With `scan`, the scan comes first."""
        allocatable, policy, generation, uid = basis
        async with self._building.setdefault(ref, asyncio.Lock()):
            current = self._indexes.get(ref)
            newer = current is not None and current.pool_uid == uid and current.generation >= generation
            if current is not None and current is not replacing and newer:
                return current
            reservations = await self._reservations_of(ref, allocatable.family, scan=scan)
            shape = (allocatable.family, allocatable.host_bits)
            inherits = (
                replacing is not None and (replacing.allocatable.family, replacing.allocatable.host_bits) == shape
            )
            pending = replacing.pending if replacing is not None and inherits else None
            index = PoolIndex.build(allocatable, reservations, policy, pending=pending, own_label=pool_hash(ref))
            if replacing is not None:
                index.reuse_grace_seconds, index.clock = replacing.reuse_grace_seconds, replacing.clock
            index.generation, index.pool_uid = generation, uid
            index.scanned = scan or (replacing is not None and replacing.pool_uid == uid and replacing.scanned)
            self._indexes[ref] = index
            return index

    async def _reservations_of(self, ref: PoolRef, family: int, *, scan: bool) -> list[Reservation]:
        """A fresh list of the pool's reservations (a domain pool's: the domain's), plus those the scan made."""
        started = time.monotonic()
        reservations = await self.reservations.list_index(ref)
        listed = time.monotonic()
        found = await self._scan_domain(ref, family, reservations) if scan else []
        log.info(
            "pool index built",
            pool=str(ref),
            reservations=len(reservations) + len(found),
            reserved_for_existing=len(found),
            list_seconds=round(listed - started, 3),
            scan_seconds=round(time.monotonic() - listed, 3),
        )
        return reservations + found

    async def _scan_into(self, ref: PoolRef, index: PoolIndex) -> None:
        """The scan into `index` (once, one caller at a time)."""
        async with self._building.setdefault(ref, asyncio.Lock()):
            if index.scanned:
                return
            for reservation in await self._scan_domain(ref, index.allocatable.family, list(index.by_address.values())):
                index.hold(reservation)
            index.scanned = True

    async def _scan_domain(self, ref: PoolRef, family: int, held: list[Reservation]) -> list[Reservation]:
        """The reservations made or found for the IPAddresses of the pool and, for a domain pool, of every other pool
        of the domain, beyond `held` (what the index has)."""
        refs = [ref]
        domain = self.reservations.domain_of(ref)
        if domain:
            refs += sorted({*await self.domain_pools(domain), *self.reservations.noted_pools(domain)} - {ref})
        found: list[Reservation] = []
        for pool in refs:
            if pool != ref:
                self.reservations.note_domain(pool, domain)  # its reservations are named by the domain
            found += await self._scan_pool(pool, family, held + found)
        return found

    async def _scan_pool(self, ref: PoolRef, family: int, held: list[Reservation]) -> list[Reservation]:
        """A reservation for each IPAddress naming the pool whose address (of `family`) `held` does not hold."""
        held_values = {address_value(reservation.address, family) for reservation in held}
        cached = self.cached_addresses(ref)
        kube = self.reservations.kube
        found: list[Reservation] = []
        for address in cached if cached is not None else (await kube.list(ADDRESSES, ref.namespace))[0]:
            spec = address.get("spec") or {}
            value = address_value(str(spec.get("address", "")), family)
            if not names_pool(address, ref) or value is None or value in held_values:
                continue
            text = int_to_address(value, family)
            claim = await self._claim_of(address)
            made = await self.reservations.create(
                ref, Allocation(text, int(spec.get("prefix") or 0), spec.get("gateway") or None), claim
            )
            if made is not None:
                log.info("reserved the address of an existing IPAddress", pool=str(ref), address=text, claim=claim.name)
            reservation = made or await self.reservations.get(ref, text)  # reserved meanwhile: who holds it
            if reservation is not None:
                held_values.add(value)
                found.append(reservation)
        return found

    async def _claim_of(self, address: Object) -> ClaimContext:
        """The claim an IPAddress belongs to: its controller ownerReference's uid when that is a claim, else the uid
        of the claim of its claimRef name, else "" (none of that name exists yet)."""
        spec, meta = address.get("spec") or {}, address["metadata"]
        namespace, name = meta.get("namespace", ""), (spec.get("claimRef") or {}).get("name") or meta["name"]
        for owner in meta.get("ownerReferences") or []:
            if owner.get("controller") and owner.get("kind") == CLAIMS.kind and owner.get("uid"):
                return ClaimContext(namespace, name, str(owner["uid"]))
        claim = await self.reservations.kube.get(CLAIMS, name, namespace)
        return ClaimContext(namespace, name, str(claim["metadata"].get("uid", "")) if claim is not None else "")

    async def _reclaim_expired(self, ref: PoolRef, index: PoolIndex, grace_seconds: int) -> None:
        """Delete the pool's expired release records; one caller at a time per pool, the others do not wait."""
        if ref in self._reclaiming:
            return
        self._reclaiming.add(ref)
        try:
            for reservation in index.expired_releases(grace_seconds):
                await self.delete(ref, index, reservation)
        finally:
            self._reclaiming.discard(ref)

    async def reserve(
        self, ref: PoolRef, index: PoolIndex, held: Allocation, claim: ClaimContext
    ) -> Reservation | None:
        """Reserve the address `held` names, pending in `index`, for the claim: take over its release record when
        the index has one, else create its reservation; then settle it. The reservation made, else the one found in
        its place, else None (none holds the address now)."""
        value = index.value_of(held.address)
        record = index.released.get(value)
        learned: Reservation | None = None
        try:
            if record is not None:
                made = await self.reservations.take_over(record, held, claim)
            else:
                made = await self.reservations.create(ref, held, claim)
            learned = made if made is not None else await self.reservations.get(ref, held.address)
        finally:
            current = self.current(ref, index)
            if learned is not None:
                current.hold(learned)
            elif record is not None:
                current.drop(record)
            current.settle(value)
        return learned

    async def read(self, ref: PoolRef, index: PoolIndex, address: str) -> Reservation | None:
        """The reservation of `address` as the API server has it now, learned by `index` in place of what it knew."""
        known = index.by_address.get(index.value_of(address))
        fresh = await self.reservations.get(ref, address)
        stale = known if known is not None and (fresh is None or fresh.uid != known.uid) else None
        self.learn(ref, fresh, replacing=stale, index=index)
        return fresh

    async def reassign(
        self, ref: PoolRef, index: PoolIndex | None, reservation: Reservation, claim_uid: str
    ) -> Reservation | None:
        """`ReservationClient.reassign`, learned by `index`; None when the reservation changed or went meanwhile."""
        reassigned = await unless_changed(self.reservations.reassign(reservation, claim_uid))
        if reassigned is not None:
            self.learn(ref, reassigned, replacing=reservation, index=index)
        return reassigned

    async def give(
        self, ref: PoolRef, index: PoolIndex | None, found: Reservation, claim: ClaimContext, held: Allocation
    ) -> Reservation | None:
        """Give the pool's own `found` to the claim, learned by `index`: a release record is taken over (see
        `ReservationClient.take_over`), a live reservation reassigned. None when it changed or went meanwhile, or
        was a record of another prefix or gateway than `held`'s (then deleted)."""
        if not found.released_at:
            return await self.reassign(ref, index, found, claim.uid)
        taken = await self.reservations.take_over(found, held, claim)
        self.learn(ref, taken, replacing=found, index=index)
        return taken

    async def delete(self, ref: PoolRef, index: PoolIndex | None, reservation: Reservation) -> bool:
        """`ReservationClient.delete`, learned by `index` (the pool's, when None)."""
        deleted = await self.reservations.delete(reservation)
        self.learn(ref, None, replacing=reservation, index=index)
        return deleted

    def learn(
        self,
        ref: PoolRef,
        reservation: Reservation | None,
        replacing: Reservation | None = None,
        index: PoolIndex | None = None,
    ) -> None:
        """Put a reservation read or written now (None: none) in `index` as it is now (the pool's, when None) in
        place of `replacing`, which is gone or changed."""
        current = self.current(ref, index) if index is not None else self._indexes.get(ref)
        if current is not None:
            if replacing is not None:
                current.drop(replacing)
            if reservation is not None:
                current.hold(reservation)

    async def release(self, ref: PoolRef, terms: ReleaseTerms, reservation: Reservation) -> bool:
        """Release one reservation of the pool by `terms`: back to its pin (uid "") when the spec pre-allocates the
        address to its claim; else a release record when the pool keeps them; else deleted. True when this call
        released it; False when a delete found it gone or changed. A patch of a reservation that changed or went
        since it was read raises ApiError (conflict, not found)."""
        if terms.pre is not None and terms.pre.pins(reservation.address, reservation.claim):
            changed: Reservation | None = await self.reservations.reassign(reservation, "")
        elif terms.keep_record:
            changed = await self.reservations.mark_released(reservation, now_rfc3339(), terms.recorded_grace)
        elif not await self.reservations.delete(reservation):
            return False  # changed meanwhile: its watch tells
        else:
            changed = None
        self.learn(ref, changed, replacing=reservation)
        return True

    async def release_claim(self, ref: PoolRef, terms: ReleaseTerms, claim_uid: str) -> None:
        """Release the claim's reservations of the pool."""
        for reservation in await self.reservations.list_claim(ref, claim_uid):
            await self.release(ref, terms, reservation)

    def held(self, index: PoolIndex, claim_uid: str) -> Reservation | None:
        """The pool's own reservation that `index` knows the claim to hold."""
        return index.by_claim.get(claim_uid)

    async def reserve_any(self, pool: ParsedPool, index: PoolIndex, claim: ClaimContext) -> Reservation:
        """The claim's reservation of the next candidate under the policy; a candidate another holds is learned and
        the next one taken. An index that looks exhausted is rebuilt once, then PoolExhaustedError."""
        refreshed = False
        while True:
            index = self.current(pool.ref, index)  # never one built from an older spec
            candidate = index.take_candidate(claim.uid)
            if candidate is None:
                if refreshed:
                    raise PoolExhaustedError(pool.exhausted(cap_int64(index.allocator.total)))
                index, refreshed = await self.refresh(pool.ref, index), True
                held = index.by_claim.get(claim.uid)
                if held is not None:
                    return held
                continue
            address = index.address_of(candidate)
            learned = await self.reserve(pool.ref, index, Allocation(address, pool.prefix, pool.gateway), claim)
            if learned is not None and learned.claim_uid == claim.uid:
                return learned
            if learned is not None:
                log.info("address already reserved elsewhere", pool=str(pool.ref), address=address)

    async def reserve_requested(
        self, pool: ParsedPool, index: PoolIndex, claim: ClaimContext, address: str
    ) -> Reservation | None:
        """After one attempt to reserve `address` (canonical) for the claim by value: its reservation, the claim's
        or another's, or None (look again). AllocationFailedError when the pool's spec no longer hands it out, or
        (retried soon) when another allocation of this process is still reserving it after PENDING_WAIT."""
        index = self.current(pool.ref, index)
        value = index.value_of(address)
        if index.take_specific(value, claim.uid):
            held = await self.reserve(pool.ref, index, Allocation(address, pool.prefix, pool.gateway), claim)
            if held is not None and held.claim_uid != claim.uid:
                log.info("requested address already reserved", pool=str(pool.ref), address=address, holder=held.claim)
            return held
        if value not in index.allocatable.addresses:  # the pool's spec changed meanwhile
            raise AllocationFailedError(requested_address_outside(address, pool.ref))
        if value not in index.pending:
            return await self.read(pool.ref, index, address)
        deadline = time.monotonic() + PENDING_WAIT
        while value in self.current(pool.ref, index).pending:
            if time.monotonic() > deadline:
                raise AllocationFailedError(
                    f"requested address {address} of {pool.ref} is being reserved for another claim; retrying",
                    retry_after=1.0,
                )
            await asyncio.sleep(PENDING_POLL)
        return None

    async def hold_existing(
        self, ref: PoolRef, index: PoolIndex, claim: ClaimContext, held: Allocation
    ) -> Reservation | None:
        """Make the claim hold exactly `held`'s address, its IPAddress's: the reservation holding the address then.
        When it is the claim's own, the claim's other reservations of the pool (lost to concurrent allocations) are
        deleted; nothing is asked of the API server when `index` knows the claim to hold the address alone. None
        when none holds it. ValueError when the address is not of the pool's family."""
        value = index.value_of(held.address)
        holder = index.by_address.get(value)
        mine = holder is not None and holder.pool_label == pool_hash(ref) and holder.claim_uid == claim.uid
        if mine and claim.uid not in index.doubly_held:
            return holder  # the steady state
        if not mine:
            holder = await self._adopt(ref, index, claim, held)
            if holder is None or holder.claim_uid != claim.uid or holder.pool_label != pool_hash(ref):
                return holder
        for other in await self.reservations.list_claim(ref, claim.uid):
            if other.address != held.address:
                await self.delete(ref, index, other)
        self.current(ref, index).held_alone(claim.uid, value)
        return holder

    async def _adopt(self, ref: PoolRef, index: PoolIndex, claim: ClaimContext, held: Allocation) -> Reservation | None:
        """Make the reservation of `held` for the claim, or take over the pool's own one of the claim's
        namespace/name or a release record of it; learned by `index`. The reservation holding the address now, None
        when none does. AllocationFailedError (retried soon) when the own one changed while the claim took it."""
        reservation = await self.reservations.create(ref, held, claim)
        reservation = reservation or await self.reservations.get(ref, held.address)
        takes_over = (
            reservation is not None and reservation.pool_label == pool_hash(ref) and reservation.claim_uid != claim.uid
        )
        if reservation is None or not takes_over or not (reservation.released_at or reservation.claim == str(claim)):
            self.learn(ref, reservation, index=index)
            return reservation
        taken = await self.give(ref, index, reservation, claim, held)
        if taken is None:
            raise AllocationFailedError(
                f"the reservation of {held.address} changed while IPAddress {claim} took it; retrying",
                retry_after=1.0,
            )
        return taken

    async def pin(self, pool: ParsedPool, addresses: Sequence[Allocation]) -> None:
        """Create the missing pin reservations of the pool and delete those of removed pins (see the module), for a
        reconcile that read `pool`, with the IPAddresses naming it. A pool without pins whose index (for that
        object) is not built has no pin reservations this process knows of: nothing to do."""
        index = self._indexes.get(pool.ref)
        if pool.pre.pinned:
            index = await self.index(pool)
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
            index = self.current(pool.ref, index)
            if not index.take_specific(value, ""):
                continue  # held (by the pin, its claim or another one: `collisions` tells) or being reserved now
            claim = ClaimContext(*named, uid="")
            learned = await self.reserve(pool.ref, index, Allocation(text, pool.prefix, pool.gateway), claim)
            if learned is not None and learned.claim == str(claim) and not (learned.claim_uid or learned.released_at):
                log.info("pre-allocated address pinned", pool=str(pool.ref), address=text, claim=str(claim))
        await self._unpin_removed(pool.ref, pool.pre, index, backed)

    async def _unpin_removed(self, ref: PoolRef, pre: PreAllocations, index: PoolIndex, backed: set[str]) -> None:
        current = self.current(ref, index)
        for reservation in list(current.by_address.values()):
            if reservation.claim_uid or reservation.released_at or normalized_address(reservation.address) in backed:
                continue
            value = address_value(reservation.address, pre.family)
            if not current.owns(reservation) or value is None:
                continue  # another pool's of the uniqueness domain: its pins are its own
            if pre.held_by_named(value, reservation.claim):
                continue
            if await self.reservations.still_named(reservation, ref):
                continue
            await self.delete(ref, index, reservation)
            log.info("pin removed", pool=str(ref), address=reservation.address, claim=reservation.claim)
