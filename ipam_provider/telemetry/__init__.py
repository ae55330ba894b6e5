"""The Prometheus series of the controller, by subject (see docs/metrics.md for the list):

- `pools`: the per-pool series (`ipam_provider_*`: counts, readiness, waiting claims, allocations and releases);
- `controller`: the work queue's `workqueue_*` and the reconcilers' `controller_runtime_*` series;
- `clients`: the API client's `rest_client_*` series and `leader_election_master_status`;
- `backends`: `observe_request`, with which a backend counts its requests to an external system;
- `events`: `ipam_provider_events_total`, the Kubernetes Events recorded and what became of them;
- `repair`: the repair loop's `ipam_provider_repair_*` series (passes, suspected leaks, releases, restores,
  duplicates, addresses outside their pool).

Every series lives in prometheus-client's default registry, served by the metrics endpoint. Counters are exposed
without prometheus-client's `*_created` companions, as Go's client exposes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import disable_created_metrics

from ipam_provider.backend.contract import PoolRef

disable_created_metrics()  # type: ignore[no-untyped-call]

POOL_LABELS = ["backend", "kind", "namespace", "name"]  # the labels of every per-pool series (`pools`, `repair`)


@dataclass(frozen=True)
class PoolLabels:
    """The label values of one pool's series."""

    backend: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, backend: str, ref: PoolRef) -> PoolLabels:
        return cls(backend, ref.kind, ref.namespace or "", ref.name)

    def values(self) -> tuple[str, str, str, str]:
        return self.backend, self.kind, self.namespace, self.name
