"""The in-cluster backend: pools defined by InClusterIPPool / GlobalInClusterIPPool (v1alpha2), a thin facade over
the parsed pool (`spec`), the `ledger` of reservations and indexes, the `allocator` and the `repair` capability.

A claim's address is held by a reservation whose name encodes (pool, address): the API server's create-uniqueness
decides who holds it. Claims of one pool are allocated concurrently (`concurrent_claims`); memory and time per
allocation follow the number of allocations, not the pool's size (see `intervals`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import cast

from backends.incluster.allocator import Allocator, collisions
from backends.incluster.domains import INVALID_POOL_OVERLAP, PoolSurvey, assess, domain_pools, unheld_pinned
from backends.incluster.intervals import address_value
from backends.incluster.ledger import Ledger
from backends.incluster.repair import Repair
from backends.incluster.spec import (
    AddressPool,
    ParsedPool,
    ReleaseTerms,
    address_pool_advisories,
    consistency_condition,
    pool_change_problems,
    survey_parse,
)
from ipam_provider.api.capi import IPAM_GROUP
from ipam_provider.backend.contract import (
    AddressCounts,
    AddressInUse,
    Allocation,
    BackendContext,
    ClaimContext,
    PoolKind,
    PoolNotReadyError,
    PoolRef,
    PoolReport,
)
from ipam_provider.backend.live_pools import LivePools
from ipam_provider.backend.protocol import Capabilities
from ipam_provider.common import Object, cap_int64

IN_CLUSTER_POOL = PoolKind(IPAM_GROUP, "v1alpha2", "InClusterIPPool", "inclusterippools", namespaced=True)
GLOBAL_IN_CLUSTER_POOL = PoolKind(
    IPAM_GROUP, "v1alpha2", "GlobalInClusterIPPool", "globalinclusterippools", namespaced=False
)


class InClusterBackend:
    """Serves InClusterIPPool and GlobalInClusterIPPool; offers the repair capability (see `repair`)."""

    name = ""  # the metrics' `backend` label comes from the module (`incluster`)
    concurrent_claims = True
    kinds: Sequence[PoolKind] = (IN_CLUSTER_POOL, GLOBAL_IN_CLUSTER_POOL)
    pool_type: type[ParsedPool] = AddressPool

    def __init__(self, context: BackendContext) -> None:
        kube, cached_pools = context.kube, context.cached_pools
        self.ledger = Ledger(kube, context.cached_addresses, lambda d: domain_pools(kube, self.kinds, cached_pools, d))
        self.allocator = Allocator(self.ledger)
        # Every operation of a pool runs in `pools.operation`: what one keeps for a pool gone meanwhile goes.
        self.pools = LivePools(self.forget_pool)
        self.repair = Repair(self.ledger, self.pool_type.parse, self.kinds, cached_pools, self.pools)
        self.cached_addresses = context.cached_addresses
        self.survey = PoolSurvey(self.kinds, cached_pools, survey_parse)
        # Each pool's last valid parse, with the spec it was read from.
        self._parsed: dict[PoolRef, tuple[Object, ParsedPool]] = {}

    def capabilities(self) -> Capabilities:
        """Every optional capability; the repair one is the Repair's."""
        return Capabilities(
            name=self.name,
            prepare=self.prepare,
            review_pool_change=self.review_pool_change,
            observe_pool=self.observe_pool,
            concurrent_claims=self.concurrent_claims,
            repair=self.repair,
            list_pools_holdings=self.repair.list_pools_holdings,
            sweep_orphaned=self.repair.sweep_orphaned,
        )

    def parse(self, ref: PoolRef, pool: Object) -> ParsedPool:
        """The pool as one call reads it (its uniqueness domain noted); PoolNotReadyError when it is invalid. It is
        the pool's last parse while its uid, generation and spec are the same (a parse depends on nothing else); an
        invalid pool is parsed, and fails, every time."""
        meta, spec = pool.get("metadata") or {}, pool.get("spec") or {}
        kept = self._parsed.get(ref)
        if kept is not None:
            kept_spec, last = kept
            same_pool = last.uid == str(meta.get("uid") or "") and last.generation == int(meta.get("generation") or 0)
            if same_pool and (kept_spec is spec or kept_spec == spec):
                return self.ledger.noted(last)
        parsed = self.pool_type.parse(ref, pool)
        self._parsed[ref] = (spec, parsed)
        return self.ledger.noted(parsed)

    def observe_pool(self, kind: PoolKind, old: Object | None, new: Object | None) -> Collection[PoolRef]:
        """The pools overlapping a changed pool before or after the change (see `domains.PoolSurvey`); a deleted
        pool is forgotten (`observe_live`)."""
        self.observe_live(kind, old, new)
        return self.survey.observe(kind, old, new)

    def observe_live(self, kind: PoolKind, old: Object | None, new: Object | None) -> None:
        """Tell `pools` whether the changed pool exists: a deleted one is forgotten (`forget_pool`) now and when an
        operation of it ends later."""
        meta = (new or old or {}).get("metadata") or {}
        if meta.get("name"):
            self.pools.observe(kind.ref(meta.get("namespace"), meta["name"]), new is not None)

    def forget_pool(self, ref: PoolRef) -> None:
        """The pool is gone: what the ledger and the repair keep for it, and its parse, go."""
        self.ledger.forget(ref)
        self.repair.all_inside.pop(ref, None)
        self._parsed.pop(ref, None)

    async def prepare(self, pool_ref: PoolRef, pool: Object) -> None:
        """Build the pool's index ahead of its first allocation (`Ledger.prepare`); an invalid pool is left alone."""
        with self.pools.operation(pool_ref):
            try:
                parsed = self.parse(pool_ref, pool)
            except PoolNotReadyError:
                return
            await self.ledger.prepare(parsed)

    async def review_pool_change(
        self, pool_ref: PoolRef, old: Object | None, new: Object | None, in_use: Sequence[AddressInUse]
    ) -> list[str]:
        """The admission webhook's checks for the pool's kinds (see `spec`)."""
        return pool_change_problems(old, new, in_use)

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        with self.pools.operation(pool_ref):
            return await self.allocator.allocate(self.parse(pool_ref, pool), claim, existing)

    async def release(
        self, pool_ref: PoolRef, pool: Object | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        with self.pools.operation(pool_ref):
            await self.ledger.release_claim(pool_ref, ReleaseTerms.of(pool_ref, pool), claim.uid)

    async def report(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[Allocation]) -> PoolReport:
        with self.pools.operation(pool_ref):
            return await self._report(pool_ref, pool, addresses)

    async def _report(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[Allocation]) -> PoolReport:
        try:
            parsed = cast(AddressPool, self.parse(pool_ref, pool))
        except PoolNotReadyError as error:
            invalid = AddressCounts(total=0, used=len(addresses), free=0, out_of_range=len(addresses))
            conditions = [INVALID_POOL_OVERLAP]
            return PoolReport(False, "InvalidConfiguration", error.message, counts=invalid, conditions=conditions)
        allocatable, spec = parsed.allocatable, parsed.fields
        family = allocatable.family
        out_of_range = sum(1 for a in addresses if address_value(a.address, family) not in allocatable.addresses)
        await self.ledger.pin(parsed, addresses)
        collided, waiting = await collisions(
            parsed.pre, addresses, self.cached_addresses(pool_ref), self.ledger.reservations
        )
        own = [allocation.address for allocation in addresses]
        cross_conditions, related, held_elsewhere = assess(
            self.survey, self.cached_addresses, pool_ref, allocatable, parsed.domain, own
        )
        index = self.ledger.get(pool_ref)
        in_grace, reusable_in = index.in_grace() if index is not None else (frozenset[int](), None)
        # a pinned address is free for its claim only; one held by another pool of the domain or in grace for none
        unavailable = unheld_pinned(parsed.pre.pinned, family, own) | held_elsewhere | in_grace
        total = allocatable.addresses.size
        free = max(total - (len(addresses) - out_of_range) - len(unavailable), 0)
        counts = AddressCounts(total=total, used=len(addresses), free=free, out_of_range=out_of_range)
        problems = [*parsed.pre.problems, *collided]
        advisories = address_pool_advisories(
            spec.addresses, spec.prefix, spec.gateway, spec.excluded_addresses, spec.allocate_reserved, allocatable
        )
        conditions = [*cross_conditions, consistency_condition(advisories)]
        if problems:
            message = f"{pool_ref} has invalid preAllocations: {'; '.join(problems)}; fix spec.preAllocations"
            ready, reason = False, "InvalidConfiguration"
        else:
            message = _counts_message(counts, held_elsewhere, parsed.domain, waiting, len(in_grace))
            ready, reason = True, "PoolReady"
        return PoolReport(
            ready, reason, message, counts=counts, conditions=conditions, related=related, report_again=reusable_in
        )

    async def close(self) -> None:
        self.ledger.clear()


def _counts_message(
    counts: AddressCounts, held_elsewhere: frozenset[int], domain: str | None, waiting: int, in_grace: int
) -> str:
    """The Ready message of an address pool: its free count and what it leaves out."""
    message = f"{cap_int64(counts.free)} of {cap_int64(counts.total)} addresses free"
    if held_elsewhere:
        message += f" ({len(held_elsewhere)} held by other pools of uniqueness domain {domain})"
    if in_grace:
        message += f"; {in_grace} released addresses wait out addressReuseGracePeriodSeconds"
    if waiting:
        message += f"; {waiting} more pre-allocated to claims that do not hold them yet"
    if counts.out_of_range:
        message += f"; {counts.out_of_range} allocated addresses lie outside the pool's addresses"
    return message
