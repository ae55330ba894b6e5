"""The per-pool series (`ipam_provider_*`), labelled `backend`, `kind`, `namespace` ("" for a cluster-scoped pool)
and `name`; `ipam_provider_allocation_duration_seconds`, labelled `backend` and `kind` only (14 series a pool would
be most of a scrape at a thousand pools), and the first-seen clock of unfulfilled claims behind it.

Series that carry a `reason` keep only the reasons that apply now (`pool_ready`: the current Ready reason;
`waiting_claims`: `Pending` always, other reasons while claims have them). `forget_pool` removes every series of a
pool, counters and histogram included. Called on the event loop only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping

from prometheus_client import Counter, Gauge, Histogram

from ipam_provider.backend.contract import AddressCounts
from ipam_provider.pool_metrics import POOL_LABELS, PoolLabels, repair

PENDING = "Pending"  # the waiting reason of a claim that has no Ready condition yet

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
_PLAIN = (ALLOCATED, AVAILABLE, ALLOCATIONS, RELEASES)
_REASONED = (ALLOCATION_ERRORS, WAITING, READY)


# The reasons each pool has a series of, per reason-labelled metric, so that they can be removed.
_reasons: dict[tuple[PoolLabels, Gauge | Counter], set[str]] = {}


def _with_reason(metric: Gauge | Counter, pool: PoolLabels, reason: str) -> None:
    _reasons.setdefault((pool, metric), set()).add(reason)


def _drop_reasons(metric: Gauge | Counter, pool: PoolLabels, keep: set[str]) -> None:
    known = _reasons.get((pool, metric), set())
    for reason in known - keep:
        _remove(metric, *pool.values(), reason)
    known &= keep


def _remove(metric: Gauge | Counter | Histogram, *values: str) -> None:
    """Remove one labelled series; one that was never created is not an error (older prometheus-client releases
    raise KeyError for it)."""
    with contextlib.suppress(KeyError):
        metric.remove(*values)


def record_counts(pool: PoolLabels, counts: AddressCounts) -> None:
    ALLOCATED.labels(*pool.values()).set(counts.used)
    AVAILABLE.labels(*pool.values()).set(counts.free)


def record_ready(pool: PoolLabels, ready: bool, reason: str) -> None:
    """The pool's one `pool_ready` series, under its current reason. Its allocation and release counters and its
    kind's duration histogram start at 0 here, so that a rate over them is defined before the first allocation."""
    for plain in (ALLOCATIONS, RELEASES):
        plain.labels(*pool.values())
    ALLOCATION_SECONDS.labels(pool.backend, pool.kind)
    _drop_reasons(READY, pool, {reason})
    READY.labels(*pool.values(), reason).set(1 if ready else 0)
    _with_reason(READY, pool, reason)


def record_waiting(pool: PoolLabels, by_reason: Mapping[str, int]) -> None:
    """The claims waiting for an address, by reason; `Pending` is always there (0 when no claim waits)."""
    counts = {PENDING: 0, **{reason: count for reason, count in by_reason.items() if count > 0}}
    _drop_reasons(WAITING, pool, set(counts))
    for reason, count in counts.items():
        WAITING.labels(*pool.values(), reason).set(count)
        _with_reason(WAITING, pool, reason)


def count_allocation(pool: PoolLabels, seconds: float | None) -> None:
    """An IPAddress was written; `seconds` since the claim was first seen unfulfilled, when known."""
    ALLOCATIONS.labels(*pool.values()).inc()
    if seconds is not None:
        ALLOCATION_SECONDS.labels(pool.backend, pool.kind).observe(seconds)


def count_allocation_error(pool: PoolLabels, reason: str) -> None:
    ALLOCATION_ERRORS.labels(*pool.values(), reason).inc()
    _with_reason(ALLOCATION_ERRORS, pool, reason)


def count_release(pool: PoolLabels) -> None:
    RELEASES.labels(*pool.values()).inc()


def forget_pool(pool: PoolLabels) -> None:
    """Remove every series of the pool (it is gone), the repair loop's (`telemetry.repair`) included; its kind's
    duration histogram stays."""
    repair.forget_pool(pool)
    for plain in _PLAIN:
        _remove(plain, *pool.values())
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
