"""The informers' stores with their indexes: claims by referenced pool (`POOL`) and by Cluster (`CLUSTER`), IPAddresses
by referenced pool (`POOL`) and by pool and canonical address (`POOL_ADDRESS`)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from ipam_provider.api.capi import LABEL_CLUSTER_NAME
from ipam_provider.api.pools import KindLookup, referenced_pool
from ipam_provider.backend.contract import PoolKind, PoolRef
from ipam_provider.common import Object, normalized_address
from ipam_provider.runtime.cache.projection import project_address, project_claim, project_cluster, project_pool
from ipam_provider.runtime.cache.store import Store

POOL = "pool"
POOL_ADDRESS = "pool-address"  # IPAddresses by (pool, canonical address)
CLUSTER = "cluster"


@dataclass
class Caches:
    """The stores of claims, IPAddresses, Clusters, and pools per (group, kind)."""

    claims: Store = field(default_factory=lambda: Store(project_claim))
    addresses: Store = field(default_factory=lambda: Store(project_address))
    clusters: Store = field(default_factory=lambda: Store(project_cluster))
    pools: dict[tuple[str, str], Store] = field(default_factory=dict)

    @classmethod
    def indexed(cls, kinds: Sequence[PoolKind], kind_of: KindLookup) -> Caches:
        """Empty stores for `kinds`, with the claim and IPAddress indexes."""
        caches = cls(pools={(kind.group, kind.kind): Store(project_pool) for kind in kinds})
        caches.add_indexes(kind_of)
        return caches

    def add_indexes(self, kind_of: KindLookup) -> None:
        """Index claims by pool and by Cluster, IPAddresses by pool."""

        def by_pool(obj: Object) -> Iterable[Hashable]:
            ref = referenced_pool(obj, kind_of)
            return [ref] if ref is not None else []

        self.claims.add_index(POOL, by_pool)
        self.claims.add_index(CLUSTER, _claim_cluster)
        self.addresses.add_index(POOL, by_pool)

        def by_pool_address(obj: Object) -> Iterable[Hashable]:
            ref = referenced_pool(obj, kind_of)
            address = (obj.get("spec") or {}).get("address")
            return [(ref, normalized_address(str(address)))] if ref is not None and address else []

        self.addresses.add_index(POOL_ADDRESS, by_pool_address)

    def pool(self, ref: PoolRef) -> Object | None:
        store = self.pools.get((ref.group, ref.kind))
        return store.get(ref.namespace, ref.name) if store is not None else None


def _claim_cluster(claim: Object) -> Iterable[Hashable]:
    meta = claim["metadata"]
    name = claim["spec"].get("clusterName") or (meta.get("labels") or {}).get(LABEL_CLUSTER_NAME)
    return [(meta["namespace"], name)] if name else []
