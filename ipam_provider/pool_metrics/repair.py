"""The repair loop's series (`ipam_provider_repair_*`, see `ipam_provider/repair`).

Per backend: passes by result and their duration. Per pool (labels as in `telemetry/pools.py`): the suspected
leaks and duplicates and the IPAddresses outside the pool found by the last pass (gauges), and the addresses the
loop released and restored (counters, apart from the claims' own `ipam_provider_release_total`). `forget_pool`
removes a pool's series; `telemetry.pools.forget_pool` calls it, so that a pool that is gone loses them all.
Called on the event loop only.
"""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

from ipam_provider.pool_metrics import POOL_LABELS, PoolLabels

OK = "ok"  # every pool of the backend was compared
BACKEND_ERROR = "backend_error"  # the backend could not be used for one pool or more: they wait for the next pass
ERROR = "error"  # the pass failed (the API server could not be read, or an unexpected error): logged

PASSES = Counter(
    "ipam_provider_repair_passes_total",
    "Repair passes per backend, by result (ok, backend_error: pools skipped until the next pass, error).",
    ["backend", "result"],
)
PASS_SECONDS = Histogram(
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
RELEASES = Counter(
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
_PER_POOL = (SUSPECTED_LEAKS, RELEASES, RESTORED, DUPLICATES, OUTSIDE_POOL)


def count_pass(backend: str, result: str, seconds: float) -> None:
    PASSES.labels(backend, result).inc()
    PASS_SECONDS.labels(backend).observe(seconds)


# What `record_pool` last set per pool, so that a pass that finds what the last one did sets nothing.
_recorded: dict[PoolLabels, tuple[int, int, int]] = {}


def record_pool(pool: PoolLabels, *, suspected: int, duplicates: int, outside: int) -> None:
    """The pool's gauges after a pass; its counters start at 0 here, so that a rate over them is defined."""
    if _recorded.get(pool) == (suspected, duplicates, outside):
        return
    _recorded[pool] = (suspected, duplicates, outside)
    SUSPECTED_LEAKS.labels(*pool.values()).set(suspected)
    DUPLICATES.labels(*pool.values()).set(duplicates)
    OUTSIDE_POOL.labels(*pool.values()).set(outside)
    RELEASES.labels(*pool.values())
    RESTORED.labels(*pool.values())


def count_release(pool: PoolLabels) -> None:
    RELEASES.labels(*pool.values()).inc()


def count_restored(pool: PoolLabels) -> None:
    RESTORED.labels(*pool.values()).inc()


def forget_pool(pool: PoolLabels) -> None:
    """Remove every repair series of the pool (it is gone)."""
    _recorded.pop(pool, None)
    for metric in _PER_POOL:
        with contextlib.suppress(KeyError):
            metric.remove(*pool.values())
