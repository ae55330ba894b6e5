"""Which in-cluster pools overlap (the survey of the cached pools and the AddressesOverlap condition), and the
bookkeeping of uniqueness domains (expired releases, addresses held by the domain's other pools)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.backend import GLOBAL_IN_CLUSTER_POOL, IN_CLUSTER_POOL, InClusterBackend
from backends.incluster.domains import (
    NAMED_IN_MESSAGE,
    Coverage,
    Overlap,
    PoolSurvey,
    held_elsewhere,
    overlap_condition,
)
from backends.incluster.index import PoolIndex
from backends.incluster.intervals import IntervalSet, address_to_int
from backends.incluster.naming import pool_hash
from backends.incluster.policy import AllocationPolicy, AllocationStrategy
from backends.incluster.reservations import Reservation
from ipam_provider.backend.contract import BackendContext, PoolKind, PoolRef
from ipam_provider.common import Object
from tests.support.properties import examples

A = IN_CLUSTER_POOL.ref("ns", "a")
LRR = AllocationStrategy.LEAST_RECENTLY_RELEASED


def pool(name: str, addresses: list[str], prefix: int = 24, namespace: str | None = "ns", **spec: Any) -> Object:
    meta: Object = {"name": name, "uid": f"uid-{name}", "generation": 1}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, "spec": {"addresses": addresses, "prefix": prefix, **spec}}


def survey(namespaced: list[Object], global_: list[Object] | None) -> tuple[PoolSurvey, list[int]]:
    """A survey that has observed the given pools, as the pool watch shows them (None: the global pool cache has
    not synced), and its parse count."""
    backend = InClusterBackend(BackendContext(kube=object()))  # type: ignore[arg-type]  # no request is made
    parses: list[int] = []

    def cached(kind: PoolKind) -> list[Object] | None:
        return namespaced if kind == IN_CLUSTER_POOL else global_

    def parse(obj: Object) -> Any:
        parses.append(1)
        return backend.survey.parse(obj)

    found = PoolSurvey([IN_CLUSTER_POOL, GLOBAL_IN_CLUSTER_POOL], cached, parse)
    for kind, objects in ((IN_CLUSTER_POOL, namespaced), (GLOBAL_IN_CLUSTER_POOL, global_ or [])):
        for obj in objects:
            found.observe(kind, None, obj)
    return found, parses


def allocatable_of(obj: Object) -> Any:
    backend = InClusterBackend(BackendContext(kube=object()))  # type: ignore[arg-type]
    parsed = backend.survey.parse(obj)
    assert parsed is not None
    return parsed[0]


def test_overlaps_across_kinds_and_namespaces_with_count_and_first_address() -> None:
    mine = pool("a", ["10.0.0.0/24"])
    others = [
        mine,
        pool("b", ["10.0.0.100-10.0.0.109"], namespace="elsewhere"),
        pool("disjoint", ["10.0.1.0/24"]),
        pool("v6", ["fd00::/120"], 120),
        pool("invalid", ["10.0.0.0/24", "10.9.0.1"]),  # two subnets: invalid, hands out nothing
    ]
    found, parses = survey(others, [pool("g", ["10.0.0.250-10.0.0.255"], namespace=None, uniquenessDomain="d")])
    overlaps = found.overlaps(A, allocatable_of(mine), "d")
    assert overlaps == [
        Overlap(GLOBAL_IN_CLUSTER_POOL.ref(None, "g"), 5, "10.0.0.250", same_domain=True),
        Overlap(IN_CLUSTER_POOL.ref("elsewhere", "b"), 10, "10.0.0.100", same_domain=False),
    ], "the broadcast address .255 is not allocatable; a pool never overlaps itself"
    count = len(parses)
    found.overlaps(A, allocatable_of(mine), "d")
    assert len(parses) == count, "each pool is parsed once per uid and generation"


def test_no_answer_before_the_pool_caches_synced() -> None:
    found, _ = survey([pool("a", ["10.0.0.0/24"])], None)
    assert found.overlaps(A, allocatable_of(pool("a", ["10.0.0.0/24"])), None) is None


def test_the_condition_warns_of_pools_outside_the_domain_only() -> None:
    g = GLOBAL_IN_CLUSTER_POOL.ref(None, "g")
    b = IN_CLUSTER_POOL.ref("ns", "b")
    none = overlap_condition([], None, "ns")
    assert (none.type, none.status, none.reason, none.warning) == ("AddressesOverlap", False, "NoOverlap", False)
    safe = overlap_condition([Overlap(g, 1, "10.0.0.1", True)], "d", "ns")
    assert (safe.status, safe.reason, safe.warning) == (True, "OverlapWithinUniquenessDomain", False)
    assert "GlobalInClusterIPPool/g (1 address, first 10.0.0.1)" in safe.message and "domain d" in safe.message
    both = overlap_condition([Overlap(b, 3, "10.0.0.7", False), Overlap(g, 1, "10.0.0.1", True)], "d", "ns")
    assert (both.status, both.reason, both.warning) == (True, "PoolsOverlap", True)
    assert both.message.startswith("shares addresses with InClusterIPPool/ns/b (3 addresses, first 10.0.0.7): two")
    many = [Overlap(IN_CLUSTER_POOL.ref("ns", f"p{i}"), 1, "10.0.0.1", False) for i in range(NAMED_IN_MESSAGE + 2)]
    assert "and 2 more pools" in overlap_condition(many, None, "ns").message


def test_the_condition_names_no_pool_of_another_namespace() -> None:
    """A tenant's pool spanning much of the address space sees, of other namespaces' pools, only how many overlap:
    not their names, ranges or first shared addresses. Its own namespace's and the cluster-scoped pools are named."""
    g = GLOBAL_IN_CLUSTER_POOL.ref(None, "g")
    own = IN_CLUSTER_POOL.ref("team-a", "mine")
    victims = [Overlap(IN_CLUSTER_POOL.ref(f"victim-{i}", "secret"), 3, f"10.0.{i}.7", False) for i in range(2)]
    found = [Overlap(g, 1, "10.0.9.1", False), Overlap(own, 2, "10.0.8.1", False), *victims]
    condition = overlap_condition(found, None, "team-a")
    assert (condition.reason, condition.warning) == ("PoolsOverlap", True)
    assert "GlobalInClusterIPPool/g (1 address, first 10.0.9.1)" in condition.message
    assert "InClusterIPPool/team-a/mine (2 addresses, first 10.0.8.1) and 2 pools of other namespaces" in (
        condition.message
    )
    assert "victim" not in condition.message and "secret" not in condition.message
    assert "10.0.0.7" not in condition.message and "10.0.1.7" not in condition.message
    # Within a shared uniqueness domain too; a cluster-scoped pool's condition names only cluster-scoped pools.
    domain = overlap_condition([Overlap(victims[0].pool, 3, "10.0.0.7", True)], "d", "team-a")
    assert "1 pool of other namespaces of uniqueness domain d" in domain.message and "victim" not in domain.message
    assert "victim" not in overlap_condition(victims, None, None).message


