"""The work queue's `workqueue_*` series and the reconcilers' `controller_runtime_*` series, under client-go's and
controller-runtime's names and labels so that existing Cluster API dashboards show them.

Work queue: `QueueMetrics` is told of every key added, taken and done. Depth, unfinished work and the longest
running processor are computed when Prometheus collects them (from the keys waiting and the start times of the
keys in process), so they never go stale, not even while a worker hangs.

Reconcilers: `controller` is the lower-case kind of the key's object.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Hashable, Iterable, Iterator
from time import monotonic

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

QUEUE_LABELS = ["controller", "name"]
_QUEUE_BUCKETS = (1e-5, 1e-4, 1e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

QUEUE_ADDS = Counter("workqueue_adds_total", "Keys added to the work queue.", QUEUE_LABELS)
QUEUE_RETRIES = Counter("workqueue_retries_total", "Keys re-added to the work queue after a failure.", QUEUE_LABELS)
QUEUE_SECONDS = Histogram(
    "workqueue_queue_duration_seconds",
    "Time a key waits in the work queue before a worker takes it.",
    QUEUE_LABELS,
    buckets=_QUEUE_BUCKETS,
)
WORK_SECONDS = Histogram(
    "workqueue_work_duration_seconds",
    "Time a worker spends on one key.",
    QUEUE_LABELS,
    buckets=_QUEUE_BUCKETS,
)

RECONCILES = Counter(
    "controller_runtime_reconcile_total",
    "Reconciles by result: success, error, requeue (again at once) or requeue_after (again after a delay).",
    ["controller", "result"],
)
RECONCILE_ERRORS = Counter("controller_runtime_reconcile_errors_total", "Reconciles that failed.", ["controller"])
RECONCILE_SECONDS = Histogram(
    "controller_runtime_reconcile_time_seconds",
    "Time spent in one reconcile.",
    ["controller"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
ACTIVE_WORKERS = Gauge("controller_runtime_active_workers", "Workers reconciling now.", ["controller"])
MAX_CONCURRENT = Gauge(
    "controller_runtime_max_concurrent_reconciles",
    "Workers that may reconcile at once (the workers are shared by every controller).",
    ["controller"],
)

SUCCESS, ERROR, REQUEUE, REQUEUE_AFTER = "success", "error", "requeue", "requeue_after"


class QueueMetrics:
    """The series of one named work queue. The queue calls `added` when a key becomes pending (again), `taken`
    when a worker takes it, `done` when the worker finishes, `retried` for a re-add after a failure and `cleared`
    at shutdown. Called on the event loop; read by the collector from the metrics server's thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._added: dict[Hashable, float] = {}  # pending keys → when they became pending
        self._started: dict[Hashable, float] = {}  # keys in process → when their worker took them
        self._adds = QUEUE_ADDS.labels(name, name)
        self._retries = QUEUE_RETRIES.labels(name, name)
        self._queue_seconds = QUEUE_SECONDS.labels(name, name)
        self._work_seconds = WORK_SECONDS.labels(name, name)
        with _QUEUES_LOCK:
            _QUEUES.add(self)

    def added(self, key: Hashable) -> None:
        """A key became pending; a key still pending since an earlier add is not counted again."""
        with self._lock:
            if key in self._added:
                return
            self._added[key] = monotonic()
        self._adds.inc()

    def taken(self, key: Hashable) -> None:
        now = monotonic()
        with self._lock:
            added = self._added.pop(key, None)
            self._started[key] = now
        if added is not None:
            self._queue_seconds.observe(now - added)

    def done(self, key: Hashable) -> None:
        with self._lock:
            started = self._started.pop(key, None)
        if started is not None:
            self._work_seconds.observe(monotonic() - started)

    def retried(self) -> None:
        self._retries.inc()

    def cleared(self) -> None:
        """The queue dropped every pending key (shutdown)."""
        with self._lock:
            self._added.clear()

    def snapshot(self) -> tuple[int, list[float]]:
        """(keys pending, start times of the keys in process)."""
        with self._lock:
            return len(self._added), list(self._started.values())


