"""Requests to external systems (NetBox, Infoblox WAPI, a plugin's system): `observe_request` counts one request
by outcome and times it.

Outcomes: `success` (an answer below 400), `error` (an HTTP error answer), `unreachable` (no answer: connect
error, timeout, TLS failure). `operation` must be a low-cardinality name such as `GET ipam/prefixes` or
`POST record:host`: an object type and a method, never an id, a reference or a query value.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Histogram

SUCCESS, ERROR, UNREACHABLE = "success", "error", "unreachable"

REQUESTS = Counter(
    "ipam_provider_backend_requests_total",
    "HTTP requests to a backend's external system, by operation and outcome (success, error, unreachable).",
    ["backend", "operation", "outcome"],
)
REQUEST_SECONDS = Histogram(
    "ipam_provider_backend_request_duration_seconds",
    "Time from sending a request to a backend's external system until its answer (or failure).",
    ["backend", "operation"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


class RequestObservation:
    """What the code inside `observe_request` tells about its request: the HTTP status, once answered."""

    def __init__(self) -> None:
        self.status: int | None = None

    def answered(self, status: int) -> None:
        self.status = status


@contextmanager
def observe_request(backend: str, operation: str) -> Iterator[RequestObservation]:
    """Count and time the one request sent inside the block. Call `answered(status)` on the observation when an
    answer arrives; a block that raises before that counts as `unreachable`, one that ends without it as
    `success`. Thread-safe: backends call it from their worker threads."""
    observation = RequestObservation()
    started = time.perf_counter()
    failed = True
    try:
        yield observation
        failed = False
    finally:
        if observation.status is not None:
            outcome = SUCCESS if observation.status < 400 else ERROR
        else:
            outcome = UNREACHABLE if failed else SUCCESS
        REQUESTS.labels(backend, operation, outcome).inc()
        REQUEST_SECONDS.labels(backend, operation).observe(time.perf_counter() - started)
