"""The Event recorder against the in-memory API server: record returns at once, flush and the background writer
write, repeats patch, a deleted Event is created again, nothing raises into the caller."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog
from prometheus_client import REGISTRY

from ipam_provider.runtime.events import NORMAL, WARNING, EventRecorder
from ipam_provider.runtime.events.correlator import COMBINED_PREFIX, EventCorrelator
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.fake_kube import FakeKube

Object = dict[str, Any]
NS = "ns"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pool(name: str = "net") -> Object:
    meta = {"name": name, "namespace": NS, "uid": f"uid-{name}"}
    return {"apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool", "metadata": meta}


def claim(name: str) -> Object:
    meta = {"name": name, "namespace": NS, "uid": f"uid-{name}"}
    return {"apiVersion": "ipam.cluster.x-k8s.io/v1beta1", "kind": "IPAddressClaim", "metadata": meta}


def stored(kube: FakeKube) -> list[Object]:
    return kube.stored_all(EVENTS, NS)


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run the writer until `condition` holds (the fake API server answers without suspending, so a
    few turns of the loop are enough); fail if it never does."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the writer did not get there")


async def turns(count: int = 20) -> None:
    """Let the loop turn `count` times: enough for a woken writer to look at what waits and go back to sleep."""
    for _ in range(count):
        await asyncio.sleep(0)


async def test_record_returns_at_once_and_flush_writes() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube, "test")
    recorder.record(claim("m1"), NORMAL, "AddressAllocated", "10.0.0.2/24 allocated", related=pool())
    assert kube.requests == [], "nothing is written while the caller runs"
    await recorder.flush()
    (event,) = stored(kube)
    assert event["involvedObject"]["name"] == "m1" and event["related"]["name"] == "net"
    assert (event["type"], event["reason"], event["count"]) == (NORMAL, "AddressAllocated", 1)
    assert event["source"] == {"component": "test"} and event["metadata"]["name"].startswith("m1.")
    await recorder.flush()
    assert len(kube.writes()) == 1, "a flush with nothing recorded writes nothing"


async def test_a_repeat_patches_its_event_and_a_deleted_event_is_created_again() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube, "test")
    for _ in range(2):
        recorder.record(pool(), WARNING, "PoolInvalid", "addresses must not be empty")
    await recorder.flush()
    (event,) = stored(kube)
    assert event["count"] == 2 and [r.verb for r in kube.writes()] == ["create"], "two before a write: one POST"
    recorder.record(pool(), WARNING, "PoolInvalid", "addresses must not be empty")
    await recorder.flush()
    (event,) = stored(kube)
    assert event["count"] == 3 and [r.verb for r in kube.writes()] == ["create", "patch"]
    await kube.delete(EVENTS, event["metadata"]["name"], NS)
    recorder.record(pool(), WARNING, "PoolInvalid", "addresses must not be empty")
    await recorder.flush()
    (again,) = stored(kube)
    assert again["metadata"]["name"] == event["metadata"]["name"] and again["count"] == 4
    assert [r.verb for r in kube.writes()][-2:] == ["patch", "create"], "the PATCH found nothing: created afresh"


async def test_record_never_raises_and_logs_what_it_could_not_record() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube, "test")
    with structlog.testing.capture_logs() as records:
        recorder.record({"metadata": "not an object"}, WARNING, "Broken", "no metadata")
    await recorder.flush()
    assert stored(kube) == []
    assert [(r["event"], r["log_level"], r["reason"]) for r in records] == [("event not recorded", "warning", "Broken")]


async def test_the_background_writer_writes_without_flush_and_patches_once_per_interval() -> None:
    kube = FakeKube()
    clock = Clock()
    recorder = EventRecorder(kube, "test", EventCorrelator("test", clock=clock, individual=1))
    recorder.start()
    try:
        recorder.record(claim("m0"), NORMAL, "AddressAllocated", "a0", related=pool())
        recorder.record(claim("m1"), NORMAL, "AddressAllocated", "a1", related=pool())
        await until(lambda: len(stored(kube)) == 2)
        recorder.record(claim("m2"), NORMAL, "AddressAllocated", "a2", related=pool())
        await turns()
        assert [r.verb for r in kube.writes()] == ["create", "create"], "written less than a second ago"
        clock.now += 1.0
        recorder.record(claim("m3"), NORMAL, "AddressAllocated", "a3", related=pool())
        await until(lambda: len(kube.writes()) == 3)
        combined = next(e for e in stored(kube) if e["involvedObject"]["kind"] == "InClusterIPPool")
        assert combined["count"] == 3 and combined["message"] == COMBINED_PREFIX + "a3"
        assert kube.writes()[-1].verb == "patch"
    finally:
        await recorder.close()
    assert recorder.correlator.pending == 0


async def test_close_writes_what_was_recorded_and_stops_the_writer() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube, "test")
    recorder.start()
    writer = recorder._task
    assert writer is not None and not writer.done()
    for index in range(3):
        recorder.record(claim(f"m{index}"), NORMAL, "AddressAllocated", f"a{index}", related=pool())
    await recorder.close()
    assert len(stored(kube)) == 3 and writer.done()
    recorder.record(claim("late"), NORMAL, "AddressAllocated", "late", related=pool())
    await turns()
    assert len(stored(kube)) == 3, "no writer after close: the Event waits for a flush"
    await recorder.flush()
    assert len(stored(kube)) == 4


async def test_what_became_of_each_event_is_counted() -> None:
    def counted(outcome: str) -> float:
        labels = {"type": NORMAL, "outcome": outcome}
        return REGISTRY.get_sample_value("ipam_provider_events_total", labels) or 0.0

    before = {outcome: counted(outcome) for outcome in ("created", "patched", "combined", "dropped")}
    recorder = EventRecorder(FakeKube(), "test", EventCorrelator("test", capacity=6))
    for index in range(12):
        recorder.record(claim(f"m{index}"), NORMAL, "AddressAllocated", f"a{index}", related=pool())
    recorder.record(claim("m0"), NORMAL, "AddressAllocated", "a0", related=pool())
    for index in range(6):
        recorder.record(claim(f"other{index}"), NORMAL, "AddressAllocated", "a", related=pool(f"p{index}"))
    after = {outcome: counted(outcome) - before[outcome] for outcome in before}
    assert after == {"created": 6, "patched": 1, "combined": 11, "dropped": 1}
    await recorder.flush()
