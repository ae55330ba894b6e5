"""The in-cluster backend: pools defined by InClusterIPPool / GlobalInClusterIPPool (v1alpha2).

Allocation takes the address the pool's allocation policy chooses (the lowest free one by default; see `policy`,
`strategies`) and holds it with a reservation whose name encodes (pool, address) — see `reservations`; a
release record is taken over instead (see `released`). Memory and time per allocation follow the number of
allocations, not the pool's size (see `intervals`).

Claims of one pool are allocated concurrently (`concurrent_claims`). Only the choice of a candidate is
serialised: it is made and marked pending in memory in one step (`PoolIndex.take_candidate`), so each decision
takes the lowest address that is neither held nor being tried by another allocation at that moment. The API
server's create-uniqueness of the reservation stays the arbiter: an allocation that loses an address to another
process learns who holds it and takes the next candidate. Building or rebuilding a pool's index is done by one
allocation at a time; the others wait for it and use its result (see `indexes`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import structlog
from pydantic import Field, ValidationError, field_validator

from backends.incluster.allocatable import AllocatableSet, PoolSpecError, build_allocatable_set
from backends.incluster.indexes import PoolIndexes
from backends.incluster.intervals import address_to_int, int_to_address
from backends.incluster.orphans import sweep_orphans
from backends.incluster.policy import AllocationPolicy, AllocationStrategy
from backends.incluster.pool_index import PoolIndex
from backends.incluster.released import keeps_release_records, take_over
from backends.incluster.reservations import Reservation, ReservationClient, age_seconds
from backends.incluster.strategies import pinned_addresses
from backends.validation import spec_error
from ipam_provider.api.meta import Model, now_rfc3339
from ipam_provider.backend.contract import (
    AddressCounts,
    Allocation,
    AllocationFailedError,
    BackendContext,
    ClaimContext,
    PoolExhaustedError,
    PoolKind,
    PoolNotReadyError,
    PoolRef,
    PoolReport,
)
from ipam_provider.common import Object, cap_int64, normalized_address
from ipam_provider.kube.resources import ADDRESSES, CLAIMS, IPAM_GROUP

log = structlog.get_logger(__name__)

IN_CLUSTER_POOL = PoolKind(IPAM_GROUP, "v1alpha2", "InClusterIPPool", "inclusterippools", namespaced=True)
GLOBAL_IN_CLUSTER_POOL = PoolKind(
    IPAM_GROUP, "v1alpha2", "GlobalInClusterIPPool", "globalinclusterippools", namespaced=False
)
SWEEP_INTERVAL = 60.0  # at most one sweep for stray reservations per pool and interval
STRAY_GRACE = 60.0  # a reservation younger than this may belong to an allocation in progress
ORPHAN_SWEEP_INTERVAL = 600.0  # at most one sweep for reservations of deleted pools per process and interval


class InClusterPoolSpec(Model):
    addresses: list[str] = Field(default_factory=list)
    prefix: int = 0
    gateway: str | None = None
    excluded_addresses: list[str] = Field(default_factory=list, alias="excludedAddresses")
    allocate_reserved: bool = Field(default=False, alias="allocateReservedIPAddresses")
    reuse_grace_seconds: int | None = Field(default=None, alias="addressReuseGracePeriodSeconds")
    allocation_strategy: AllocationStrategy = Field(default=AllocationStrategy.LOWEST_FREE, alias="allocationStrategy")
    reserve_static_band: bool = Field(default=False, alias="reserveStaticBand")
    pre_allocations: dict[str, str] = Field(default_factory=dict, alias="preAllocations")

    @field_validator("gateway")
    @classmethod
    def _empty_gateway_is_none(cls, value: str | None) -> str | None:
        """`gateway: ""` means no gateway, as in the Go provider (its webhook checks only a non-empty one)."""
        return value if value is None or value.strip() else None


def parse_pool(pool: Object) -> tuple[InClusterPoolSpec, AllocatableSet]:
    """The pool's spec and allocatable set; PoolSpecError or ValidationError when invalid."""
    spec = InClusterPoolSpec.model_validate(pool.get("spec") or {})
    allocatable = build_allocatable_set(
        spec.addresses, spec.prefix, spec.gateway, spec.excluded_addresses, spec.allocate_reserved
    )
    return spec, allocatable


