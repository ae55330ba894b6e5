"""The in-cluster backend: pools defined by InClusterIPPool / GlobalInClusterIPPool (v1alpha2).

Allocation takes the lowest free address of the pool's allocatable set and holds it with a reservation whose
name encodes (pool, address) — see `reservations`. Memory and time per allocation follow the number of
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

import time
from collections.abc import Sequence
from typing import Any

import structlog
from pydantic import Field, ValidationError, field_validator

from backends.incluster.adoption import hold_existing
from backends.incluster.allocatable import AllocatableSet, PoolSpecError, build_allocatable_set
from backends.incluster.domains import domain_pools, domain_problem, unheld_pinned
from backends.incluster.indexes import PoolIndexes
from backends.incluster.intervals import address_to_int
from backends.incluster.orphans import sweep_orphans
from backends.incluster.overlap import PoolSurvey, assess, invalid_pool_condition
from backends.incluster.pins import enforce_pins
from backends.incluster.pool_index import PoolIndex
from backends.incluster.preallocations import PreAllocations, collisions, exhausted_message, take_dynamic
from backends.incluster.requested import SpecificAllocation, wanted_address, why_not_allocatable
from backends.incluster.reservations import Reservation, ReservationClient
from backends.incluster.strays import sweep_strays
from backends.validation import spec_error
from ipam_provider.api.meta import Model, now_rfc3339
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
from ipam_provider.kube.resources import IPAM_GROUP

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
    pre_allocations: dict[str, Any] = Field(default_factory=dict, alias="preAllocations")
    uniqueness_domain: str | None = Field(default=None, alias="uniquenessDomain")  # see `domains`

    @field_validator("uniqueness_domain")
    @classmethod
    def _domain_is_a_dns_label(cls, value: str | None) -> str | None:
        problem = domain_problem(value) if value is not None else None
        if problem is not None:
            raise ValueError(problem)
        return value

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


def _survey_parse(pool: Object) -> tuple[AllocatableSet, str | None] | None:
    try:
        spec, allocatable = parse_pool(pool)
    except (PoolSpecError, ValidationError, ValueError):
        return None
    return allocatable, spec.uniqueness_domain or None


class InClusterBackend:
    """Serves InClusterIPPool and GlobalInClusterIPPool."""

    concurrent_claims = True
    cross_pool_reports = True  # a pool's report names the pools overlapping it (see `overlap`)

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
        self.survey = PoolSurvey(self.kinds, context.cached_pools, _survey_parse)
        self._swept: dict[tuple[PoolRef, str], float] = {}  # by pool and pool object (uid)
        self._orphans_swept = time.monotonic()  # the first sweep comes one interval after start

    @property
    def kinds(self) -> Sequence[PoolKind]:
        return (IN_CLUSTER_POOL, GLOBAL_IN_CLUSTER_POOL)

    def _parse(self, ref: PoolRef, pool: Object) -> tuple[InClusterPoolSpec, AllocatableSet]:
        try:
            spec, allocatable = parse_pool(pool)
            self.reservations.note_domain(ref, spec.uniqueness_domain)
            return spec, allocatable
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
        self.reservations.note_domain(pool_ref, spec.uniqueness_domain)
        pinned = frozenset(PreAllocations.of(pool_ref, spec.pre_allocations, allocatable).pinned)
        await self.indexes.prepare(pool_ref, allocatable, _generation(pool), pinned, _uid(pool))

    async def review_pool_change(
        self, pool_ref: PoolRef, old: Object | None, new: Object | None, in_use: Sequence[AddressInUse]
    ) -> list[str]:
        """The admission webhook's checks for the pool's kinds (see `admission`)."""
        from backends.incluster.admission import pool_change_problems  # that module builds on parse_pool here

        return pool_change_problems(old, new, in_use)

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        spec, allocatable = self._parse(pool_ref, pool)
        pre = PreAllocations.of(pool_ref, spec.pre_allocations, allocatable)
        index = await self.indexes.index(
            pool_ref, allocatable, _generation(pool), spec.reuse_grace_seconds, frozenset(pre.pinned), _uid(pool)
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
            candidate = take_dynamic(index, claim.uid, pre.pinned)
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
            reservation = await self._try_candidate(pool_ref, spec, index.family, candidate, claim, index)
            if reservation is not None:
                return Allocation(reservation.address, reservation.prefix, reservation.gateway)

    def _why_not(self, spec: InClusterPoolSpec, allocatable: AllocatableSet, address: str) -> str | None:
        """Why the pool cannot hand out the requested `address`, or None when it can."""
        return why_not_allocatable(spec, allocatable, address)

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
        address (now known to the index) or it was released in between (free again)."""
        address = index.address_of(candidate)
        learned: Reservation | None = None
        try:
            reservation = await self.reservations.create(
                ref, address, spec.prefix, spec.gateway, claim.namespace, claim.name, claim.uid
            )
            if reservation is None:  # reserved by someone this index did not know about
                learned = await self.reservations.get(ref, address)
            else:
                learned = reservation
        finally:
            current = self.indexes.current(ref, index)
            if learned is not None:
                current.hold(learned)
            current.settle(candidate)
        if learned is not None and learned.claim_uid != claim.uid:
            log.info("address already reserved elsewhere", pool=str(ref), address=address)
            return None
        return learned

    async def release(
        self, pool_ref: PoolRef, pool: Object | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        grace, pre = _release_terms(pool_ref, pool)
        for reservation in await self.reservations.list_claim(pool_ref, claim.uid):
            if pre is not None and pre.pins(reservation):
                # The spec still names the address for this claim: it stays pinned, free for that claim only.
                unclaimed = await self.reservations.reassign(reservation, "")
                index = self.indexes.get(pool_ref)
                if index is not None:
                    index.drop(reservation)
                    index.hold(unclaimed)
            elif grace:
                released = await self.reservations.mark_released(reservation, now_rfc3339(), grace)
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
        await self._enforce_pins(pool_ref, pool, spec, allocatable, pre, addresses)
        await self._sweep(pool_ref, addresses, _uid(pool))
        await self._sweep_orphans()
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
        return PoolReport(ready, reason, message, counts=counts, conditions=cross.conditions, related=cross.related)

    async def _enforce_pins(
        self,
        ref: PoolRef,
        pool: Object,
        spec: InClusterPoolSpec,
        allocatable: AllocatableSet,
        pre: PreAllocations,
        addresses: Sequence[Allocation],
    ) -> None:
        """Reserve the pool's free pre-allocated addresses for their claims, and free those of removed pins (see
        `pins`). A pool without pins whose index is not built has no pin reservations this process knows of."""
        generation = _generation(pool)
        if pre.pinned:
            pinned = frozenset(pre.pinned)
            index = await self.indexes.index(ref, allocatable, generation, spec.reuse_grace_seconds, pinned, _uid(pool))
        else:
            found = self.indexes.get(ref)
            if found is None or found.pool_uid != _uid(pool):
                return
            index = found
        if index.generation > generation:
            return  # this reconcile read an older spec than the index's: the newer one decides
        await enforce_pins(self.indexes, index, pre, spec.prefix, spec.gateway, addresses)

    async def _sweep(self, ref: PoolRef, addresses: Sequence[Allocation], uid: str = "") -> None:
        """At most once per SWEEP_INTERVAL and pool object (`uid`): delete its stray reservations (see `strays`)."""
        now = time.monotonic()
        if now - self._swept.get((ref, uid), 0.0) < SWEEP_INTERVAL:
            return
        self._swept = {key: at for key, at in self._swept.items() if key[0] != ref}  # an older object's is over
        self._swept[(ref, uid)] = now
        await sweep_strays(self.indexes, ref, addresses, STRAY_GRACE)

    async def _sweep_orphans(self) -> None:
        """Now and then, from any pool's report: the reservations of pools that are gone (see `orphans`)."""
        now = time.monotonic()
        if now - self._orphans_swept < ORPHAN_SWEEP_INTERVAL:
            return
        self._orphans_swept = now
        await sweep_orphans(self.kube, self.reservations, self.kinds, STRAY_GRACE)

    async def close(self) -> None:
        self.indexes.clear()


def _release_terms(ref: PoolRef, pool: Object | None) -> tuple[int | None, PreAllocations | None]:
    """The pool's reuse grace period and preAllocations, as far as its spec parses (none for a pool that is gone)."""
    if pool is None:
        return None, None
    try:
        spec, allocatable = parse_pool(pool)
    except (PoolSpecError, ValidationError, ValueError):
        try:
            return InClusterPoolSpec.model_validate(pool.get("spec") or {}).reuse_grace_seconds, None
        except ValidationError:
            return None, None
    return spec.reuse_grace_seconds, PreAllocations.of(ref, spec.pre_allocations, allocatable)


def _generation(pool: Object) -> int:
    return int((pool.get("metadata") or {}).get("generation") or 0)


def _uid(pool: Object) -> str:
    """The pool object's uid: per-pool state belongs to one object (a pool re-created under the same name is new)."""
    return str((pool.get("metadata") or {}).get("uid") or "")


def _first_line(error: Exception) -> str:
    if isinstance(error, ValidationError):
        return spec_error(error)
    return str(error).splitlines()[0]
