"""The runtime's Prometheus series (docs/metrics.md lists them):

- `controller`: the work queue's `workqueue_*` and the reconcilers' `controller_runtime_*` series;
- `clients`: the API client's `rest_client_*` series, `leader_election_master_status`, and
  `ipam_provider_events_total`, the Kubernetes Events recorded and what became of them.

Every series lives in prometheus-client's default registry, served by the metrics endpoint. Counters are exposed
without prometheus-client's `*_created` companions, as Go's client exposes them.
"""

from prometheus_client import disable_created_metrics

disable_created_metrics()  # type: ignore[no-untyped-call]
