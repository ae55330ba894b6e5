"""Overlap between the allocatable addresses of in-cluster pools.

Each pool's reservations make its addresses unique within the pool only: two pools whose allocatable addresses
overlap can give two claims the same address, unless both name the same uniqueness domain (see `domains`).

Contract:
- `PoolSurvey.observe(kind, old, new)` takes every change of the pool watch (the backend's `observe_pool`) and
  answers the other pools whose allocatable addresses met the changed pool's, before or after the change: only
  their reports can change with it.
- `PoolSurvey.overlaps(ref, allocatable, domain)` answers the other observed pools (both kinds, every namespace the
  controller watches) of the same IP family whose allocatable addresses share some with `allocatable`: how many,
  the first, and whether the other pool names the same domain. None while the pool caches have not synced. A pool
  with an invalid spec hands out nothing and overlaps nothing; a pool being deleted still counts (its IPAddresses
  hold their addresses until they are gone). Each pool is parsed once per uid and generation.
- `overlap_condition` is the pool's `AddressesOverlap` condition: True with reason `PoolsOverlap` and a Warning
  Event when a pool outside its domain overlaps it (duplicates are possible); True with reason
  `OverlapWithinUniquenessDomain` and no Event when only pools of its own domain do (they never share an address);
  False with reason `NoOverlap` otherwise, also for a pool whose spec is invalid (`invalid_pool_condition`: it hands
  out nothing). Overlap never makes a pool not Ready.
- Cost: the pools are indexed by address per IP family (`Coverage`), so a report and a change cost O(log n + k)
  for n pools and the k segments the pool's addresses meet, plus one intersection per overlapping pool; nothing
  looks at every pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sortedcontainers import SortedDict

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.domains import held_elsewhere
from backends.incluster.intervals import IntervalSet, int_to_address
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


class Coverage:
    """Which pools cover which integers of one IP family: sorted boundaries, each mapped to the pools covering the
    integers from it up to the next boundary (none past the last one). Adjacent segments covered by the same pools
    are merged, so the map holds at most two boundaries per interval of the pools it covers."""

    def __init__(self) -> None:
        self._segments: SortedDict = SortedDict()  # boundary -> frozenset[PoolRef]

    def __len__(self) -> int:
        return len(self._segments)

    def covering(self, intervals: IntervalSet) -> set[PoolRef]:
        """The pools covering some integer of `intervals`: O(log n + s) for n boundaries and the s segments met."""
        found: set[PoolRef] = set()
        segments = self._segments
        for first, last in intervals:
            before = segments.bisect_right(first) - 1
            start = segments.peekitem(before)[0] if before >= 0 else first
            for boundary in segments.irange(start, last):
                found |= segments[boundary]
        return found

    def add(self, ref: PoolRef, intervals: IntervalSet) -> None:
        for first, last in intervals:
            self._split(first)
            self._split(last + 1)
            for boundary in list(self._segments.irange(first, last)):
                self._segments[boundary] = self._segments[boundary] | {ref}

    def remove(self, ref: PoolRef, intervals: IntervalSet) -> None:
        for first, last in intervals:
            for boundary in list(self._segments.irange(first, last + 1)):
                if boundary <= last:
                    self._segments[boundary] = self._segments[boundary] - {ref}
                self._merge(boundary)

    def _split(self, at: int) -> None:
        """Make `at` a boundary, covered by the pools that cover the segment it falls in."""
        if at not in self._segments:
            before = self._segments.bisect_right(at) - 1
            self._segments[at] = self._segments.peekitem(before)[1] if before >= 0 else frozenset()

    def _merge(self, boundary: int) -> None:
        """Drop `boundary` when its segment is covered as the one before it (or by nothing, when it is first)."""
        position = self._segments.index(boundary)
        previous = self._segments.peekitem(position - 1)[1] if position > 0 else frozenset()
        if self._segments[boundary] == previous:
            del self._segments[boundary]


class PoolSurvey:
    """The allocatable sets of the in-cluster pools the controller's pool watch has shown (`observe`), parsed once
    per pool uid and generation, and indexed per IP family (`Coverage`): the pools overlapping one pool are found
    in O(log n + k) for n pools and the k segments its addresses meet, never by looking at every pool."""

    def __init__(
        self, kinds: Sequence[PoolKind], cached_pools: Callable[[PoolKind], Sequence[Object] | None], parse: PoolParser
    ) -> None:
        self.kinds = kinds
        self.cached_pools = cached_pools
        self.parse = parse
        self._synced = False
        self._parsed: dict[PoolRef, tuple[tuple[str, int], tuple[AllocatableSet, str | None] | None]] = {}
        self._coverage: dict[int, Coverage] = {}

    def observe(self, kind: PoolKind, old: Object | None, new: Object | None) -> set[PoolRef]:
        """Take a pool's change from the watch (`old` None: added; `new` None: deleted); answers the other pools
        whose allocatable addresses met its own before or after the change (none when its uid and generation are
        those already known)."""
        meta = (new or old or {}).get("metadata") or {}
        ref = kind.ref(meta.get("namespace"), meta.get("name", ""))
        known = self._parsed.get(ref)
        before = known[1] if known is not None else None
        if new is None:
            self._parsed.pop(ref, None)
            after = None
        else:
            key = (str(meta.get("uid", "")), int(meta.get("generation") or 0))
            if known is not None and known[0] == key:
                return set()
            after = self.parse(new)
            self._parsed[ref] = (key, after)
        affected: set[PoolRef] = set()
        if before is not None:
            coverage = self._coverage[before[0].family]
            affected |= coverage.covering(before[0].addresses)
            coverage.remove(ref, before[0].addresses)
        if after is not None:
            coverage = self._coverage.setdefault(after[0].family, Coverage())
            affected |= coverage.covering(after[0].addresses)
            coverage.add(ref, after[0].addresses)
        affected.discard(ref)
        return affected

    def overlaps(self, ref: PoolRef, allocatable: AllocatableSet, domain: str | None) -> list[Overlap] | None:
        """The other pools overlapping `allocatable`, in order of their references (see the module's contract)."""
        if not self._synced:
            self._synced = all(self.cached_pools(kind) is not None for kind in self.kinds)
            if not self._synced:
                return None
        coverage = self._coverage.get(allocatable.family)
        found: list[Overlap] = []
        for other in coverage.covering(allocatable.addresses) if coverage is not None else ():
            parsed = self._parsed[other][1]
            if other == ref or parsed is None:
                continue
            shared = allocatable.addresses.intersection(parsed[0].addresses)
            first = shared.first()
            if first is not None:
                same = domain is not None and parsed[1] == domain
                found.append(Overlap(other, shared.size, int_to_address(first, allocatable.family), same))
        return sorted(found, key=lambda overlap: overlap.pool)


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
