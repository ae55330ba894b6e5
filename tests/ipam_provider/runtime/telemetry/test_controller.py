"""The work queue's `workqueue_*` series and the worker's `controller_runtime_*` series, read from prometheus-client's
default registry. Each test uses its own queue name or pool kind, so that counters of other tests do not mix in."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from prometheus_client import REGISTRY

from ipam_provider.backend.contract import PoolRef
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.controller import Controller, ControllerSettings, controller_name
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.telemetry import controller as telemetry
from ipam_provider.runtime.workqueue import WorkQueue
from ipam_provider.watch import ClaimKey, PoolKey, QueueKey


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def queue_sample(name: str, queue: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"controller": queue, "name": queue})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The clock of the work queue's metrics, moved by the test."""
    fake = Clock()
    monkeypatch.setattr(telemetry, "monotonic", fake)
    return fake


async def test_a_key_in_process_shows_its_age_until_done(clock: Clock) -> None:
    queue: WorkQueue[str] = WorkQueue(name="q-age")
    queue.add("a", "shard-a")
    queue.add("b", "shard-b")
    queue.add("a", "shard-a")  # already waiting: not another add
    assert queue_sample("workqueue_depth", "q-age") == 2
    assert queue_sample("workqueue_adds_total", "q-age") == 2
    clock.now += 3
    first = await queue.get()
    assert first == ("a", "shard-a")
    assert queue_sample("workqueue_depth", "q-age") == 1
    assert queue_sample("workqueue_queue_duration_seconds_count", "q-age") == 1
    assert queue_sample("workqueue_queue_duration_seconds_sum", "q-age") == 3
    clock.now += 40  # a worker that hangs: the gauges keep growing without any call into the queue
    assert queue_sample("workqueue_unfinished_work_seconds", "q-age") == 40
    assert queue_sample("workqueue_longest_running_processor_seconds", "q-age") == 40
    second = await queue.get()
    assert second == ("b", "shard-b")
    clock.now += 10
    assert queue_sample("workqueue_unfinished_work_seconds", "q-age") == 50 + 10
    assert queue_sample("workqueue_longest_running_processor_seconds", "q-age") == 50
    queue.done("a", "shard-a")
    queue.done("b", "shard-b")
    assert queue_sample("workqueue_unfinished_work_seconds", "q-age") == 0
    assert queue_sample("workqueue_longest_running_processor_seconds", "q-age") == 0
    assert queue_sample("workqueue_work_duration_seconds_count", "q-age") == 2
    assert queue_sample("workqueue_work_duration_seconds_sum", "q-age") == 50 + 10
    assert queue_sample("workqueue_depth", "q-age") == 0


async def test_retries_and_a_key_added_while_in_process_are_counted_once(clock: Clock) -> None:
    queue: WorkQueue[str] = WorkQueue(name="q-retry", base_delay=0.0)
    queue.add("a", "s")
    assert await queue.get() == ("a", "s")
    queue.add("a", "s")  # while in process: runs again afterwards, pending now
    queue.add("a", "s")
    assert queue_sample("workqueue_adds_total", "q-retry") == 2
    assert queue_sample("workqueue_depth", "q-retry") == 1
    queue.done("a", "s")
    assert queue_sample("workqueue_adds_total", "q-retry") == 2, "the re-add when done is the same pending add"
    assert await queue.get() == ("a", "s")
    queue.add_rate_limited("a", "s")
    queue.add_rate_limited("a", "s")
    assert queue_sample("workqueue_retries_total", "q-retry") == 2
    queue.done("a", "s")
    queue.shutdown()
    assert queue_sample("workqueue_depth", "q-retry") == 0


async def test_an_unnamed_queue_reports_nothing() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a", "s")
    assert await queue.get() == ("a", "s")
    queue.done("a", "s")
    assert queue_sample("workqueue_adds_total", "") is None
    assert queue_sample("workqueue_depth", "") is None


def test_controller_names_follow_controller_runtime() -> None:
    assert controller_name(ClaimKey("ns", "c")) == "ipaddressclaim"
    assert controller_name(PoolKey(PoolRef("g", "InClusterIPPool", "ns", "p"))) == "inclusterippool"
    assert telemetry.reconcile_result(None) == "success"
    assert telemetry.reconcile_result(0.0) == "requeue"
    assert telemetry.reconcile_result(5.0) == "requeue_after"


async def test_the_worker_counts_reconciles_by_result() -> None:
    kind = "MetricsWorkerPool"
    controller = kind.lower()
    ctl = Controller(cast(KubeClient, object()), BackendRegistry([]), ControllerSettings(workers=1))
    outcomes: dict[str, float | Exception | None] = {"ok": None, "again": 0.0, "later": 30.0, "bad": ValueError("x")}
    seen: list[str] = []
    busy = asyncio.Event()
    go_on = asyncio.Event()
    enough = asyncio.Event()  # every result seen; the failing and requeued keys at least twice

    async def dispatch(key: QueueKey) -> float | None:
        assert isinstance(key, PoolKey)
        await asyncio.sleep(0)  # a reconcile awaits something: the test gets its turn
        name = key.ref.name
        seen.append(name)
        if "ok" in seen and "slow" in seen and seen.count("again") >= 2 and seen.count("bad") >= 2:
            enough.set()
        if name == "slow":
            busy.set()
            await go_on.wait()
            return None
        outcome = outcomes[name]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    ctl._dispatch = dispatch  # type: ignore[method-assign]
    for name in [*outcomes, "slow"]:
        ref = PoolRef("g", kind, "ns", name)
        ctl.queue.add(PoolKey(ref), ref)
    worker = asyncio.create_task(ctl._worker())
    await asyncio.wait_for(busy.wait(), 5)
    assert sample("controller_runtime_active_workers", controller=controller) == 1
    go_on.set()
    await asyncio.wait_for(enough.wait(), 10)
    ctl.queue.shutdown()
    await asyncio.wait_for(worker, 5)
    assert sample("controller_runtime_reconcile_total", controller=controller, result="success") == 2  # ok, slow
    assert sample("controller_runtime_reconcile_total", controller=controller, result="requeue") >= 2
    assert sample("controller_runtime_reconcile_total", controller=controller, result="requeue_after") == 1
    assert sample("controller_runtime_reconcile_total", controller=controller, result="error") >= 2
    assert sample("controller_runtime_reconcile_errors_total", controller=controller) >= 2
    assert sample("controller_runtime_reconcile_time_seconds_count", controller=controller) == sum(
        sample("controller_runtime_reconcile_total", controller=controller, result=r)
        for r in ("success", "requeue", "requeue_after", "error")
    )
    assert sample("controller_runtime_active_workers", controller=controller) == 0


def test_declared_controllers_show_every_reconcile_series_at_zero() -> None:
    def present(name: str, **labels: str) -> float | None:  # None when the series does not exist
        return REGISTRY.get_sample_value(name, labels)

    assert present("controller_runtime_reconcile_errors_total", controller="declaredkind") is None
    telemetry.set_max_concurrent_reconciles(["declaredkind"], 3)
    assert sample("controller_runtime_max_concurrent_reconciles", controller="declaredkind") == 3
    assert present("controller_runtime_active_workers", controller="declaredkind") == 0
    assert present("controller_runtime_reconcile_errors_total", controller="declaredkind") == 0
    assert present("controller_runtime_reconcile_time_seconds_count", controller="declaredkind") == 0
    for result in ("success", "error", "requeue", "requeue_after"):
        assert present("controller_runtime_reconcile_total", controller="declaredkind", result=result) == 0
