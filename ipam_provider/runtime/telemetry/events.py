"""`ipam_provider_events_total`: the Kubernetes Events the controller recorded, by type and by what became of
them (see `ipam_provider/runtime/events/`)."""

from __future__ import annotations

from prometheus_client import Counter

EVENTS = Counter(
    "ipam_provider_events_total",
    "Kubernetes Events recorded, by type (Normal, Warning) and outcome: created (an Event of its own), patched "
    "(a repeat counted on its Event), combined (counted into the combined Event of its object), dropped (the "
    "buffer was full).",
    ["type", "outcome"],
)


def count_event(type: str, outcome: str) -> None:
    EVENTS.labels(type, outcome).inc()
