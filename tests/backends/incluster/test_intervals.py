"""IntervalSet and PoolAllocator against brute-force models over a small universe, plus scale checks."""

from __future__ import annotations

import time
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from backends.incluster.intervals import (
    IntervalSet,
    PoolAllocator,
    address_to_int,
    int_to_address,
)
from ipam_provider.common import INT64_MAX, cap_int64
from tests.support.properties import examples

UNIVERSE = 200  # model addresses are 0..UNIVERSE

addresses = st.integers(min_value=0, max_value=UNIVERSE)
intervals = st.tuples(addresses, addresses).map(lambda pair: (min(pair), max(pair)))
interval_lists = st.lists(intervals, max_size=8)


def expand(spans: list[tuple[int, int]]) -> set[int]:
    return {value for start, end in spans for value in range(start, end + 1)}


def used_in_range(allocator: PoolAllocator) -> int:
    return allocator.used_set().intersection(allocator.allocatable).size


def used_outside(allocator: PoolAllocator) -> IntervalSet:
    return allocator.used_set().subtract(allocator.allocatable)


def assert_normalized(interval_set: IntervalSet) -> None:
    spans = list(interval_set)
    for start, end in spans:
        assert start <= end
    for (_, previous_end), (next_start, _) in pairwise(spans):
        assert next_start > previous_end + 1, "intervals must be disjoint and non-adjacent"


# ---------------------------------------------------------------------------------------------- IntervalSet


@settings(max_examples=examples(300), deadline=None)
@given(interval_lists)
def test_interval_set_matches_the_set_it_covers(spans: list[tuple[int, int]]) -> None:
    model = expand(spans)
    interval_set = IntervalSet(spans)
    assert_normalized(interval_set)
    assert interval_set.size == len(model)
    assert bool(interval_set) == bool(model)
    assert interval_set.first() == (min(model) if model else None)
    assert interval_set.last() == (max(model) if model else None)
    assert expand(list(interval_set)) == model
    assert interval_set.interval_count == len(list(interval_set))
    for value in range(-1, UNIVERSE + 2):
        assert (value in interval_set) == (value in model)
        index = interval_set.index_of(value)
        if value in model:
            assert index is not None
            start, end = interval_set.interval_at(index)
            assert start <= value <= end
        else:
            assert index is None
    assert interval_set == IntervalSet.from_points(model)
    assert hash(interval_set) == hash(IntervalSet.from_points(model))


@settings(max_examples=examples(300), deadline=None)
@given(interval_lists, interval_lists)
def test_interval_set_operations_match_set_operations(
    left_spans: list[tuple[int, int]], right_spans: list[tuple[int, int]]
) -> None:
    left_model, right_model = expand(left_spans), expand(right_spans)
    left, right = IntervalSet(left_spans), IntervalSet(right_spans)
    for result, expected in [
        (left.subtract(right), left_model - right_model),
        (left.intersection(right), left_model & right_model),
        (IntervalSet([*left, *right]), left_model | right_model),
    ]:
        assert_normalized(result)
        assert expand(list(result)) == expected
        assert result.size == len(expected)
    assert left.intersection(right).size == len(left_model & right_model)
    assert right.intersection(left).size == len(left_model & right_model)
    assert (left == right) == (left_model == right_model)


def test_interval_set_rejects_reversed_interval_and_merges_adjacency() -> None:
    with pytest.raises(ValueError):
        IntervalSet([(5, 4)])
    assert list(IntervalSet([(5, 9), (0, 4), (20, 20), (10, 10)])) == [(0, 10), (20, 20)]
    assert IntervalSet() == IntervalSet([])
    assert IntervalSet().first() is None
    assert "x" not in IntervalSet([(0, 10)])


def test_interval_set_size_beyond_64_bits() -> None:
    whole_ipv6 = IntervalSet([(0, 2**128 - 1)])
    assert whole_ipv6.size == 2**128
    assert cap_int64(whole_ipv6.size) == INT64_MAX
    assert whole_ipv6.subtract(IntervalSet([(0, 0)])).size == 2**128 - 1


# -------------------------------------------------------------------------------------------- PoolAllocator


