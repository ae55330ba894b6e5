"""Prometheus metrics of the controller (served on --metrics-bind-address)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("ipam_provider_reconcile_total", "Reconciles by kind of key and result.", ["key_kind", "result"])
RECONCILE_SECONDS = Histogram(
    "ipam_provider_reconcile_duration_seconds",
    "Time spent in one reconcile.",
    ["key_kind"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ALLOCATIONS = Counter("ipam_provider_allocations_total", "IPAddresses created, by pool kind.", ["pool_kind"])
RELEASES = Counter("ipam_provider_releases_total", "Claims released, by pool kind.", ["pool_kind"])
ALLOCATION_FAILURES = Counter(
    "ipam_provider_allocation_failures_total", "Failed allocations, by pool kind and reason.", ["pool_kind", "reason"]
)
QUEUE_DEPTH = Gauge("ipam_provider_workqueue_depth", "Keys waiting in the work queue.")


def observe_reconcile(key_kind: str, result: str, seconds: float, depth: int) -> None:
    RECONCILES.labels(key_kind, result).inc()
    RECONCILE_SECONDS.labels(key_kind).observe(seconds)
    QUEUE_DEPTH.set(depth)
