"""The pieces of the allocation strategies: rank/select over intervals, Random's exact choice in a dense zone, the
band and pinned addresses in an IPv6 /64 pool, and the policy built from a pool's spec."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from backends.incluster.allocatable import AllocatableSet, build_allocatable_set
from backends.incluster.index import PoolIndex
from backends.incluster.intervals import IntervalSet, PoolAllocator, address_to_int
from backends.incluster.policy import AllocationPolicy, AllocationStrategy, Region, Zone
from backends.incluster.spec import InClusterPoolSpec, allocation_policy
from tests.support.properties import examples

points = st.sets(st.integers(min_value=0, max_value=80), min_size=1, max_size=40)


@settings(max_examples=examples(300), deadline=None)
@given(members=points)
def test_rank_and_select_match_the_sorted_members(members: set[int]) -> None:
    region = Region(IntervalSet.from_points(members))
    ordered = sorted(members)
    assert region.size == len(ordered)
    for rank, value in enumerate(ordered):
        assert region.select(rank) == value
        assert region.rank(value) == rank
    for value in range(-1, 83):
        assert region.rank(value) == sum(1 for member in ordered if member < value)


@settings(max_examples=examples(300), deadline=None)
@given(
    start=st.sets(st.integers(0, 200), max_size=60),
    changes=st.lists(st.tuples(st.booleans(), st.integers(0, 200)), max_size=80),
)
def test_the_exact_random_choice_follows_the_zone_s_changes(start: set[int], changes: list[tuple[bool, int]]) -> None:
    zone, model = Zone(Region(IntervalSet([(0, 200)])), IntervalSet.from_points(start), track_points=True), set(start)
    for add, value in changes:
        if add and value not in model:
            zone.used_now(value)
            model.add(value)
        elif not add and value in model:
            zone.freed_now(value, 0)
            model.discard(value)
    free = [value for value in range(201) if value not in model]
    assert zone.free == len(free)
    assert [zone._kth_free(k) for k in range(len(free))] == free


@settings(max_examples=examples(300), deadline=None)
@given(members=points, data=st.data())
def test_the_exact_random_choice_is_the_kth_free_address(members: set[int], data: st.DataObject) -> None:
    used = data.draw(st.sets(st.sampled_from(sorted(members))))
    allocator = PoolAllocator(IntervalSet.from_points(members), used)
    zone = Zone(Region(IntervalSet.from_points(members)), allocator.used_set(), track_points=True)
    free = sorted(members - used)
    assert zone.free == len(free)
    assert [zone._kth_free(k) for k in range(len(free))] == free


def test_random_finds_the_only_free_address_of_a_nearly_full_pool() -> None:
    pool = IntervalSet([(1, 500)])
    index = PoolIndex.build(AllocatableSet(pool, 4), [], AllocationPolicy(AllocationStrategy.RANDOM))
    for value in range(1, 501):
        if value != 377:
            assert index.take_specific(value, f"claim-{value}")
    # Uniform draws almost always hit used addresses here: the exact rank/select answers.
    assert index.take_candidate("last") == 377
    assert index.take_candidate("none") is None


def test_a_64_pool_with_band_and_pinned_addresses() -> None:
    allocatable = build_allocatable_set(["fd00:1::/64"], 64, "fd00:1::1").addresses
    low = allocatable.first()
    assert low is not None
    pinned = frozenset({low + 300, low + 301})
    lowest_above_band = [value for value in range(low + 256, low + 400) if value not in pinned][:50]
    for strategy in AllocationStrategy:
        index = PoolIndex.build(
            AllocatableSet(allocatable, 6), [], AllocationPolicy(strategy, True, pinned), rng=random.Random(7)
        )
        taken = [index.take_candidate("claim") for _ in range(50)]
        if strategy is AllocationStrategy.RANDOM:
            assert all(value is not None and value >= low + 256 and value not in pinned for value in taken)
            assert len(set(taken)) == 50
        else:
            assert taken == lowest_above_band, "the band holds the 256 lowest addresses; pinned ones are skipped"
        assert index.take_specific(low, "requested"), "a band address may be requested"
        assert not index.take_specific(low, "again")
        assert index.take_specific(low + 300, "pre-allocated")


def test_the_policy_comes_from_the_spec_and_pins_only_valid_pre_allocations() -> None:
    spec = InClusterPoolSpec.model_validate(
        {
            "addresses": ["10.0.0.0/24"],
            "prefix": 24,
            "gateway": "10.0.0.1",
            "allocationStrategy": "LeastRecentlyReleased",
            "reserveStaticBand": True,
            "preAllocations": {"a": "10.0.0.7", "gw": "10.0.0.1", "bad": "x", "v6": "fd00::1", "out": "10.1.0.1"},
        }
    )
    allocatable = build_allocatable_set(spec.addresses, spec.prefix, spec.gateway)
    policy = allocation_policy(spec, allocatable)
    assert policy == AllocationPolicy(
        AllocationStrategy.LEAST_RECENTLY_RELEASED, True, frozenset({address_to_int("10.0.0.7")})
    )
    default = InClusterPoolSpec.model_validate({"addresses": ["10.0.0.0/24"], "prefix": 24})
    assert allocation_policy(default, allocatable) == AllocationPolicy()