class SilentQueueMetrics(QueueMetrics):
    """The metrics of an unnamed queue: none."""

    def __init__(self) -> None:
        self.name = ""

    def added(self, key: Hashable) -> None:
        pass

    def taken(self, key: Hashable) -> None:
        pass

    def done(self, key: Hashable) -> None:
        pass

    def retried(self) -> None:
        pass

    def cleared(self) -> None:
        pass


def queue_metrics(name: str | None) -> QueueMetrics:
    """The metrics of a queue called `name`; an unnamed queue has none."""
    return QueueMetrics(name) if name else SilentQueueMetrics()


_QUEUES: weakref.WeakSet[QueueMetrics] = weakref.WeakSet()
_QUEUES_LOCK = threading.Lock()


class _QueueCollector(Collector):
    """workqueue_depth, workqueue_unfinished_work_seconds and workqueue_longest_running_processor_seconds, computed
    at collection time. Queues of one name (several controllers in one process, as in tests) add up."""

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return list(_families())

    def collect(self) -> Iterable[GaugeMetricFamily]:
        now = monotonic()
        totals: dict[str, tuple[int, float, float]] = {}
        with _QUEUES_LOCK:
            queues = list(_QUEUES)
        for queue in queues:
            depth, starts = queue.snapshot()
            ages = [max(0.0, now - start) for start in starts]
            before = totals.get(queue.name, (0, 0.0, 0.0))
            totals[queue.name] = (before[0] + depth, before[1] + sum(ages), max([before[2], *ages]))
        depth_family, unfinished_family, longest_family = _families()
        for name, (depth, unfinished, longest) in sorted(totals.items()):
            depth_family.add_metric([name, name], depth)
            unfinished_family.add_metric([name, name], unfinished)
            longest_family.add_metric([name, name], longest)
        return [depth_family, unfinished_family, longest_family]


def _families() -> Iterator[GaugeMetricFamily]:
    yield GaugeMetricFamily("workqueue_depth", "Keys waiting in the work queue.", labels=QUEUE_LABELS)
    yield GaugeMetricFamily(
        "workqueue_unfinished_work_seconds",
        "Seconds of work in progress not yet observed by workqueue_work_duration_seconds (the sum of the ages of "
        "the keys in process); a large value means stuck workers.",
        labels=QUEUE_LABELS,
    )
    yield GaugeMetricFamily(
        "workqueue_longest_running_processor_seconds",
        "Seconds the longest running worker has been working on its key.",
        labels=QUEUE_LABELS,
    )


REGISTRY.register(_QueueCollector())


def set_max_concurrent_reconciles(controllers: Iterable[str], workers: int) -> None:
    """Declare the controllers: their worker limit, and every reconcile series at 0 (as controller-runtime does at
    start), so that rates and error ratios are defined before the first reconcile or error."""
    for controller in controllers:
        MAX_CONCURRENT.labels(controller).set(workers)
        ACTIVE_WORKERS.labels(controller)
        RECONCILE_ERRORS.labels(controller)
        RECONCILE_SECONDS.labels(controller)
        for result in (SUCCESS, ERROR, REQUEUE, REQUEUE_AFTER):
            RECONCILES.labels(controller, result)


def reconcile_started(controller: str) -> float:
    """Count a worker as active; returns the start time to pass to `reconcile_finished`."""
    ACTIVE_WORKERS.labels(controller).inc()
    return time.perf_counter()


def reconcile_finished(controller: str, started: float, result: str | None) -> None:
    """The worker is idle again; count the reconcile by `result` (None: not counted, it was cut off)."""
    ACTIVE_WORKERS.labels(controller).dec()
    if result is None:
        return
    RECONCILES.labels(controller, result).inc()
    RECONCILE_SECONDS.labels(controller).observe(time.perf_counter() - started)
    if result == ERROR:
        RECONCILE_ERRORS.labels(controller).inc()


def reconcile_result(requeue: float | None) -> str:
    """The result of a reconcile that returned `requeue` (seconds until it is looked at again, or None)."""
    if requeue is None:
        return SUCCESS
    return REQUEUE_AFTER if requeue > 0 else REQUEUE
