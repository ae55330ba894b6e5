"""Overlap between the allocatable addresses of in-cluster pools.

Each pool's reservations make its addresses unique within the pool only: two pools whose allocatable addresses
overlap can give two claims the same address, unless both name the same uniqueness domain (see `domains`).

Contract:
- `PoolSurvey.overlaps(ref, allocatable, domain)` answers the other cached pools (both kinds, every namespace the
  controller watches) of the same IP family whose allocatable addresses share some with `allocatable`: how many,
  the first, and whether the other pool names the same domain. None while the pool caches cannot answer. A pool
  with an invalid spec hands out nothing and overlaps nothing; a pool being deleted still counts (its IPAddresses
  hold their addresses until they are gone). Each cached pool is parsed once per uid and generation.
- `overlap_condition` is the pool's `AddressesOverlap` condition: True with reason `PoolsOverlap` and a Warning
  Event when a pool outside its domain overlaps it (duplicates are possible); True with reason
  `OverlapWithinUniquenessDomain` and no Event when only pools of its own domain do (they never share an address);
  False with reason `NoOverlap` otherwise, also for a pool whose spec is invalid (`invalid_pool_condition`: it hands
  out nothing). Overlap never makes a pool not Ready.
- Cost: one intersection per other pool, linear in the two pools' interval counts: O(pools x intervals) per report,
  O(pools² x intervals) to report every pool after one changes, which is cheap for hundreds of pools.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.domains import held_elsewhere
from backends.incluster.intervals import int_to_address
from ipam_provider.backend.contract import PoolKind, PoolRef, ReportCondition
from ipam_provider.common import Object

ADDRESSES_OVERLAP = "AddressesOverlap"
POOLS_OVERLAP = "PoolsOverlap"
OVERLAP_WITHIN_DOMAIN = "OverlapWithinUniquenessDomain"
NO_OVERLAP = "NoOverlap"
NAMED_IN_MESSAGE = 5  # pools named in the condition's message; the rest are counted

# The allocatable set and uniqueness domain of a pool object; None when its spec is invalid.
PoolParser = Callable[[Object], tuple[AllocatableSet, str | None] | None]


@dataclass(frozen=True)
class Overlap:
    """Another pool sharing `count` allocatable addresses with the pool, `first` the lowest of them."""

    pool: PoolRef
    count: int
    first: str
    same_domain: bool


class PoolSurvey:
    """The allocatable sets of the cached in-cluster pools, parsed once per pool uid and generation."""

    def __init__(
        self, kinds: Sequence[PoolKind], cached_pools: Callable[[PoolKind], Sequence[Object] | None], parse: PoolParser
    ) -> None:
        self.kinds = kinds
        self.cached_pools = cached_pools
        self.parse = parse
        self._parsed: dict[PoolRef, tuple[tuple[str, int], tuple[AllocatableSet, str | None] | None]] = {}

    def overlaps(self, ref: PoolRef, allocatable: AllocatableSet, domain: str | None) -> list[Overlap] | None:
        """The other pools overlapping `allocatable`, in order of their references (see the module's contract)."""
        found: list[Overlap] = []
        seen: set[PoolRef] = set()
        for kind in self.kinds:
            pools = self.cached_pools(kind)
            if pools is None:
                return None
            for pool in pools:
                other = kind.ref(pool["metadata"].get("namespace"), pool["metadata"]["name"])
                seen.add(other)
                parsed = self._parse(other, pool)
                if other == ref or parsed is None or parsed[0].family != allocatable.family:
                    continue
                shared = allocatable.addresses.intersection(parsed[0].addresses)
                first = shared.first()
                if first is not None:
                    same = domain is not None and parsed[1] == domain
                    found.append(Overlap(other, shared.size, int_to_address(first, allocatable.family), same))
        for gone in self._parsed.keys() - seen:
            del self._parsed[gone]
        return sorted(found, key=lambda overlap: overlap.pool)

    def _parse(self, ref: PoolRef, pool: Object) -> tuple[AllocatableSet, str | None] | None:
        meta = pool["metadata"]
        key = (str(meta.get("uid", "")), int(meta.get("generation") or 0))
        known = self._parsed.get(ref)
        if known is None or known[0] != key:
            known = self._parsed[ref] = (key, self.parse(pool))
        return known[1]


def overlap_condition(overlaps: Sequence[Overlap], domain: str | None) -> ReportCondition:
    """The pool's AddressesOverlap condition (see the module's contract)."""
    unsafe = [overlap for overlap in overlaps if not overlap.same_domain]
    safe = [overlap for overlap in overlaps if overlap.same_domain]
    if not overlaps:
        return ReportCondition(ADDRESSES_OVERLAP, False, NO_OVERLAP, "no other pool shares an allocatable address")
    parts = []
    if unsafe:
        parts.append(
            f"shares addresses with {_describe(unsafe)}: two claims may be given the same address; make the "
            "pools' spec.addresses disjoint (for example with spec.excludedAddresses), or create the pools anew "
            "with one spec.uniquenessDomain"
        )
    if safe:
        parts.append(
            f"shares addresses with {_describe(safe)} of uniqueness domain {domain}, which never hands out an "
            "address twice"
        )
    reason = POOLS_OVERLAP if unsafe else OVERLAP_WITHIN_DOMAIN
    return ReportCondition(ADDRESSES_OVERLAP, True, reason, "; ".join(parts), warning=bool(unsafe))


def invalid_pool_condition() -> ReportCondition:
    """The AddressesOverlap condition of a pool whose spec is invalid."""
    return ReportCondition(
        ADDRESSES_OVERLAP, False, NO_OVERLAP, "the pool's spec is invalid: it hands out no address, so it overlaps none"
    )


@dataclass(frozen=True)
class CrossPool:
    """What a pool's report takes from the other pools: its extra conditions, the pools of its domain it overlaps
    (their free counts follow its addresses), and which of its addresses those hold."""

    conditions: Sequence[ReportCondition] = ()
    related: Sequence[PoolRef] = ()
    held_elsewhere: frozenset[int] = frozenset()


def assess(
    survey: PoolSurvey,
    cached_addresses: Callable[[PoolRef], Sequence[Object] | None],
    ref: PoolRef,
    allocatable: AllocatableSet,
    domain: str | None,
    own_addresses: Sequence[str],
) -> CrossPool:
    """The pool's CrossPool; nothing while the pool caches cannot tell. The addresses held by other pools of its
    domain are counted from the cached IPAddresses (not at all for a pool whose IPAddresses are not cached)."""
    overlaps = survey.overlaps(ref, allocatable, domain)
    if overlaps is None:
        return CrossPool()
    related = [overlap.pool for overlap in overlaps if overlap.same_domain]
    others = (cached_addresses(other) for other in related)
    held = held_elsewhere(allocatable.addresses, allocatable.family, own_addresses, others) if related else frozenset()
    return CrossPool([overlap_condition(overlaps, domain)], related, held)


def _describe(overlaps: Sequence[Overlap]) -> str:
    named = [f"{o.pool} ({_addresses(o.count)}, first {o.first})" for o in overlaps[:NAMED_IN_MESSAGE]]
    more = len(overlaps) - len(named)
    return ", ".join(named) + (f" and {more} more pools" if more else "")


def _addresses(count: int) -> str:
    return "1 address" if count == 1 else f"{count} addresses"
