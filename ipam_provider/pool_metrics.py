"""The IPAM domain's Prometheus series (docs/metrics.md lists them), called on the event loop only: per pool
(`backend`, `kind`, `namespace` ("" when cluster-scoped), `name`) the `ipam_provider_*` and `ipam_provider_repair_*`
series; per backend and kind the allocation duration; per backend the repair passes. Series with a `reason` keep only
the reasons that apply now; `forget_pool` removes every series of a pool that is gone.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

from prometheus_client import Counter, Gauge, Histogram

import ipam_provider.runtime.telemetry  # noqa: F401  (no *_created series)
from ipam_provider.backend.contract import PoolRef

POOL_LABELS = ["backend", "kind", "namespace", "name"]
PENDING = "Pending"  # the waiting reason of a claim that has no Ready condition yet
PASS_OK = "ok"  # every pool of the backend was compared
PASS_BACKEND_ERROR = "backend_error"  # the backend could not be used for one pool or more: they wait for the next pass
PASS_ERROR = "error"  # the pass failed (the API server could not be read, or an unexpected error): logged


class PoolLabels(NamedTuple):
    """The label values of one pool's series, in the order of POOL_LABELS."""

    backend: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, backend: str, ref: PoolRef) -> PoolLabels:
        return cls(backend, ref.kind, ref.namespace or "", ref.name)


