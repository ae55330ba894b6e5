"""The informers' stores, with the indexes the event handlers and reconcilers look objects up by.

Indexes: claims by the pool they reference (`POOL`) and by their Cluster (`CLUSTER`, (namespace, name)); IPAddresses
by the pool they reference (`POOL`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from ipam_provider.api.capi import LABEL_CLUSTER_NAME
from ipam_provider.api.pools import KindLookup, referenced_pool
from ipam_provider.backend.contract import PoolKind, PoolRef
from ipam_provider.common import Object
from ipam_provider.watch.store import Store

POOL = "pool"
CLUSTER = "cluster"


@dataclass
class Caches:
    """The stores of claims, IPAddresses, Clusters, and pools per (group, kind)."""

    claims: Store = field(default_factory=Store)
    addresses: Store = field(default_factory=Store)
    clusters: Store = field(default_factory=Store)
    pools: dict[tuple[str, str], Store] = field(default_factory=dict)

    @classmethod
    def indexed(cls, kinds: Sequence[PoolKind], kind_of: KindLookup) -> Caches:
        """Empty stores for `kinds`, with the claim and IPAddress indexes."""
        caches = cls(pools={(kind.group, kind.kind): Store() for kind in kinds})

        def by_pool(obj: Object) -> Iterable[Hashable]:
            ref = referenced_pool(obj, kind_of)
            return [ref] if ref is not None else []

        caches.claims.add_index(POOL, by_pool)
        caches.claims.add_index(CLUSTER, _claim_cluster)
        caches.addresses.add_index(POOL, by_pool)
        return caches

    def pool(self, ref: PoolRef) -> Object | None:
        store = self.pools.get((ref.group, ref.kind))
        return store.get(ref.namespace, ref.name) if store is not None else None


def _claim_cluster(claim: Object) -> Iterable[Hashable]:
    meta = claim["metadata"]
    name = claim["spec"].get("clusterName") or (meta.get("labels") or {}).get(LABEL_CLUSTER_NAME)
    return [(meta["namespace"], name)] if name else []
