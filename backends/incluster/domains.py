"""Uniqueness domains: in-cluster pools that never hand out one address twice between them although their addresses
overlap; and the overlap between pools, which without a common domain can give two claims one address.

A pool joins a domain with `spec.uniquenessDomain`, a DNS label (`DOMAIN_PATTERN`, at most 63 characters),
cluster-wide across kinds and namespaces; it cannot change once set (a CEL rule): it names the reservations.
- A domain pool's reservations are named `<domain hash>.<address>` (see `ledger`): create-uniqueness decides
  between every pool of the domain. Its index holds every reservation of the domain; each keeps its pool's label,
  so a pool's own accounting sees only its own, and a claim never takes over another pool's reservation or record.
- A release record records its pool's reuse grace period; any pool of the domain deletes it once that is over,
  except under LeastRecentlyReleased. The scan before a domain pool's first allocation covers the IPAddresses of
  every pool of the domain (`domain_pools`).

Overlap (`PoolSurvey`, fed by the pool watch): `observe` answers the pools whose allocatable addresses met a changed
pool's, before or after the change; `overlaps` the other pools of the same family sharing allocatable addresses
with one (None until the caches synced; an invalid pool overlaps nothing). `overlap_condition` is the
`AddressesOverlap` condition: True, `PoolsOverlap`, a Warning Event, when a pool outside the domain overlaps; True,
`OverlapWithinUniquenessDomain` when only pools of the domain do; else False, `NoOverlap`. It never makes a pool not
Ready.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from sortedcontainers import SortedDict

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.intervals import IntervalSet, address_value, int_to_address
from ipam_provider.backend.contract import PoolKind, PoolRef, ReportCondition
from ipam_provider.common import Object, normalized_address
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.client import KubeClient

DOMAIN_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # the CRDs' pattern for spec.uniquenessDomain
DOMAIN_MAX_LENGTH = 63
ADDRESSES_OVERLAP = "AddressesOverlap"
POOLS_OVERLAP = "PoolsOverlap"
OVERLAP_WITHIN_DOMAIN = "OverlapWithinUniquenessDomain"
NO_OVERLAP = "NoOverlap"
NAMED_IN_MESSAGE = 5  # pools named in the condition's message; the rest are counted


def domain_problem(domain: str) -> str | None:
    """Why `domain` is not a valid uniqueness domain name, or None when it is one."""
    if len(domain) > DOMAIN_MAX_LENGTH or re.fullmatch(DOMAIN_PATTERN[1:-1], domain) is None:
        return (
            f"uniquenessDomain {domain[: DOMAIN_MAX_LENGTH + 1]!r} is not a DNS label (at most {DOMAIN_MAX_LENGTH} "
            "lower-case letters, digits and '-', starting and ending with a letter or digit)"
        )
    return None


async def domain_pools(
    kube: KubeClient,
    kinds: Sequence[PoolKind],
    cached_pools: Callable[[PoolKind], Sequence[Object] | None],
    domain: str,
) -> list[PoolRef]:
    """The pools of `kinds` whose spec names `domain` (invalid ones too: their IPAddresses still hold addresses),
    from the controller's pool caches, else (not synced) from a LIST."""
    found: list[PoolRef] = []
    for kind in kinds:
        pools = cached_pools(kind)
        if pools is None:
            pools, _ = await kube.list(pool_resource(kind))
        for pool in pools:
            meta = pool["metadata"]
            if (pool.get("spec") or {}).get("uniquenessDomain") == domain:
                found.append(kind.ref(meta.get("namespace") if kind.namespaced else None, meta["name"]))
    return found


def held_elsewhere(
    allocatable: IntervalSet, family: int, own: Sequence[str], others: Iterable[Sequence[Object] | None]
) -> frozenset[int]:
    """The pool's allocatable addresses that the IPAddresses of the domain's other pools (`others`, one sequence
    per pool; None where it is not known) hold, but not the pool's own IPAddresses (`own`, their addresses)."""
    mine = {address_value(address, family) for address in own}
    elsewhere: set[int] = set()
    for items in others:
        for item in items or ():
            value = address_value(str((item.get("spec") or {}).get("address", "")), family)
            if value is not None and value in allocatable and value not in mine:
                elsewhere.add(value)
    return frozenset(elsewhere)


