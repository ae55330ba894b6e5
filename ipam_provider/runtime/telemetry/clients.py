"""The API client's series, under client-go's names (`rest_client_*`), and leader election's
`leader_election_master_status`, so that dashboards made for controller-runtime managers show them; and
`ipam_provider_events_total`, the Kubernetes Events recorded and what became of them (runtime/events/)."""

from __future__ import annotations

from urllib.parse import urlsplit

from prometheus_client import Counter, Gauge, Histogram

NO_ANSWER = "<error>"  # the code of a request that got no answer, as client-go labels it

REST_REQUESTS = Counter(
    "rest_client_requests_total",
    "Requests to the API server, by HTTP status code (<error> when none came), method and host.",
    ["code", "host", "method"],
)
REST_REQUEST_SECONDS = Histogram(
    "rest_client_request_duration_seconds",
    "Time from sending a request to the API server until its answer's headers (or failure), by verb and host.",
    ["host", "verb"],
    buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60),
)
EVENTS = Counter(
    "ipam_provider_events_total",
    "Kubernetes Events recorded, by type (Normal, Warning) and outcome: created (an Event of its own), patched "
    "(a repeat counted on its Event), combined (counted into the combined Event of its object), dropped (the "
    "buffer was full).",
    ["type", "outcome"],
)
LEADER = Gauge(
    "leader_election_master_status",
    "1 while this process holds the leader election lease `name`, else 0.",
    ["name"],
)


def host_label(url: str) -> str:
    """The `host` label of an API server URL: its host and port, never a path or userinfo."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{parts.port}" if parts.port else host


# The labelled series of each (code, host, method) and (host, verb), looked up once: `labels()` validates and
# locks on every call, and every API request passes here. These series are never removed.
_COUNTERS: dict[tuple[str, str, str], Counter] = {}
_DURATIONS: dict[tuple[str, str], Histogram] = {}


def observe_rest_request(host: str, method: str, status: int | None, seconds: float) -> None:
    """Count one API request; `status` None when no answer came."""
    code = str(status) if status is not None else NO_ANSWER
    counter = _COUNTERS.get((code, host, method))
    if counter is None:
        counter = _COUNTERS[(code, host, method)] = REST_REQUESTS.labels(code, host, method)
    duration = _DURATIONS.get((host, method))
    if duration is None:
        duration = _DURATIONS[(host, method)] = REST_REQUEST_SECONDS.labels(host, method)
    counter.inc()
    duration.observe(seconds)


def set_leader(name: str, held: bool) -> None:
    LEADER.labels(name).set(1 if held else 0)


def count_event(type: str, outcome: str) -> None:
    EVENTS.labels(type, outcome).inc()
