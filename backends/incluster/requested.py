"""Specific addresses of an in-cluster pool: the one a claim requests with the annotation
`ipam.cluster.x-k8s.io/requested-address`, and the one `spec.preAllocations` names for it (see `preallocations`).

Contract, for a claim without an IPAddress and without a reservation yet (a claim that holds either keeps it):
- The address must be an allocatable address of the pool: in `addresses`, not in `excludedAddresses`, not the
  gateway, not the subnet's first address (nor the IPv4 broadcast) unless `allocateReservedIPAddresses`; and it
  must not be pre-allocated to another claim. Otherwise: AllocationFailed, `requested_address_outside` with why.
- A requested address that `spec.preAllocations` contradicts (it names another address for the claim): refused.
- Otherwise the address is taken by value (`PoolIndex.take_specific`, the allocation policy does not apply) and
  reserved; the reservation's create-uniqueness is the arbiter, as for dynamic allocation. The pool's own release
  record of the address whose grace period is over (kept under LeastRecentlyReleased) is taken over instead,
  guarded by its resourceVersion (see `released`). If another claim holds
  it (also a released reservation in its reuse grace period): AllocationFailed, `requested_address_held` (for an
  address that is only pre-allocated: "pre-allocated address … is already held by …"). An address that another
  allocation of this process is trying right now is waited for, then looked at again.
- A reservation of the address under the claim's own namespace/name with another uid (the pin reservation of a
  pre-allocation, see `pins`; the claim's own released one, in its reuse grace period or not; one of an earlier
  claim of that name) is taken over, guarded by its resourceVersion; a concurrent change makes it look again.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from backends.incluster.allocatable import AllocatableSet, parse_address_entry
from backends.incluster.indexes import PoolIndexes
from backends.incluster.intervals import address_to_int
from backends.incluster.pool_index import PoolIndex
from backends.incluster.preallocations import PreAllocations, pre_allocated_address_held
from backends.incluster.released import reserve_or_take_over
from backends.incluster.reservations import Reservation, ReservationClient, age_seconds, pool_hash
from ipam_provider.backend.contract import (
    REQUESTED_ADDRESS_ANNOTATION,
    Allocation,
    AllocationFailedError,
    ClaimContext,
    PoolRef,
    requested_address_held,
    requested_address_outside,
)
from ipam_provider.runtime.kube.errors import ApiError

if TYPE_CHECKING:
    from backends.incluster.pool_spec import InClusterPoolSpec

log = structlog.get_logger(__name__)

PENDING_WAIT = 10.0  # how long to wait for another allocation's create of the same address to answer
PENDING_POLL = 0.05
ATTEMPTS = 5  # an address freed and taken again this many times in one call: try again later


def wanted_address(claim: ClaimContext, pre: PreAllocations) -> str | None:
    """The address the claim must get: its pre-allocated one, else the one it requests, else None (any).
    Raises AllocationFailedError for a non-IP annotation, a wrong entry of its own, or the two disagreeing."""
    requested = claim.requested_address
    pre_allocated = pre.address_of(claim)
    if pre_allocated is None:
        return requested
    if requested is not None and requested != pre_allocated:
        raise AllocationFailedError(
            f"claim {claim} requests {requested} with annotation {REQUESTED_ADDRESS_ANNOTATION}, but {pre.ref} "
            f"pre-allocates {pre_allocated} to it in spec.preAllocations; remove the annotation or change the pool"
        )
    return pre_allocated


def why_not_allocatable(spec: InClusterPoolSpec, allocatable: AllocatableSet, text: str) -> str | None:
    """Why the address `text` is not an allocatable address of the pool, or None when it is one."""
    family = allocatable.family
    try:
        value = address_to_int(text, family)
    except ValueError:
        return f"it is not an IPv{family} address, as spec.addresses are"
    if value in allocatable.addresses:
        return None
    if not any(entry.first <= value <= entry.last for entry in map(parse_address_entry, spec.addresses)):
        return "it is not in spec.addresses"
    if spec.gateway is not None and value == address_to_int(spec.gateway, family):
        return "it is the pool's gateway, spec.gateway"
    if not spec.allocate_reserved and value == allocatable.subnet_first:
        name = "network address" if family == 4 else "subnet-router anycast address"
        return f"it is the subnet's {name}, reserved unless spec.allocateReservedIPAddresses is true"
    if not spec.allocate_reserved and family == 4 and value == allocatable.subnet_last:
        return "it is the subnet's broadcast address, reserved unless spec.allocateReservedIPAddresses is true"
    return "it is in spec.excludedAddresses"


@dataclass
class SpecificAllocation:
    """Reserves one given address of the pool `ref` for one claim."""

    reservations: ReservationClient
    indexes: PoolIndexes
    ref: PoolRef
    prefix: int
    gateway: str | None
    reuse_grace_seconds: int | None = None

    async def allocate(
        self, index: PoolIndex, claim: ClaimContext, address: str, why_not: str | None, pre: PreAllocations
    ) -> Allocation:
        """Reserve `address` (canonical) for the claim; `why_not`: why it is not allocatable, None if it is."""
        if why_not is not None:
            raise AllocationFailedError(requested_address_outside(address, self.ref, why_not))
        value = index.value_of(address)
        others = pre.pinned_for_others(value, claim)
        if others:
            why = f"it is pre-allocated to claim {', '.join(others)} by spec.preAllocations"
            raise AllocationFailedError(requested_address_outside(address, self.ref, why))
        for _ in range(ATTEMPTS):
            index = self.indexes.current(self.ref, index)
            if index.take_specific(value, claim.uid):
                learned = await self._reserve(index, value, address, claim)
                if learned is None:
                    continue  # released between the create and the read: free again
                if learned.claim_uid == claim.uid and self._of_pool(learned):
                    return Allocation(learned.address, learned.prefix, learned.gateway)
                if self._own(learned, claim):
                    taken = await self._take_over(index, learned, claim)
                    if taken is None:
                        continue
                    return Allocation(taken.address, taken.prefix, taken.gateway)
                raise AllocationFailedError(
                    self._held_message(address, claim, learned), retry_after=self._grace_left(learned)
                )
            if not index.allocator.is_allocatable(value):  # the pool's spec changed meanwhile
                raise AllocationFailedError(requested_address_outside(address, self.ref))
            if value in index.pending:
                await self._settled(index, value, address)
                continue
            held = await self._fresh_holder(index, value, address)
            if held is None:
                continue  # the index knew of a reservation that is gone now
            if held.claim_uid == claim.uid and not held.released_at and self._of_pool(held):
                return Allocation(held.address, held.prefix, held.gateway)
            if self._own(held, claim):
                taken = await self._take_over(index, held, claim)
                if taken is None:
                    continue
                return Allocation(taken.address, taken.prefix, taken.gateway)
            raise AllocationFailedError(self._held_message(address, claim, held), retry_after=self._grace_left(held))
        raise AllocationFailedError(
            f"requested address {address} of {self.ref} changed hands repeatedly while being reserved; retrying",
            retry_after=1.0,
        )

    def _of_pool(self, reservation: Reservation) -> bool:
        """Whether the reservation is this pool's (a pool of a uniqueness domain also sees the domain's others)."""
        return reservation.pool_label == pool_hash(self.ref)

    def _own(self, reservation: Reservation, claim: ClaimContext) -> bool:
        """Whether the claim may take the reservation over: this pool's, under the claim's namespace/name with
        another uid (see the module)."""
        return (
            self._of_pool(reservation)
            and reservation.claim_uid != claim.uid
            and reservation.claim == f"{claim.namespace}/{claim.name}"
        )

    def _held_message(self, address: str, claim: ClaimContext, held: Reservation) -> str:
        holder = _holder(held) if self._of_pool(held) else held.holder()
        if claim.requested_address is None:  # the address comes from spec.preAllocations alone
            return pre_allocated_address_held(address, self.ref, holder)
        return requested_address_held(address, self.ref, holder)

    async def _take_over(self, index: PoolIndex, held: Reservation, claim: ClaimContext) -> Reservation | None:
        """Give the claim `held`, a reservation under its namespace/name (see the module); None when it changed or
        went away meanwhile (look again)."""
        try:
            taken = await self.reservations.reassign(held, claim.uid)
        except ApiError as error:
            if not (error.conflict or error.not_found):
                raise
            return None
        current = self.indexes.current(self.ref, index)
        current.drop(held)
        current.hold(taken)
        log.info("reservation taken over", pool=str(self.ref), address=taken.address, claim=str(claim))
        return taken

    def _grace_left(self, held: Reservation) -> float | None:
        """For a released reservation: seconds until its reuse grace period is over (the claim is retried then)."""
        grace = self.reuse_grace_seconds if self._of_pool(held) else held.grace_seconds
        if not held.released_at or not grace:
            return None
        return max(1.0, grace - age_seconds(held.released_at) + 1.0)

    async def _reserve(self, index: PoolIndex, value: int, address: str, claim: ClaimContext) -> Reservation | None:
        """Reserve the pending `value`: create its reservation, or take over the pool's own release record whose
        grace period is over that `take_specific` accepted (see `released`). The reservation made, the one found in
        its place, or None (none now)."""
        record = index.released.get(value)
        learned: Reservation | None = None
        try:
            claimant = (claim.namespace, claim.name, claim.uid)
            learned = await reserve_or_take_over(
                self.reservations, self.ref, record, address, self.prefix, self.gateway, claimant
            )
        finally:
            current = self.indexes.current(self.ref, index)
            if learned is not None:
                current.hold(learned)
            elif record is not None:
                current.drop(record)
            current.settle(value)
        if learned is not None and learned.claim_uid != claim.uid:
            log.info("requested address already reserved", pool=str(self.ref), address=address, holder=learned.claim)
        return learned

    async def _settled(self, index: PoolIndex, value: int, address: str) -> None:
        """Wait until no allocation of this process is trying `value` any more."""
        deadline = time.monotonic() + PENDING_WAIT
        while value in self.indexes.current(self.ref, index).pending:
            if time.monotonic() > deadline:
                raise AllocationFailedError(
                    f"requested address {address} of {self.ref} is being reserved for another claim; retrying",
                    retry_after=1.0,
                )
            await asyncio.sleep(PENDING_POLL)

    async def _fresh_holder(self, index: PoolIndex, value: int, address: str) -> Reservation | None:
        """The reservation of `value` as the API server has it now (the index may be stale), put in the index."""
        known = index.by_address.get(value)
        fresh = await self.reservations.get(self.ref, address)
        current = self.indexes.current(self.ref, index)
        if known is not None and (fresh is None or fresh.uid != known.uid):
            current.drop(known)
        if fresh is not None:
            current.hold(fresh)
        return fresh


def _holder(reservation: Reservation) -> str:
    if reservation.released_at:
        return f"claim {reservation.claim} (released; kept until the pool's addressReuseGracePeriodSeconds pass)"
    return f"claim {reservation.claim}"
