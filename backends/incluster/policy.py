"""How an in-cluster pool chooses its next dynamic address (`AllocationPolicy`, from its spec): the strategy, the
KEP-3070 static band, and the pre-allocated addresses no dynamic allocation takes.

The eligible addresses (allocatable, not pinned) form two *zones*: the static band (the lowest
`static_band_size(total)`, when on) and those above it; the band is entered only when the upper zone has nothing.
Within a zone: LowestFree takes the lowest free address (full intervals skipped: amortised O(log r)); Random a
uniform free one (a few draws, then the k-th free address by rank/select, O(log² n)); LeastRecentlyReleased
the lowest never-reserved address, else the release record released longest ago once its grace period is over.
The chooser never scans the used addresses: the index tells it each change (`used`, `freed`, `record`, `unrecord`).
"""

from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass
from enum import StrEnum
from itertools import accumulate
from typing import Any

from sortedcontainers import SortedList

from backends.incluster.intervals import IntervalSet, PoolAllocator

STATIC_BAND_MIN = 16
STATIC_BAND_MAX = 256
STATIC_BAND_STEP = 16


class AllocationStrategy(StrEnum):
    """`spec.allocationStrategy` of an in-cluster pool."""

    LOWEST_FREE = "LowestFree"
    RANDOM = "Random"
    LEAST_RECENTLY_RELEASED = "LeastRecentlyReleased"