def allocation_policy(spec: InClusterPoolSpec, allocatable: AllocatableSet) -> AllocationPolicy:
    """The pool's allocation policy: its strategy, its static band, and its valid pre-allocated addresses."""
    pinned = pinned_addresses(spec.pre_allocations, allocatable)
    return AllocationPolicy(spec.allocation_strategy, spec.reserve_static_band, pinned)


class InClusterBackend:
    """Serves InClusterIPPool and GlobalInClusterIPPool."""

    concurrent_claims = True

    def __init__(self, context: BackendContext) -> None:
        self.kube = context.kube
        self.reservations = ReservationClient(context.kube)
        self.indexes = PoolIndexes(context.kube, self.reservations, context.cached_addresses)
        self._swept: dict[PoolRef, float] = {}
        self._orphans_swept = time.monotonic()  # the first sweep comes one interval after start

    @property
    def kinds(self) -> Sequence[PoolKind]:
        return (IN_CLUSTER_POOL, GLOBAL_IN_CLUSTER_POOL)

    def _parse(self, ref: PoolRef, pool: Object) -> tuple[InClusterPoolSpec, AllocatableSet]:
        try:
            return parse_pool(pool)
        except (PoolSpecError, ValidationError, ValueError) as error:
            raise PoolNotReadyError(f"{ref} is invalid: {_first_line(error)}; fix the pool's spec") from error

    async def prepare(self, pool_ref: PoolRef, pool: Object) -> None:
        """Build the pool's index from its reservations ahead of its first allocation (the controller calls this
        while its caches sync, so that the LIST does not wait for them); the scan for IPAddresses without a
        reservation is left to that allocation. An invalid pool is left alone: its first allocation says why."""
        try:
            spec, allocatable = parse_pool(pool)
        except (PoolSpecError, ValidationError, ValueError):
            return
        await self.indexes.prepare(pool_ref, allocatable, _generation(pool), allocation_policy(spec, allocatable))

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        spec, allocatable = self._parse(pool_ref, pool)
        policy = allocation_policy(spec, allocatable)
        index = await self.indexes.index(pool_ref, allocatable, _generation(pool), spec.reuse_grace_seconds, policy)
        if existing is not None:
            return await self._hold_existing(pool_ref, index, claim, existing)
        held = index.by_claim.get(claim.uid)
        if held is not None:
            return Allocation(held.address, held.prefix, held.gateway)
        rebuilt = False
        while True:
            index = self.indexes.current(pool_ref, index)  # never one built from an older spec
            candidate = index.take_candidate(claim.uid)
            if candidate is None:
                if not rebuilt:  # another process may have released addresses since the index was built
                    index = await self.indexes.rebuild(
                        pool_ref,
                        index.allocator.allocatable,
                        index.family,
                        index.spec_key,
                        index.generation,
                        scan=False,
                        replacing=index,
                    )
                    rebuilt = True
                    held = index.by_claim.get(claim.uid)
                    if held is not None:
                        return Allocation(held.address, held.prefix, held.gateway)
                    continue
                total = cap_int64(index.allocator.total)
                raise PoolExhaustedError(
                    f"{pool_ref} has no free address: all {total} are in use; add addresses to the pool or delete "
                    "claims"
                )
            reservation = await self._try_candidate(pool_ref, spec, index.family, candidate, claim, index)
            if reservation is not None:
                return Allocation(reservation.address, reservation.prefix, reservation.gateway)

    async def _try_candidate(
        self,
        ref: PoolRef,
        spec: InClusterPoolSpec,
        family: int,
        candidate: int,
        claim: ClaimContext,
        index: PoolIndex,
    ) -> Reservation | None:
        """Reserve the pending `candidate` for the claim: its reservation, or None when someone else holds the
        address (now known to the index) or it was released in between (free again). A candidate with a release
        record is taken over (see `released`)."""
        address = int_to_address(candidate, family)
        record = index.released.get(candidate)
        learned: Reservation | None = None
        gone = False
        try:
            if record is not None:
                args = (spec.prefix, spec.gateway, claim.namespace, claim.name, claim.uid)
                reservation = await take_over(self.reservations, record, *args)
            else:
                reservation = await self.reservations.create(
                    ref, address, spec.prefix, spec.gateway, claim.namespace, claim.name, claim.uid
                )
            if reservation is None:  # reserved, or the record changed, by someone this index did not know about
                learned = await self.reservations.get(ref, address)
                gone = learned is None
            else:
                learned = reservation
        finally:
            current = self.indexes.current(ref, index)
            if learned is not None:
                current.hold(learned)
            elif gone and record is not None:
                current.drop(record)
            current.settle(candidate)
        if learned is not None and learned.claim_uid != claim.uid:
            log.info("address already reserved elsewhere", pool=str(ref), address=address)
            return None
        return learned

    async def _hold_existing(
        self, ref: PoolRef, index: PoolIndex, claim: ClaimContext, existing: Allocation
    ) -> Allocation:
        """Make the claim hold exactly the address its IPAddress names (adoption, or a lost race)."""
        try:
            value = address_to_int(existing.address, index.family)
        except ValueError as error:
            raise AllocationFailedError(
                f"IPAddress {claim} names {existing.address!r}, which is not an address of {ref}'s family"
            ) from error
        holder = index.by_address.get(value)
        if holder is not None and holder.claim_uid == claim.uid and claim.uid not in index.doubly_held:
            return existing  # the steady state: nothing to ask the API server
        if holder is None or holder.claim_uid != claim.uid:
            reservation = await self.reservations.create(
                ref,
                existing.address,
                existing.prefix,
                existing.gateway,
                claim.namespace,
                claim.name,
                claim.uid,
            )
            if reservation is None:
                reservation = await self.reservations.get(ref, existing.address)
            if reservation is not None and _taken_over(reservation, claim):
                index.drop(reservation)
                reservation = await self.reservations.reassign(reservation, claim.uid)
            if reservation is None or reservation.claim_uid != claim.uid:
                if reservation is not None:
                    index.hold(reservation)
                owner = reservation.claim if reservation is not None else "another claim"
                raise AllocationFailedError(
                    f"address {existing.address} of IPAddress {claim} is already held by {owner} in {ref}; "
                    "delete one of the two IPAddresses"
                )
            index.hold(reservation)
        for other in await self.reservations.list_claim(ref, claim.uid):
            if other.address != existing.address:  # a reservation lost to a concurrent allocation
                await self.reservations.delete(other)
                index.drop(other)
        index.doubly_held.discard(claim.uid)
        held = index.by_address.get(value)
        if held is not None:
            index.by_claim[claim.uid] = held
        return existing

    async def release(
        self, pool_ref: PoolRef, pool: Object | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        keep_record = False
        if pool is not None:
            try:
                spec = InClusterPoolSpec.model_validate(pool.get("spec") or {})
                keep_record = keeps_release_records(spec.allocation_strategy, spec.reuse_grace_seconds)
            except ValidationError:
                keep_record = False
        for reservation in await self.reservations.list_claim(pool_ref, claim.uid):
            if keep_record:
                released = await self.reservations.mark_released(reservation, now_rfc3339())
                index = self.indexes.get(pool_ref)  # as it is after the write
                if index is not None:
                    index.drop(reservation)
                    index.hold(released)
            else:
                await self.reservations.delete(reservation)
                index = self.indexes.get(pool_ref)
                if index is not None:
                    index.drop(reservation)

    async def report(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[Allocation]) -> PoolReport:
        try:
            _, allocatable = self._parse(pool_ref, pool)
        except PoolNotReadyError as error:
            invalid = AddressCounts(total=0, used=len(addresses), free=0, out_of_range=len(addresses))
            return PoolReport(False, "InvalidConfiguration", error.message, counts=invalid)
        out_of_range = 0
        for allocation in addresses:
            try:
                inside = address_to_int(allocation.address, allocatable.family) in allocatable.addresses
            except ValueError:
                inside = False
            out_of_range += 0 if inside else 1
        await self._sweep(pool_ref, addresses)
        await self._sweep_orphans()
        total = allocatable.addresses.size
        used_inside = len(addresses) - out_of_range
        counts = AddressCounts(
            total=total, used=len(addresses), free=max(total - used_inside, 0), out_of_range=out_of_range
        )
        message = f"{cap_int64(counts.free)} of {cap_int64(counts.total)} addresses free"
        if out_of_range:
            message += f"; {out_of_range} allocated addresses lie outside the pool's addresses"
        return PoolReport(True, "PoolReady", message, counts=counts)

    async def _sweep(self, ref: PoolRef, addresses: Sequence[Allocation]) -> None:
        """Delete stray reservations: those whose claim is gone, and a claim's extra ones.

        A controller working from a lagging cache can reserve for a claim that another replica has just
        served or released; that can never duplicate an address, but it would leak one. Only reservations with
        no IPAddress behind them (by the cache) and older than STRAY_GRACE are checked, against fresh reads.
        """
        now = time.monotonic()
        if now - self._swept.get(ref, 0.0) < SWEEP_INTERVAL:
            return
        self._swept[ref] = now
        backed = {normalized_address(allocation.address) for allocation in addresses}
        for reservation in await self.reservations.list_pool(ref):
            if reservation.released_at or normalized_address(reservation.address) in backed:
                continue
            if age_seconds(reservation.created_at) < STRAY_GRACE:
                continue
            if await self._holds_rightfully(reservation):
                continue
            log.info("stray reservation deleted", pool=str(ref), address=reservation.address, claim=reservation.claim)
            await self.reservations.delete(reservation)
            index = self.indexes.get(ref)  # as it is after the delete
            if index is not None:
                index.drop(reservation)

    async def _sweep_orphans(self) -> None:
        """Now and then, from any pool's report: the reservations of pools that are gone (see `orphans`)."""
        now = time.monotonic()
        if now - self._orphans_swept < ORPHAN_SWEEP_INTERVAL:
            return
        self._orphans_swept = now
        await sweep_orphans(self.kube, self.reservations, self.kinds, STRAY_GRACE)

    async def _holds_rightfully(self, reservation: Reservation) -> bool:
        namespace, _, name = reservation.claim.partition("/")
        claim = await self.kube.get(CLAIMS, name, namespace)
        if claim is None or claim["metadata"].get("uid") != reservation.claim_uid:
            return False
        address = await self.kube.get(ADDRESSES, name, namespace)
        if address is None:
            return True  # an allocation in progress: its IPAddress is about to be written
        return normalized_address(str(address.get("spec", {}).get("address", ""))) == normalized_address(
            reservation.address
        )

    async def close(self) -> None:
        self.indexes.clear()


def _taken_over(reservation: Reservation, claim: ClaimContext) -> bool:
    """Whether the claim may take a reservation over: one held (not released) under the claim's own
    namespace/name but another uid, made from its IPAddress before the claim existed or before a restore."""
    return (
        reservation.claim_uid != claim.uid
        and not reservation.released_at
        and reservation.claim == f"{claim.namespace}/{claim.name}"
    )


def _generation(pool: Object) -> int:
    return int((pool.get("metadata") or {}).get("generation") or 0)


def _first_line(error: Exception) -> str:
    if isinstance(error, ValidationError):
        return spec_error(error)
    return str(error).splitlines()[0]