class AllocatorMachine(RuleBasedStateMachine):
    """Drives a PoolAllocator and a plain-set model with the same operations and compares them."""

    allocator: PoolAllocator
    allocatable: set[int]
    used: set[int]

    @initialize(spans=interval_lists, initially_used=st.sets(addresses, max_size=40))
    def start(self, spans: list[tuple[int, int]], initially_used: set[int]) -> None:
        self.allocatable = expand(spans)
        self.used = set(initially_used)
        self.allocator = PoolAllocator(IntervalSet(spans), initially_used)

    def model_lowest_free(self) -> int | None:
        free = self.allocatable - self.used
        return min(free) if free else None

    @rule()
    def allocate(self) -> None:
        expected = self.model_lowest_free()
        allocated = self.allocator.allocate()
        assert allocated == expected
        if allocated is not None:
            assert allocated in self.allocatable and allocated not in self.used
            self.used.add(allocated)

    @rule(address=addresses)
    def mark_used(self, address: int) -> None:
        assert self.allocator.mark_used(address) == (address not in self.used)
        self.used.add(address)

    @rule(address=addresses)
    def mark_free(self, address: int) -> None:
        assert self.allocator.mark_free(address) == (address in self.used)
        self.used.discard(address)

    @precondition(lambda self: bool(self.used))
    @rule(data=st.data())
    def free_a_used_address(self, data: st.DataObject) -> None:
        address = data.draw(st.sampled_from(sorted(self.used)))
        assert self.allocator.mark_free(address)
        self.used.discard(address)

    @invariant()
    def matches_model(self) -> None:
        allocator = self.allocator
        in_range = len(self.used & self.allocatable)
        assert allocator.lowest_free() == self.model_lowest_free()
        assert allocator.total == len(self.allocatable)
        assert allocator.used_set().size == len(self.used)
        assert used_in_range(allocator) == in_range
        assert used_outside(allocator).size == len(self.used - self.allocatable)
        assert allocator.total - used_in_range(allocator) == len(self.allocatable) - in_range
        for address in range(-1, UNIVERSE + 2):
            assert allocator.is_used(address) == (address in self.used)
        runs = IntervalSet(list(allocator.used_set()))
        assert runs.interval_count == allocator.used_set().interval_count, "stored runs must be merged"
        assert expand(list(runs)) == self.used
        assert expand(list(used_outside(allocator))) == self.used - self.allocatable


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=examples(200), stateful_step_count=40, deadline=None)


def test_allocate_returns_none_when_full_and_reuses_freed_addresses() -> None:
    allocator = PoolAllocator(IntervalSet([(10, 12), (20, 20)]), used=[11, 99])
    assert used_outside(allocator).size == 1
    assert [allocator.allocate() for _ in range(4)] == [10, 12, 20, None]
    assert allocator.total - used_in_range(allocator) == 0
    assert allocator.mark_free(12)
    assert allocator.allocate() == 12
    assert allocator.allocate() is None


def test_sequential_allocation_in_a_slash_48_stays_one_run_and_is_fast() -> None:
    base = address_to_int("fd00:1234:5678::", 6)
    allocatable = IntervalSet([(base + 1, base + 2**80 - 1)])
    started = time.perf_counter()
    allocator = PoolAllocator(allocatable)
    allocated = [allocator.allocate() for _ in range(1000)]
    elapsed = time.perf_counter() - started
    assert allocated == list(range(base + 1, base + 1001))
    assert allocator.used_set().interval_count == 1
    assert allocator.total == 2**80 - 1
    assert cap_int64(allocator.total - used_in_range(allocator)) == INT64_MAX
    assert elapsed < 0.5


def test_fragmented_exclusions_do_not_make_allocation_rescan_full_intervals() -> None:
    allocatable = IntervalSet((2 * index, 2 * index) for index in range(20_000))
    allocator = PoolAllocator(allocatable)
    started = time.perf_counter()
    allocated = [allocator.allocate() for _ in range(20_000)]
    elapsed = time.perf_counter() - started
    assert allocated == [2 * index for index in range(20_000)]
    assert allocator.allocate() is None
    assert elapsed < 10.0  # 0.5 s here idle; quadratic rescanning would take minutes


def test_bulk_construction_counts_in_and_out_of_range() -> None:
    allocator = PoolAllocator(IntervalSet([(0, 9)]), used=[3, 4, 5, 5, 50, 51])
    assert (allocator.used_set().size, used_in_range(allocator), used_outside(allocator).size) == (5, 3, 2)
    assert list(allocator.used_set()) == [(3, 5), (50, 51)]
    assert list(used_outside(allocator)) == [(50, 51)]
    assert allocator.lowest_free() == 0


def test_address_conversions() -> None:
    assert int_to_address(address_to_int("10.0.0.1", 4), 4) == "10.0.0.1"
    assert int_to_address(address_to_int(" FD00::0001 ", 6), 6) == "fd00::1"
    assert address_to_int("10.0.0.1") == 0x0A000001
    with pytest.raises(ValueError):
        address_to_int("10.0.0.1", 6)
    with pytest.raises(ValueError):
        address_to_int("fe80::1%eth0")
    with pytest.raises(ValueError):
        int_to_address(2**32, 4)
    with pytest.raises(ValueError):
        int_to_address(1, 5)
    assert cap_int64(5) == 5
    assert cap_int64(2**64) == 2**63 - 1