def static_band_size(allocatable_count: int) -> int:
    """The number of the pool's lowest allocatable addresses that form the KEP-3070 static band:
    `min(max(16, size/16), 256)`, and 0 (no bands) when the pool has fewer than 16 allocatable addresses."""
    if allocatable_count < STATIC_BAND_MIN:
        return 0
    return min(max(STATIC_BAND_MIN, allocatable_count // STATIC_BAND_STEP), STATIC_BAND_MAX)


@dataclass(frozen=True)
class AllocationPolicy:
    """What a dynamic allocation of one pool may take, and in which order (see the module): its `strategy`, whether
    it keeps a `static_band`, and the `pinned` (pre-allocated) addresses it never takes."""

    strategy: AllocationStrategy = AllocationStrategy.LOWEST_FREE
    static_band: bool = False
    pinned: frozenset[int] = frozenset()


class Releases:
    """Release times (epoch seconds) by address (`at`), and the addresses in release order (`order`: (releasedAt,
    address), oldest first)."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self.order: Any = SortedList()

    def add(self, value: int, released_at: float) -> None:
        self.discard(value)
        self.at[value] = released_at
        self.order.add((released_at, value))

    def discard(self, value: int) -> None:
        if (released_at := self.at.pop(value, None)) is not None:
            self.order.discard((released_at, value))


RANDOM_DRAWS = 4  # uniform draws over the zone before the exact rank/select


class Region:
    """An immutable set of integers (an IntervalSet) with rank and select in O(log I) for I intervals."""

    def __init__(self, addresses: IntervalSet) -> None:
        self.addresses, self.size = addresses, addresses.size
        self._starts = [start for start, _ in addresses]
        self._ends = [end for _, end in addresses]
        # how many elements lie in the intervals before each interval
        self._before = list(accumulate((end - start + 1 for start, end in addresses), initial=0))[:-1]

    def rank(self, value: int) -> int:
        """How many elements are smaller than `value`."""
        index = bisect_right(self._starts, value) - 1
        if index < 0:
            return 0
        return self._before[index] + min(value, self._ends[index] + 1) - self._starts[index]

    def select(self, rank: int) -> int:
        """The element with `rank` elements below it (0 <= rank < size)."""
        index = bisect_right(self._before, rank) - 1
        return self._starts[index] + rank - self._before[index]


class Zone:
    """One zone of a pool (the band, or the addresses above it, without the pinned ones) and what is used in it."""

    def __init__(self, region: Region, used_anywhere: IntervalSet, track_points: bool) -> None:
        self.region = region
        used = used_anywhere.intersection(region.addresses)
        self.used = used.size
        self._first_unfilled = 0  # every interval of the region before this index is entirely used
        # The used addresses of the zone one by one (Random only): the order statistics of its exact choice.
        self.points: SortedList | None = None
        if track_points:
            self.points = SortedList(value for start, end in used for value in range(start, end + 1))
        self.releases = Releases()  # the zone's release records

    @property
    def free(self) -> int:
        return self.region.size - self.used

    def used_now(self, value: int) -> None:
        self.used += 1
        if self.points is not None:
            self.points.add(value)

    def freed_now(self, value: int, interval: int) -> None:
        self.used -= 1
        self._first_unfilled = min(self._first_unfilled, interval)
        if self.points is not None:
            self.points.discard(value)

    def lowest_free(self, allocator: PoolAllocator) -> int | None:
        """The zone's lowest address that is not used."""
        if self.free <= 0:
            return None
        self._first_unfilled, address = allocator.first_free_in(self.region.addresses, self._first_unfilled)
        return address

    def random_free(self, allocator: PoolAllocator, rng: random.Random) -> int | None:
        """A uniformly chosen address of the zone that is not used."""
        if self.free <= 0:
            return None
        for _ in range(RANDOM_DRAWS):
            value = self.region.select(rng.randrange(self.region.size))
            if not allocator.is_used(value):
                return value
        return self._kth_free(rng.randrange(self.free))

    def _kth_free(self, k: int) -> int:
        """The free address with exactly `k` free addresses of the zone below it.

        Free addresses below the j-th used one are `rank(points[j]) - j`, non-decreasing in j: count the used
        addresses below the answer (O(log n) evaluations, each O(log n + log I)), then select past them."""
        assert self.points is not None, "built with track_points"
        points, rank = self.points, self.region.rank
        used_below, high = 0, len(points)  # points[j] for j < used_below have at most k free addresses below
        while used_below < high:
            middle = (used_below + high) // 2
            if rank(points[middle]) - middle <= k:
                used_below = middle + 1
            else:
                high = middle
        return self.region.select(k + used_below)

    def oldest_record(self, now: float, grace_seconds: float) -> int | None:
        """The address of the zone's oldest release record if its grace period is over."""
        if not self.releases.order:
            return None
        released_at, value = self.releases.order[0]
        return int(value) if grace_over(released_at, now, grace_seconds) else None


def grace_over(released_at: float, now: float, grace_seconds: float) -> bool:
    """Whether a release at `released_at` (epoch seconds) may be reused at `now`."""
    return grace_seconds <= 0 or now - released_at >= grace_seconds


SHARED_RNG = random.Random()  # Random's choices for every pool not given its own (a generator holds 2.5 KB)


class Chooser:
    """The choice of a pool's next dynamic address under one `AllocationPolicy`, built over an allocator that holds
    the pool's used addresses. `choose` marks nothing: the index does."""

    def __init__(self, policy: AllocationPolicy, allocator: PoolAllocator, rng: random.Random | None = None) -> None:
        self.policy = policy
        self.rng = rng or SHARED_RNG  # kept when the pool's policy or spec changes (PoolIndex)
        allocatable = allocator.allocatable
        band = IntervalSet()
        if policy.static_band:
            size = static_band_size(allocatable.size)
            if size:
                band = IntervalSet([(allocatable.first() or 0, Region(allocatable).select(size - 1))])
        pinned = IntervalSet.from_points(policy.pinned)
        points = policy.strategy is AllocationStrategy.RANDOM
        eligible = allocatable.subtract(pinned)
        used = allocator.used_set()
        self.upper = Zone(Region(eligible.subtract(band)), used, points)
        self.band = Zone(Region(eligible.intersection(band)), used, points)

    def zone_of(self, value: int) -> tuple[Zone, int] | None:
        """The zone `value` belongs to and its interval's index there; None for a pinned or unallocatable one."""
        for zone in (self.upper, self.band):
            interval = zone.region.addresses.index_of(value)
            if interval is not None:
                return zone, interval
        return None

    def used(self, value: int) -> None:
        found = self.zone_of(value)
        if found is not None:
            found[0].used_now(value)

    def freed(self, value: int) -> None:
        found = self.zone_of(value)
        if found is not None:
            found[0].freed_now(value, found[1])

    def record(self, value: int, released_at: float) -> None:
        """`value` now has a release record that LeastRecentlyReleased may reuse."""
        if self.policy.strategy is not AllocationStrategy.LEAST_RECENTLY_RELEASED:
            return
        found = self.zone_of(value)
        if found is not None:
            found[0].releases.add(value, released_at)

    def unrecord(self, value: int) -> None:
        """`value` has no reusable release record any more (held again, pending, or gone)."""
        found = self.zone_of(value)
        if found is not None:
            found[0].releases.discard(value)

    def choose(self, allocator: PoolAllocator, now: float, grace_seconds: float) -> int | None:
        """The next dynamic address under the policy, or None when nothing is eligible."""
        strategy = self.policy.strategy
        for zone in (self.upper, self.band):
            if strategy is AllocationStrategy.RANDOM:
                value = zone.random_free(allocator, self.rng)
            else:
                value = zone.lowest_free(allocator)
                if value is None and strategy is AllocationStrategy.LEAST_RECENTLY_RELEASED:
                    value = zone.oldest_record(now, grace_seconds)
            if value is not None:
                return value
        return None