ALLOCATED = Gauge("ipam_provider_allocated_ips", "Addresses in use in the pool (its status's used count).", POOL_LABELS)
AVAILABLE = Gauge("ipam_provider_available_ips", "Addresses free in the pool (its status's free count).", POOL_LABELS)
ALLOCATIONS = Counter("ipam_provider_allocation_total", "IPAddresses written for claims of the pool.", POOL_LABELS)
ALLOCATION_ERRORS = Counter(
    "ipam_provider_allocation_errors_total",
    "Failed allocations, by the claim's Ready reason (PoolExhausted, PoolNotReady, AllocationFailed, ...).",
    [*POOL_LABELS, "reason"],
)
ALLOCATION_SECONDS = Histogram(
    "ipam_provider_allocation_duration_seconds",
    "Time from the controller first seeing a claim without an address to the claim's IPAddress written.",
    ["backend", "kind"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
)
RELEASES = Counter("ipam_provider_release_total", "Claims of the pool released.", POOL_LABELS)
WAITING = Gauge(
    "ipam_provider_waiting_claims",
    "Claims of the pool without an address, by their Ready reason (Pending: none yet).",
    [*POOL_LABELS, "reason"],
)
READY = Gauge(
    "ipam_provider_pool_ready",
    "1 when the pool is Ready, else 0; labelled with the current Ready reason.",
    [*POOL_LABELS, "reason"],
)
REPAIR_PASSES = Counter(
    "ipam_provider_repair_passes_total",
    "Repair passes per backend, by result (ok, backend_error: pools skipped until the next pass, error).",
    ["backend", "result"],
)
REPAIR_PASS_SECONDS = Histogram(
    "ipam_provider_repair_pass_duration_seconds",
    "Time one repair pass took for a backend: listing, reading the API server, comparing and repairing.",
    ["backend"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
)
SUSPECTED_LEAKS = Gauge(
    "ipam_provider_repair_suspected_leaks",
    "Backend allocations of the pool that no live IPAddress or claim accounts for, as of the last repair pass.",
    POOL_LABELS,
)
LEAKS_RELEASED = Counter(
    "ipam_provider_repair_releases_total",
    "Leaked backend allocations of the pool released by the repair loop (not counted in release_total).",
    POOL_LABELS,
)
RESTORED = Counter(
    "ipam_provider_repair_restored_total",
    "Addresses of live IPAddresses the backend no longer held, recorded again by the repair loop.",
    POOL_LABELS,
)
DUPLICATES = Gauge(
    "ipam_provider_repair_duplicates",
    "Live IPAddresses of the pool whose address something else holds in the backend, as of the last repair pass.",
    POOL_LABELS,
)
OUTSIDE_POOL = Gauge(
    "ipam_provider_repair_outside_pool",
    "Live IPAddresses naming the pool whose address is not an address of the pool, as of the last repair pass.",
    POOL_LABELS,
)
_PLAIN = (ALLOCATED, AVAILABLE, ALLOCATIONS, RELEASES)
_REASONED = (ALLOCATION_ERRORS, WAITING, READY)
_REPAIR = (SUSPECTED_LEAKS, LEAKS_RELEASED, RESTORED, DUPLICATES, OUTSIDE_POOL)
_reasons: dict[tuple[PoolLabels, Gauge | Counter], set[str]] = {}  # per pool and metric: the reasons it has series of
_findings: dict[PoolLabels, tuple[int, int, int]] = {}  # what `record_repair_findings` last set per pool


def _with_reason(metric: Gauge | Counter, pool: PoolLabels, reason: str) -> None:
    _reasons.setdefault((pool, metric), set()).add(reason)


def _drop_reasons(metric: Gauge | Counter, pool: PoolLabels, keep: set[str]) -> None:
    known = _reasons.get((pool, metric), set())
    for reason in known - keep:
        _remove(metric, *pool, reason)
    known &= keep


def _remove(metric: Gauge | Counter | Histogram, *values: str) -> None:
    """Remove one labelled series; one that was never created is not an error."""
    with contextlib.suppress(KeyError):
        metric.remove(*values)


def record_ready(pool: PoolLabels, ready: bool, reason: str) -> None:
    """The pool's one `pool_ready` series, under its current reason. Its allocation and release counters and its
    kind's duration histogram start at 0 here, so that a rate over them is defined before the first allocation."""
    for plain in (ALLOCATIONS, RELEASES):
        plain.labels(*pool)
    ALLOCATION_SECONDS.labels(pool.backend, pool.kind)
    _drop_reasons(READY, pool, {reason})
    READY.labels(*pool, reason).set(1 if ready else 0)
    _with_reason(READY, pool, reason)


def record_waiting(pool: PoolLabels, by_reason: Mapping[str, int]) -> None:
    """The claims waiting for an address, by reason; `Pending` is always there (0 when no claim waits)."""
    counts = {PENDING: 0, **{reason: count for reason, count in by_reason.items() if count > 0}}
    _drop_reasons(WAITING, pool, set(counts))
    for reason, count in counts.items():
        WAITING.labels(*pool, reason).set(count)
        _with_reason(WAITING, pool, reason)


def count_allocation(pool: PoolLabels, seconds: float | None) -> None:
    """An IPAddress was written; `seconds` since the claim was first seen unfulfilled, when known."""
    ALLOCATIONS.labels(*pool).inc()
    if seconds is not None:
        ALLOCATION_SECONDS.labels(pool.backend, pool.kind).observe(seconds)


def count_allocation_error(pool: PoolLabels, reason: str) -> None:
    ALLOCATION_ERRORS.labels(*pool, reason).inc()
    _with_reason(ALLOCATION_ERRORS, pool, reason)


def record_repair_findings(pool: PoolLabels, *, suspected: int, duplicates: int, outside: int) -> None:
    """The pool's repair gauges after a pass; its repair counters start at 0 here."""
    if _findings.get(pool) == (suspected, duplicates, outside):
        return
    _findings[pool] = (suspected, duplicates, outside)
    SUSPECTED_LEAKS.labels(*pool).set(suspected)
    DUPLICATES.labels(*pool).set(duplicates)
    OUTSIDE_POOL.labels(*pool).set(outside)
    LEAKS_RELEASED.labels(*pool)
    RESTORED.labels(*pool)


def forget_repair_series(pool: PoolLabels) -> None:
    """Remove the pool's repair series (it is no longer repaired)."""
    _findings.pop(pool, None)
    for metric in _REPAIR:
        _remove(metric, *pool)


def forget_pool(pool: PoolLabels) -> None:
    """Remove every series of the pool (it is gone); its kind's duration histogram stays."""
    forget_repair_series(pool)
    for plain in _PLAIN:
        _remove(plain, *pool)
    for reasoned in _REASONED:
        _drop_reasons(reasoned, pool, set())
        _reasons.pop((pool, reasoned), None)


class FirstSeen:
    """When each claim was first seen without an address, by (namespace, name) and uid. An entry goes when the
    claim is fulfilled or gone; past `limit` entries the oldest is dropped (its claim then gets no duration)."""

    def __init__(self, limit: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._seen: dict[tuple[str, str], tuple[str, float]] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, key: tuple[str, str], uid: str) -> None:
        """The claim is unfulfilled now; the first such sighting of this uid counts."""
        known = self._seen.get(key)
        if known is not None and known[0] == uid:
            return
        self._seen.pop(key, None)
        while len(self._seen) >= self.limit:
            del self._seen[next(iter(self._seen))]
        self._seen[key] = (uid, self._clock())

    def fulfilled(self, key: tuple[str, str], uid: str) -> float | None:
        """Seconds since the claim was first seen unfulfilled (None if it was not, or as another uid); forgets it."""
        known = self._seen.pop(key, None)
        if known is None or known[0] != uid:
            return None
        return max(0.0, self._clock() - known[1])

    def forget(self, key: tuple[str, str]) -> None:
        self._seen.pop(key, None)
