"""The Event correlator's decisions, on an injected clock: dedup, aggregation, write interval, bounds."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ipam_provider.runtime.events.correlator import (
    COMBINED,
    COMBINED_PREFIX,
    CREATED,
    DROPPED,
    PATCHED,
    EventCorrelator,
    Series,
)
from ipam_provider.runtime.kube.bounds import EVENT_MESSAGE_LENGTH
from ipam_provider.runtime.kube.resources import SUBDOMAIN_LENGTH, subdomain_problem

Object = dict[str, Any]


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> str:
        return f"t{self.now:.0f}"


def pool(name: str = "net", namespace: str | None = "ns") -> Object:
    meta: Object = {"name": name, "uid": f"uid-{name}", "resourceVersion": "7"}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool", "metadata": meta}


def claim(name: str, namespace: str = "ns") -> Object:
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "3"}
    return {"apiVersion": "ipam.cluster.x-k8s.io/v1beta1", "kind": "IPAddressClaim", "metadata": meta}


def correlator(clock: Clock, **options: Any) -> EventCorrelator:
    return EventCorrelator("test", clock=clock, wall=clock.wall, **options)


def allocate(events: EventCorrelator, index: int, related: Object | None) -> str:
    return events.observe(claim(f"m{index}"), "Normal", "AddressAllocated", f"10.0.0.{index}/24 allocated", related)


def test_a_burst_on_one_pool_is_ten_events_then_one_combined_event_on_the_pool() -> None:
    clock = Clock()
    events = correlator(clock)
    outcomes = Counter(allocate(events, i, pool()) for i in range(300))
    assert outcomes == {CREATED: 10, COMBINED: 290}
    written = events.due()
    assert len(written) == 11 and events.pending == 0
    individual, combined = written[:10], written[10]
    assert [s.body["involvedObject"]["name"] for s in individual] == [f"m{i}" for i in range(10)]
    assert all(s.body["related"]["uid"] == "uid-net" and s.count == 1 for s in individual)
    assert individual[0].message == "10.0.0.0/24 allocated"
    assert combined.body["involvedObject"]["kind"] == "InClusterIPPool"
    assert combined.body["involvedObject"]["uid"] == "uid-net" and "related" not in combined.body
    assert combined.namespace == "ns" and combined.name.startswith("net.")
    assert combined.count == 290
    assert combined.message == COMBINED_PREFIX + "10.0.0.299/24 allocated"
    assert combined.creation()["count"] == 290 and combined.creation()["type"] == "Normal"


def test_a_repeat_within_the_window_counts_on_its_event_and_a_late_one_makes_a_new_event() -> None:
    clock = Clock()
    events = correlator(clock)
    obj = pool()
    assert events.observe(obj, "Warning", "PoolInvalid", "addresses must not be empty") == CREATED
    (first,) = events.due()
    clock.now += 599
    assert events.observe(obj, "Warning", "PoolInvalid", "addresses must not be empty") == PATCHED
    clock.now += 599  # within the window of the previous occurrence
    assert events.observe(obj, "Warning", "PoolInvalid", "addresses must not be empty") == PATCHED
    (again,) = events.due()
    assert again is first and first.count == 3 and first.last_timestamp == "t2198"
    assert first.update() == {"count": 3, "message": "addresses must not be empty", "lastTimestamp": "t2198"}
    clock.now += 601
    assert events.observe(obj, "Warning", "PoolInvalid", "addresses must not be empty") == CREATED
    (late,) = events.due()
    assert late is not first and late.count == 1 and late.name != first.name


def test_a_different_message_type_reason_or_object_is_a_different_event() -> None:
    events = correlator(Clock())
    obj = pool()
    outcomes = [
        events.observe(obj, "Warning", "PoolInvalid", "one"),
        events.observe(obj, "Warning", "PoolInvalid", "two"),
        events.observe(obj, "Normal", "PoolInvalid", "one"),
        events.observe(obj, "Warning", "Deleting", "one"),
        events.observe(pool("other"), "Warning", "PoolInvalid", "one"),
    ]
    assert outcomes == [CREATED] * 5 and len(events.due()) == 5


def test_similar_events_are_counted_per_type_reason_and_related_object() -> None:
    events = correlator(Clock(), individual=2)
    for i in range(3):
        allocate(events, i, pool("a"))
    assert allocate(events, 3, pool("b")) == CREATED, "another pool is another aggregate"
    other_reason = events.observe(claim("m9"), "Warning", "PoolExhausted", "full", pool("a"))
    assert other_reason == CREATED
    assert allocate(events, 4, pool("a")) == COMBINED


def test_without_a_related_object_similar_events_combine_on_the_involved_object() -> None:
    events = correlator(Clock(), individual=2)
    obj = pool()
    outcomes = [events.observe(obj, "Warning", "Unreachable", f"attempt {i}") for i in range(5)]
    assert outcomes == [CREATED, CREATED, COMBINED, COMBINED, COMBINED]
    combined = events.due()[-1]
    assert combined.body["involvedObject"]["uid"] == "uid-net" and combined.count == 3
    assert combined.message == COMBINED_PREFIX + "attempt 4"


def test_the_aggregation_window_counts_from_its_first_event() -> None:
    clock = Clock()
    events = correlator(clock, individual=2)
    assert [allocate(events, i, pool()) for i in range(3)] == [CREATED, CREATED, COMBINED]
    clock.now += 600
    assert allocate(events, 3, pool()) == COMBINED, "still the window of the first"
    clock.now += 1
    assert [allocate(events, i, pool()) for i in range(4, 7)] == [CREATED, CREATED, COMBINED]
    combined = events.due()[-1]
    assert combined.count == 1, "a new window has a new combined Event"


def test_an_event_is_taken_for_writing_at_most_once_per_interval_unless_forced() -> None:
    clock = Clock()
    events = correlator(clock, individual=1)
    allocate(events, 0, pool())
    allocate(events, 1, pool())
    assert len(events.due()) == 2 and events.next_due() is None
    allocate(events, 2, pool())
    assert events.due() == [] and events.next_due() == 1.0
    clock.now += 0.5
    allocate(events, 3, pool())
    assert events.due() == [] and events.pending == 1 and events.next_due() == 0.5
    (forced,) = events.due(force=True)
    assert forced.count == 3
    allocate(events, 4, pool())
    clock.now += 0.75
    assert events.due() == []
    clock.now += 0.25
    (due,) = events.due()
    assert due is forced and due.count == 4


def test_a_full_buffer_counts_new_events_into_their_combined_event_then_drops() -> None:
    events = correlator(Clock(), capacity=2)
    assert allocate(events, 0, pool("a")) == CREATED
    assert allocate(events, 1, pool("b")) == CREATED
    assert allocate(events, 2, pool("a")) == COMBINED, "no room for an Event of its own"
    assert allocate(events, 3, pool("a")) == COMBINED, "its combined Event already waits"
    assert allocate(events, 4, pool("c")) == COMBINED
    assert events.pending == 4
    assert allocate(events, 5, pool("d")) == DROPPED
    assert allocate(events, 6, pool("a")) == COMBINED, "an Event that waits takes more counts"
    written = events.due()
    assert [s.count for s in written] == [1, 1, 3, 1]
    assert allocate(events, 7, pool("d")) == CREATED, "room again once written"


def test_a_repeat_of_a_written_event_waits_while_the_buffer_has_room_for_updates() -> None:
    events = correlator(Clock(), capacity=1)
    obj = pool()
    events.observe(obj, "Warning", "PoolInvalid", "bad")
    events.due()
    assert allocate(events, 0, pool("a")) == CREATED
    assert events.observe(obj, "Warning", "PoolInvalid", "bad") == PATCHED
    assert events.observe(pool("x"), "Warning", "PoolInvalid", "bad") == DROPPED


def test_the_caches_keep_only_the_most_recently_used_entries() -> None:
    events = correlator(Clock(), cache_entries=2, individual=1)
    obj = pool()
    events.observe(obj, "Warning", "PoolInvalid", "bad")
    events.observe(pool("b"), "Warning", "PoolInvalid", "bad")
    assert events.observe(obj, "Warning", "PoolInvalid", "bad") == PATCHED, "used again: kept"
    events.observe(pool("c"), "Warning", "PoolInvalid", "bad")
    events.observe(pool("d"), "Warning", "PoolInvalid", "bad")
    assert events.observe(obj, "Warning", "PoolInvalid", "bad") == CREATED, "forgotten: a new Event"
    assert allocate(events, 0, pool("p")) == CREATED
    assert allocate(events, 1, pool("p")) == COMBINED
    assert allocate(events, 5, pool("q")) == CREATED
    assert allocate(events, 6, pool("r")) == CREATED
    assert allocate(events, 2, pool("p")) == CREATED, "the aggregate was forgotten: a new window"


def test_messages_are_cut_to_the_api_limit_and_cluster_scoped_objects_go_to_default() -> None:
    events = correlator(Clock(), individual=1)
    global_pool = pool("g", namespace=None)
    long = "é" * 5000  # two bytes each: the limit counts bytes
    events.observe(global_pool, "Warning", "PoolInvalid", "a" + long + "; do this")
    events.observe(global_pool, "Warning", "PoolInvalid", "b" + long + "; do this")
    single, combined = events.due()
    assert isinstance(single, Series)
    for message in (single.message, combined.message):
        assert EVENT_MESSAGE_LENGTH - 60 < len(message.encode()) <= EVENT_MESSAGE_LENGTH
        assert message.endswith("; do this"), "the end, where a message says what to do, is kept"
    assert combined.message.startswith(COMBINED_PREFIX)
    assert single.namespace == combined.namespace == "default"
    assert single.body["involvedObject"]["namespace"] is None


def test_an_event_on_an_object_whose_name_takes_all_253_characters_has_a_valid_name() -> None:
    events = correlator(Clock())
    longest = pool("a" * 200 + "." + "b" * 34 + "-" + "c" * 17, namespace="ns")  # the cut falls after the "-"
    assert len(longest["metadata"]["name"]) == SUBDOMAIN_LENGTH
    events.observe(longest, "Warning", "PoolInvalid", "bad")
    (series,) = events.due()
    assert subdomain_problem(series.name) is None and len(series.name) <= SUBDOMAIN_LENGTH
    assert series.name.startswith("a" * 200 + "." + "b" * 34 + ".")
    events.observe(pool("x", namespace="ns"), "Warning", "PoolInvalid", "bad")
    (short,) = events.due()
    assert re.fullmatch(r"x\.[0-9a-f]{16}", short.name)


def test_forgetting_an_object_drops_its_entries_and_a_repeat_then_makes_a_new_event() -> None:
    clock = Clock()
    events = correlator(clock, cache_entries=3)
    assert events.observe(claim("a"), "Normal", "AddressAllocated", "one", pool()) == CREATED
    assert events.observe(claim("b"), "Normal", "AddressAllocated", "two", pool()) == CREATED
    events.due()
    events.forget("IPAddressClaim", "ns", "a")
    assert len(events._series) == 1  # b's stays; the pool's aggregate (a and b were related to it) too
    assert events.observe(claim("a"), "Normal", "AddressAllocated", "one", pool()) == CREATED
    events.forget("InClusterIPPool", "ns", "net")
    assert len(events._aggregates) == 0
    for index in range(5):  # evictions leave no group behind
        events.observe(claim(f"c{index}"), "Normal", "Reason", "x")
    assert len(events._series) == 3 and len(events._series._groups) == 3
