"""The IPAM domain's Prometheus series (docs/metrics.md lists them):

- `pools`: the per-pool series (`ipam_provider_*`: counts, readiness, waiting claims, allocations and releases);
- `repair`: the repair loop's `ipam_provider_repair_*` series (passes, suspected leaks, releases, restores,
  duplicates, addresses outside their pool).
"""

from __future__ import annotations

from dataclasses import dataclass

import ipam_provider.runtime.telemetry  # noqa: F401  (no *_created series)
from ipam_provider.backend.contract import PoolRef

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
