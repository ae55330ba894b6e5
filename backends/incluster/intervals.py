"""Interval arithmetic and the lowest-free allocator of the in-cluster backend.

Addresses are plain Python integers (IPv4 and IPv6 alike), so every structure here works on closed integer
intervals `[start, end]` and never expands a range address by address. Costs follow the number of intervals
(and, for the allocator, the number of runs of consecutive used addresses), not the number of addresses: a
/48 IPv6 pool costs the same as a /24.
"""

from __future__ import annotations

import ipaddress
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any

from sortedcontainers import SortedDict

Interval = tuple[int, int]


def int_to_address(value: int, family: int) -> str:
    """The canonical text of the integer address `value` of IP `family` (4 or 6); ValueError when out of range."""
    if family == 4:
        return str(ipaddress.IPv4Address(value))
    if family == 6:
        return str(ipaddress.IPv6Address(value))
    raise ValueError(f"unknown IP family {family!r}")


def parse_ip(text: str) -> tuple[int, int]:
    """The (family, integer) of a plain IP address without blanks; ValueError else (a scoped IPv6 one too: an
    integer cannot carry its zone)."""
    if text != text.strip():  # ip_address itself tolerates a trailing newline
        raise ValueError("blanks around the address")
    address = ipaddress.ip_address(text)
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        raise ValueError("scoped IPv6 addresses are not supported")
    return address.version, int(address)


def address_to_int(address: str, family: int | None = None) -> int:
    """The integer of the textual IP `address` (blanks around it ignored), of `family` when given. ValueError for
    text that is not a plain IP address (see `parse_ip`) or of another family."""
    version, value = parse_ip(address.strip())
    if family is not None and version != family:
        raise ValueError(f"{address!r} is not an IPv{family} address")
    return value


def address_value(text: str, family: int) -> int | None:
    """`address_to_int(text, family)`, or None where that raises (not a plain IP of that family)."""
    try:
        return address_to_int(text, family)
    except ValueError:
        return None


class IntervalSet:
    """An immutable set of integers as sorted, disjoint, non-adjacent closed intervals (two sets of the same integers
    are equal and hash alike). Membership is O(log n) for n intervals; set operations are linear merges, O(n + m)."""

    __slots__ = ("_ends", "_size", "_starts")

    _starts: tuple[int, ...]
    _ends: tuple[int, ...]
    _size: int

    def __init__(self, intervals: Iterable[Interval] = ()) -> None:
        """The set covering every `[start, end]` of `intervals` (any order, overlaps allowed); ValueError for an
        interval whose start is greater than its end."""
        ordered = sorted(intervals)
        for start, end in ordered:
            if start > end:
                raise ValueError(f"interval start {start} is greater than its end {end}")
        self._set_normalized(_merge_sorted(ordered))

    @classmethod
    def from_points(cls, points: Iterable[int]) -> IntervalSet:
        return cls((point, point) for point in points)

    @classmethod
    def _from_normalized(cls, intervals: list[Interval]) -> IntervalSet:
        instance = cls.__new__(cls)
        instance._set_normalized(intervals)
        return instance

    def _set_normalized(self, intervals: list[Interval]) -> None:
        self._starts = tuple(start for start, _ in intervals)
        self._ends = tuple(end for _, end in intervals)
        self._size = sum(end - start + 1 for start, end in intervals)

    @property
    def size(self) -> int:
        """How many integers the set holds (unbounded: an IPv6 /0 holds 2**128)."""
        return self._size

    @property
    def interval_count(self) -> int:
        """How many disjoint, non-adjacent intervals make up the set."""
        return len(self._starts)

    def interval_at(self, index: int) -> Interval:
        return self._starts[index], self._ends[index]

    def index_of(self, value: int) -> int | None:
        """The index of the interval holding `value`, or None when `value` is not in the set."""
        index = bisect_right(self._starts, value) - 1
        if index >= 0 and value <= self._ends[index]:
            return index
        return None

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.index_of(value) is not None

    def __iter__(self) -> Iterator[Interval]:
        return zip(self._starts, self._ends, strict=True)

    def __bool__(self) -> bool:
        return bool(self._starts)

    def first(self) -> int | None:
        """The smallest integer of the set, or None when it is empty."""
        return self._starts[0] if self._starts else None

    def last(self) -> int | None:
        """The largest integer of the set, or None when it is empty."""
        return self._ends[-1] if self._ends else None

    def subtract(self, other: IntervalSet) -> IntervalSet:
        """The integers of this set that are not in `other`: those in the gaps of `other` between its bounds."""
        position, last = self.first(), self.last()
        if position is None or last is None:
            return self
        gaps: list[Interval] = []
        for start, end in other:
            if start > position:
                gaps.append((position, start - 1))
            position = max(position, end + 1)
        if position <= last:
            gaps.append((position, last))
        return self.intersection(IntervalSet._from_normalized(gaps))

    def intersection(self, other: IntervalSet) -> IntervalSet:
        """The integers in both sets: the non-empty pairwise overlaps of their intervals, in ascending order."""
        overlaps: list[Interval] = []
        mine, theirs = list(self), list(other)
        i = j = 0
        while i < len(mine) and j < len(theirs):
            start, end = max(mine[i][0], theirs[j][0]), min(mine[i][1], theirs[j][1])
            if start <= end:
                overlaps.append((start, end))
            if mine[i][1] < theirs[j][1]:
                i += 1
            else:
                j += 1
        return IntervalSet._from_normalized(overlaps)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IntervalSet):
            return NotImplemented
        return self._starts == other._starts and self._ends == other._ends

    def __hash__(self) -> int:
        return hash((self._starts, self._ends))

    def __repr__(self) -> str:
        return f"IntervalSet({list(self)!r})"