def released(name: str, pool: str, ago: float, grace: int | None) -> Reservation:
    at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=ago)
    ref = IN_CLUSTER_POOL.ref("ns", pool)
    return Reservation(
        name, "10.0.0.1", 24, None, "", "ns/c", at.strftime("%Y-%m-%dT%H:%M:%SZ"), "1", name, "", pool_hash(ref), grace
    )


def test_releases_expire_by_their_own_pools_grace_period() -> None:
    def at(value: int, name: str, pool: str, age: int, grace: int | None) -> Reservation:
        return dataclasses.replace(released(name, pool, age, grace), address=f"10.0.0.{value}")

    reservations = [
        at(1, "own-old", "a", 100, None),
        at(2, "own-new", "a", 5, None),
        at(3, "other-old", "b", 100, 60),
        at(4, "other-new", "b", 5, 60),
        at(5, "other-unknown", "b", 10_000, None),
    ]
    allocatable = IntervalSet([(address_to_int("10.0.0.1"), address_to_int("10.0.0.6"))])

    def expired(grace: int, policy: AllocationPolicy = AllocationPolicy()) -> list[str]:  # noqa: B008 - frozen
        index = PoolIndex.build(AllocatableSet(allocatable, 4), reservations, policy, own_label=pool_hash(A))
        return sorted(r.name for r in index.expired_releases(grace))

    assert expired(30) == ["other-old", "own-old"]
    assert expired(0) == ["other-old", "own-new", "own-old"]
    # Under LeastRecentlyReleased the pool's own records are its reuse order: never deleted for expiry.
    assert expired(30, AllocationPolicy(LRR)) == ["other-old"]


