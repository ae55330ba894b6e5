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

A claim that requests an address (annotation), or that `spec.preAllocations` names, gets exactly that address or
AllocationFailed (see `requested`); pre-allocated addresses are never candidates for other claims (see
`preallocations`) and are held by reservations for their named claims (see `pins`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import structlog
from pydantic import ValidationError

from backends.incluster.admission import pool_change_problems
from backends.incluster.adoption import hold_existing
from backends.incluster.advisories import address_pool_advisories, consistency_condition
from backends.incluster.allocatable import AllocatableSet, PoolSpecError
from backends.incluster.domains import domain_pools, unheld_pinned
from backends.incluster.indexes import PoolIndexes
from backends.incluster.intervals import address_to_int
from backends.incluster.overlap import PoolSurvey, assess, invalid_pool_condition
from backends.incluster.pins import enforce_pool_pins
from backends.incluster.pool_index import PoolIndex
from backends.incluster.pool_spec import (
    InClusterPoolSpec,
    allocation_policy,
    first_line,
    parse_pool,
    pool_generation,
    pool_uid,
    survey_parse,
)
from backends.incluster.preallocations import PreAllocations, collisions, exhausted_message
from backends.incluster.release import release_claim
from backends.incluster.released import reserve_or_take_over
from backends.incluster.repair import ReservationRepair
from backends.incluster.requested import SpecificAllocation, wanted_address, why_not_allocatable
from backends.incluster.reservations import Reservation, ReservationClient
from ipam_provider.backend.contract import (
    AddressCounts,
    AddressInUse,
    Allocation,
    BackendContext,
    ClaimContext,
    PoolExhaustedError,
    PoolKind,
    PoolNotReadyError,
    PoolRef,
    PoolReport,
)
from ipam_provider.common import Object, cap_int64
from ipam_provider.runtime.kube.resources import IPAM_GROUP

__all__ = ["GLOBAL_IN_CLUSTER_POOL", "IN_CLUSTER_POOL", "InClusterBackend", "InClusterPoolSpec", "allocation_policy"]
__all__ += ["parse_pool"]

log = structlog.get_logger(__name__)

IN_CLUSTER_POOL = PoolKind(IPAM_GROUP, "v1alpha2", "InClusterIPPool", "inclusterippools", namespaced=True)
GLOBAL_IN_CLUSTER_POOL = PoolKind(
    IPAM_GROUP, "v1alpha2", "GlobalInClusterIPPool", "globalinclusterippools", namespaced=False
)


class InClusterBackend(ReservationRepair):
    """Serves InClusterIPPool and GlobalInClusterIPPool; offers the repair capability (see `repair`)."""

    concurrent_claims = True

    def __init__(self, context: BackendContext) -> None:
        self.kube = context.kube
        self.reservations = ReservationClient(context.kube)
        self.indexes = PoolIndexes(
            context.kube,
            self.reservations,
            context.cached_addresses,
            lambda domain: domain_pools(context.kube, self.kinds, context.cached_pools, domain),
        )
        self.cached_addresses = context.cached_addresses
        self.cached_pools = context.cached_pools
        self.survey = PoolSurvey(self.kinds, context.cached_pools, survey_parse)
        self.all_inside = {}

    @property
    def kinds(self) -> Sequence[PoolKind]:
        return (IN_CLUSTER_POOL, GLOBAL_IN_CLUSTER_POOL)

    def observe_pool(self, kind: PoolKind, old: Object | None, new: Object | None) -> Collection[PoolRef]:
        """A pool's change seen by the watch: the pools overlapping it before or after, whose AddressesOverlap
        condition and free counts may change with it (see `overlap`)."""
        if new is None and old is not None:
            self.all_inside.pop(kind.ref(old["metadata"].get("namespace"), old["metadata"]["name"]), None)
        return self.survey.observe(kind, old, new)

    def _parse(self, ref: PoolRef, pool: Object) -> tuple[InClusterPoolSpec, AllocatableSet]:
        try:
            spec, allocatable = parse_pool(pool)
            self.reservations.note_domain(ref, spec.uniqueness_domain)
            return spec, allocatable
        except (PoolSpecError, ValidationError, ValueError) as error:
            raise PoolNotReadyError(f"{ref} is invalid: {first_line(error)}; fix the pool's spec") from error

    async def prepare(self, pool_ref: PoolRef, pool: Object) -> None:
        """Build the pool's index from its reservations ahead of its first allocation (the controller calls this
        while its caches sync, so that the LIST does not wait for them); the scan for IPAddresses without a
        reservation is left to that allocation. An invalid pool is left alone: its first allocation says why."""
        try:
            spec, allocatable = parse_pool(pool)
        except (PoolSpecError, ValidationError, ValueError):
            return
        self.reservations.note_domain(pool_ref, spec.uniqueness_domain)
        pre = PreAllocations.of(pool_ref, spec.pre_allocations, allocatable)
        policy = allocation_policy(spec, allocatable, pre)
        await self.indexes.prepare(pool_ref, allocatable, pool_generation(pool), policy, pool_uid(pool))

    async def review_pool_change(
        self, pool_ref: PoolRef, old: Object | None, new: Object | None, in_use: Sequence[AddressInUse]
    ) -> list[str]:
        """The admission webhook's checks for the pool's kinds (see `admission`)."""

        return pool_change_problems(old, new, in_use)

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        spec, allocatable = self._parse(pool_ref, pool)
        pre = PreAllocations.of(pool_ref, spec.pre_allocations, allocatable)
        policy = allocation_policy(spec, allocatable, pre)
        index = await self.indexes.index(
            pool_ref, allocatable, pool_generation(pool), spec.reuse_grace_seconds, policy, pool_uid(pool)
        )
        if existing is not None:
            return await hold_existing(self.reservations, pool_ref, index, claim, existing)
        held = index.by_claim.get(claim.uid)
        if held is not None:
            return Allocation(held.address, held.prefix, held.gateway)
        wanted = wanted_address(claim, pre)
        if wanted is not None:
            specific = SpecificAllocation(
                self.reservations, self.indexes, pool_ref, spec.prefix, spec.gateway, spec.reuse_grace_seconds
            )
            return await specific.allocate(index, claim, wanted, self._why_not(spec, allocatable, wanted), pre)
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
                raise PoolExhaustedError(exhausted_message(pool_ref, cap_int64(index.allocator.total), pre))
            reservation = await self._try_candidate(pool_ref, spec, candidate, claim, index)
            if reservation is not None:
                return Allocation(reservation.address, reservation.prefix, reservation.gateway)

    def _why_not(self, spec: InClusterPoolSpec, allocatable: AllocatableSet, address: str) -> str | None:
        """Why the pool cannot hand out the requested `address`, or None when it can."""
        return why_not_allocatable(spec, allocatable, address)

    async def _try_candidate(
        self,
        ref: PoolRef,
        spec: InClusterPoolSpec,
        candidate: int,
        claim: ClaimContext,
        index: PoolIndex,
    ) -> Reservation | None:
        """Reserve the pending `candidate` for the claim: its reservation, or None when someone else holds the
        address (now known to the index) or it was released in between (free again). A candidate with a release
        record is taken over (see `released`)."""
        address = index.address_of(candidate)
        record = index.released.get(candidate)
        learned: Reservation | None = None
        try:
            claimant = (claim.namespace, claim.name, claim.uid)
            learned = await reserve_or_take_over(
                self.reservations, ref, record, address, spec.prefix, spec.gateway, claimant
            )
        finally:
            current = self.indexes.current(ref, index)
            if learned is not None:
                current.hold(learned)
            elif record is not None:
                current.drop(record)
            current.settle(candidate)
        if learned is not None and learned.claim_uid != claim.uid:
            log.info("address already reserved elsewhere", pool=str(ref), address=address)
            return None
        return learned

    async def release(
        self, pool_ref: PoolRef, pool: Object | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        await release_claim(self.reservations, self.indexes, pool_ref, pool, claim.uid)

    async def report(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[Allocation]) -> PoolReport:
        try:
            spec, allocatable = self._parse(pool_ref, pool)
        except PoolNotReadyError as error:
            invalid = AddressCounts(total=0, used=len(addresses), free=0, out_of_range=len(addresses))
            conditions = [invalid_pool_condition()]
            return PoolReport(False, "InvalidConfiguration", error.message, counts=invalid, conditions=conditions)
        out_of_range = 0
        for allocation in addresses:
            try:
                inside = address_to_int(allocation.address, allocatable.family) in allocatable.addresses
            except ValueError:
                inside = False
            out_of_range += 0 if inside else 1
        pre = PreAllocations.of(pool_ref, spec.pre_allocations, allocatable)
        policy = allocation_policy(spec, allocatable, pre)
        generation, uid = pool_generation(pool), pool_uid(pool)
        await enforce_pool_pins(self.indexes, generation, allocatable, spec, policy, pre, addresses, uid=uid)
        collided, waiting = await collisions(pre, addresses, self.indexes.cached_addresses(pool_ref), self.reservations)
        total = allocatable.addresses.size
        used_inside = len(addresses) - out_of_range
        own = [allocation.address for allocation in addresses]
        cross = assess(self.survey, self.cached_addresses, pool_ref, allocatable, spec.uniqueness_domain, own)
        # a pinned address is free for its claim only; an address held by another pool of the domain for none
        unavailable = unheld_pinned(pre.pinned, allocatable.family, own) | cross.held_elsewhere
        free = max(total - used_inside - len(unavailable), 0)
        counts = AddressCounts(total=total, used=len(addresses), free=free, out_of_range=out_of_range)
        message = f"{cap_int64(counts.free)} of {cap_int64(counts.total)} addresses free"
        if cross.held_elsewhere:
            elsewhere = len(cross.held_elsewhere)
            message += f" ({elsewhere} held by other pools of uniqueness domain {spec.uniqueness_domain})"
        if waiting:
            message += f"; {waiting} more pre-allocated to claims that do not hold them yet"
        if out_of_range:
            message += f"; {out_of_range} allocated addresses lie outside the pool's addresses"
        problems = [*pre.problems, *collided]
        ready, reason = not problems, "PoolReady"
        if problems:
            message = f"{pool_ref} has invalid preAllocations: {'; '.join(problems)}; fix spec.preAllocations"
            reason = "InvalidConfiguration"
        advisories = address_pool_advisories(
            spec.addresses, spec.prefix, spec.gateway, spec.excluded_addresses, spec.allocate_reserved, allocatable
        )
        conditions = [*cross.conditions, consistency_condition(advisories)]
        return PoolReport(ready, reason, message, counts=counts, conditions=conditions, related=cross.related)

    async def close(self) -> None:
        self.indexes.clear()