def _merge_sorted(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge valid intervals sorted by start into disjoint, non-adjacent ones."""
    merged: list[Interval] = []
    for start, end in intervals:
        if merged and start <= merged[-1][1] + 1:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


class PoolAllocator:
    """The used addresses of one pool (mutable), as merged runs of consecutive integers, inside the allocatable set
    or outside it (a pool can shrink), and lowest-free allocation. `mark_used`, `mark_free` and `is_used` cost
    O(log r) for r runs; `lowest_free` skips intervals known to be full: amortised O(log r)."""

    def __init__(self, allocatable: IntervalSet, used: Iterable[int] = ()) -> None:
        """Start with `used` (any order, duplicates allowed, inside or outside `allocatable`) marked used."""
        self._allocatable = allocatable
        used_set = IntervalSet.from_points(used)
        self._runs: Any = SortedDict(dict(used_set))
        # Every allocatable interval before this index is entirely used.
        self._first_unfilled_interval = 0

    @property
    def allocatable(self) -> IntervalSet:
        return self._allocatable

    @property
    def total(self) -> int:
        return self._allocatable.size

    def used_set(self) -> IntervalSet:
        """The used addresses, inside or outside the allocatable set, as an IntervalSet of their runs (O(r), no
        sort)."""
        return IntervalSet._from_normalized(list(self._runs.items()))

    def _run_index_at_or_before(self, address: int) -> int:
        """The index of the last run starting at or before `address`, or -1."""
        return int(self._runs.bisect_right(address)) - 1

    def _run_holding(self, address: int) -> Interval | None:
        index = self._run_index_at_or_before(address)
        if index < 0:
            return None
        start, end = self._runs.peekitem(index)
        return (start, end) if address <= end else None

    def is_used(self, address: int) -> bool:
        return self._run_holding(address) is not None

    def first_free_in(self, addresses: IntervalSet, from_interval: int) -> tuple[int, int | None]:
        """The lowest address of `addresses` that is not used, looked for from their interval `from_interval` on,
        and the index of its interval; (`addresses.interval_count`, None) when every one is used."""
        for index in range(from_interval, addresses.interval_count):
            start, end = addresses.interval_at(index)
            run = self._run_holding(start)
            candidate = start if run is None else run[1] + 1  # runs are merged: the address after one is free
            if candidate <= end:
                return index, candidate
        return addresses.interval_count, None

    def mark_used(self, address: int) -> bool:
        """Mark `address` used. Returns False (and changes nothing) when it already was."""
        index = self._run_index_at_or_before(address)
        before: Interval | None = None
        if index >= 0:
            before = self._runs.peekitem(index)
            if address <= before[1]:
                return False
        after_start = address + 1
        after_end: int | None = self._runs.get(after_start)
        if after_end is not None:
            del self._runs[after_start]
        new_end = after_end if after_end is not None else address
        if before is not None and before[1] == address - 1:
            self._runs[before[0]] = new_end
        else:
            self._runs[address] = new_end
        return True

    def mark_free(self, address: int) -> bool:
        """Mark `address` free. Returns False (and changes nothing) when it was not used."""
        run = self._run_holding(address)
        if run is None:
            return False
        start, end = run
        if start == address:
            del self._runs[start]
        else:
            self._runs[start] = address - 1
        if address < end:
            self._runs[address + 1] = end
        interval_index = self._allocatable.index_of(address)
        if interval_index is not None:
            self._first_unfilled_interval = min(self._first_unfilled_interval, interval_index)
        return True

    def lowest_free(self) -> int | None:
        """The lowest allocatable address that is not used, or None when the pool is full."""
        self._first_unfilled_interval, address = self.first_free_in(self._allocatable, self._first_unfilled_interval)
        return address

    def allocate(self) -> int | None:
        """Mark the lowest free address used and return it, or return None when the pool is full."""
        address = self.lowest_free()
        if address is not None:
            self.mark_used(address)
        return address