def unheld_pinned(pinned: Collection[int], family: int, own: Sequence[str]) -> frozenset[int]:
    """The pre-allocated addresses (`pinned`) that none of the pool's own IPAddresses (`own`) holds yet."""
    used = {normalized_address(address) for address in own}
    return frozenset(value for value in pinned if int_to_address(value, family) not in used)


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
    """The allocatable sets of the pools the pool watch has shown, indexed per IP family (see the module)."""

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
        """Take a pool's change (`old` None: added; `new` None: deleted); the pools it affects (see the module)."""
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
        """The other pools overlapping `allocatable`, in order of their references (see the module)."""
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


def overlap_condition(overlaps: Sequence[Overlap], domain: str | None, seen_from: str | None) -> ReportCondition:
    """The AddressesOverlap condition (see the module) of a pool of namespace `seen_from` (None: cluster-scoped). It
    names, with their shared count and first shared address, the overlapping pools of that namespace and the
    cluster-scoped (the operator's) ones; those of other namespaces it counts only, for a tenant may read it."""
    unsafe = [overlap for overlap in overlaps if not overlap.same_domain]
    safe = [overlap for overlap in overlaps if overlap.same_domain]
    if not overlaps:
        return ReportCondition(ADDRESSES_OVERLAP, False, NO_OVERLAP, "no other pool shares an allocatable address")
    parts = []
    if unsafe:
        parts.append(
            f"shares addresses with {_describe(unsafe, seen_from)}: two claims may be given the same address; make the "
            "pools' spec.addresses disjoint (for example with spec.excludedAddresses), or create the pools anew "
            "with one spec.uniquenessDomain"
        )
    if safe:
        parts.append(
            f"shares addresses with {_describe(safe, seen_from)} of uniqueness domain {domain}, which never hands "
            "out an address twice"
        )
    reason = POOLS_OVERLAP if unsafe else OVERLAP_WITHIN_DOMAIN
    return ReportCondition(ADDRESSES_OVERLAP, True, reason, "; ".join(parts), warning=bool(unsafe))


# The AddressesOverlap condition of a pool whose spec is invalid.
INVALID_POOL_OVERLAP = ReportCondition(
    ADDRESSES_OVERLAP, False, NO_OVERLAP, "the pool's spec is invalid: it hands out no address, so it overlaps none"
)


def assess(
    survey: PoolSurvey,
    cached_addresses: Callable[[PoolRef], Sequence[Object] | None],
    ref: PoolRef,
    allocatable: AllocatableSet,
    domain: str | None,
    own_addresses: Sequence[str],
) -> tuple[list[ReportCondition], list[PoolRef], frozenset[int]]:
    """What a pool's report takes from the other pools (nothing while the caches cannot tell): its extra
    conditions, the pools of its domain it overlaps (their free counts follow its addresses), and which of its
    addresses those hold (from the domain's cached IPAddresses)."""
    overlaps = survey.overlaps(ref, allocatable, domain)
    if overlaps is None:
        return [], [], frozenset()
    related = [overlap.pool for overlap in overlaps if overlap.same_domain]
    others = (cached_addresses(other) for other in related)
    held = held_elsewhere(allocatable.addresses, allocatable.family, own_addresses, others) if related else frozenset()
    return [overlap_condition(overlaps, domain, ref.namespace)], related, held


def _describe(overlaps: Sequence[Overlap], seen_from: str | None) -> str:
    visible = [o for o in overlaps if o.pool.namespace in (None, seen_from)]
    named = [f"{o.pool} ({_addresses(o.count)}, first {o.first})" for o in visible[:NAMED_IN_MESSAGE]]
    more, hidden = len(visible) - len(named), len(overlaps) - len(visible)
    parts = [", ".join(named)] if named else []
    if more:
        parts.append(f"{more} more pools")
    if hidden:
        parts.append(f"{hidden} pool{'s' if hidden > 1 else ''} of other namespaces")
    return " and ".join(parts)


def _addresses(count: int) -> str:
    return "1 address" if count == 1 else f"{count} addresses"