def test_an_index_takes_over_only_its_own_pools_release_records() -> None:
    """In a uniqueness domain, a pool's index holds the release records of the domain's other pools: never a
    candidate nor taken by value (another pool's record stays that pool's), deleted by their recorded grace only."""

    def at(address: str, name: str, pool: str, grace: int | None) -> Reservation:
        return dataclasses.replace(released(name, pool, 100, grace), address=address)

    records = [at("10.0.0.1", "own", "a", None), at("10.0.0.2", "b-kept", "b", None), at("10.0.0.3", "b-60", "b", 60)]
    policy = AllocationPolicy(LRR)
    allocatable = IntervalSet([(address_to_int("10.0.0.1"), address_to_int("10.0.0.3"))])
    index = PoolIndex.build(AllocatableSet(allocatable, 4), records, policy, own_label=pool_hash(A))
    assert not index.take_specific(address_to_int("10.0.0.2"), "x"), "another pool's record is held"
    assert [r.name for r in index.expired_releases(0)] == ["b-60"], "own kept under LRR; b's by its grace"
    assert index.take_candidate("y") == address_to_int("10.0.0.1") and index.released[address_to_int("10.0.0.1")]
    assert index.take_candidate("z") is None, "b's records are never candidates"


def test_held_elsewhere_counts_distinct_addresses_of_the_pool_held_by_others() -> None:
    allocatable = IntervalSet([(address_to_int("10.0.0.1"), address_to_int("10.0.0.10"))])

    def ip(address: str) -> Object:
        return {"spec": {"address": address}}

    others = [[ip("10.0.0.2"), ip("10.0.0.3"), ip("10.0.0.50")], None, [ip("10.0.0.3"), ip("10.0.0.4"), ip("fd00::1")]]
    held = held_elsewhere(allocatable, 4, ["10.0.0.4"], others)
    assert held == {address_to_int("10.0.0.2"), address_to_int("10.0.0.3")}, ".4 is the pool's own, .50 outside"


SPANS = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8)), min_size=1, max_size=3)
STEPS = st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), SPANS)), max_size=40)


@settings(max_examples=examples(300), deadline=None)
@given(STEPS)
def test_the_survey_answers_as_looking_at_every_pool_would(
    steps: list[tuple[int, list[tuple[int, int]] | None]],
) -> None:
    """Pools come, change their addresses and go (None); after each change the survey's answers equal a brute force
    over every pool: which pools the change concerns (those meeting it before or after), and which overlap each
    pool, with how many addresses and the first."""
    found, _ = survey([], [])
    objects: dict[str, Object] = {}
    for generation, (number, spans) in enumerate(steps, start=1):
        name = f"p{number}"
        old = objects.get(name)
        new = None
        if spans is not None:
            entries = [f"10.0.0.{start}-10.0.0.{start + length}" for start, length in spans]
            new = pool(name, entries, prefix=24)
            new["metadata"]["generation"] = generation
        concerned = found.observe(IN_CLUSTER_POOL, old, new)
        expected = {other for other, obj in objects.items() if other != name and _meet(obj, old, new)}
        assert {ref.name for ref in concerned} == expected
        if new is None:
            objects.pop(name, None)
        else:
            objects[name] = new
        for mine, obj in objects.items():
            wanted = []
            for other, theirs in sorted(objects.items()):
                shared = _addresses(obj) & _addresses(theirs)
                if other != mine and shared:
                    wanted.append((other, len(shared), f"10.0.0.{min(shared) - address_to_int('10.0.0.0')}"))
            got = found.overlaps(IN_CLUSTER_POOL.ref("ns", mine), allocatable_of(obj), None)
            assert got is not None and [(o.pool.name, o.count, o.first) for o in got] == wanted


def _addresses(obj: Object) -> set[int]:
    return {value for first, last in allocatable_of(obj).addresses for value in range(first, last + 1)}


def _meet(obj: Object, *changed: Object | None) -> bool:
    return any(other is not None and _addresses(obj) & _addresses(other) for other in changed)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.one_of(st.none(), SPANS)), max_size=30))
def test_the_coverage_keeps_two_boundaries_per_interval_at_most(steps: list[tuple[int, Any]]) -> None:
    """Pools added and removed: `covering` matches a brute force, and the map keeps no boundary it does not need
    (none once every pool is gone)."""
    coverage = Coverage()
    held: dict[PoolRef, IntervalSet] = {}
    for number, spans in steps:
        ref = IN_CLUSTER_POOL.ref("ns", f"p{number}")
        if ref in held:
            coverage.remove(ref, held.pop(ref))
        if spans is not None:
            held[ref] = IntervalSet((start, start + length) for start, length in spans)
            coverage.add(ref, held[ref])
        for probe in range(0, 70, 3):
            expected = {r for r, intervals in held.items() if probe in intervals}
            assert coverage.covering(IntervalSet([(probe, probe)])) == expected
        assert len(coverage) <= 2 * sum(intervals.interval_count for intervals in held.values())
    for ref, intervals in held.items():
        coverage.remove(ref, intervals)
    assert len(coverage) == 0
