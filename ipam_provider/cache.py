"""The controller's caches: a store of claims, IPAddresses, Clusters and each pool kind, what each keeps of an object
(its projection), their indexes, the patch that keeps them read-your-writes, and the views backends and admission
read. They are made before the backends; the controller adds the pool stores and indexes (`Caches.serve`)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from ipam_provider.api.capi import LABEL_CLUSTER_NAME, KindLookup, referenced_pool
from ipam_provider.backend.contract import PoolKind, PoolRef
from ipam_provider.common import Object, normalized_address
from ipam_provider.endpoint import ANNOTATION_POOL_NAME, CONDITION
from ipam_provider.runtime.cache.projection import projected, shared, strip_bookkeeping
from ipam_provider.runtime.cache.store import Store
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource

POOL = "pool"  # claims and IPAddresses by the pool they name
POOL_ADDRESS = "pool-address"  # IPAddresses by (pool, canonical address)
CLUSTER = "cluster"  # claims by their Cluster


def project_claim(obj: Object) -> Object:
    """An IPAddressClaim or IPAddress as the caches keep it: KEPT_METADATA, spec and status, strings shared."""
    return projected(obj, "spec", "status")


def project_cluster(obj: Object) -> Object:
    """A Cluster as the caches keep it: KEPT_METADATA and `spec.paused`; for a Cluster that asks for a control-plane
    endpoint also `spec.controlPlaneEndpoint`, the topology's variables and the endpoint condition."""
    kept = projected(obj)
    spec = obj.get("spec") or {}
    kept["spec"] = {"paused": spec["paused"]} if "paused" in spec else {}  # a bool: nothing to share
    if ANNOTATION_POOL_NAME in (kept["metadata"].get("annotations") or {}):
        kept["spec"].update(shared({k: spec[k] for k in ("controlPlaneEndpoint", "topology") if k in spec}))
        topology = kept["spec"].get("topology")
        if isinstance(topology, dict):
            kept["spec"]["topology"] = {"variables": topology.get("variables") or []}
        conditions = (obj.get("status") or {}).get("conditions")
        ours = (
            [c for c in conditions if isinstance(c, dict) and c.get("type") == CONDITION]
            if isinstance(conditions, list)
            else []
        )
        kept["status"] = {"conditions": ours}
    return kept


def project_pool(obj: Object) -> Object:
    """A pool as the caches keep it: the whole object less the bookkeeping, strings shared."""
    kept: Object = shared(strip_bookkeeping(obj))
    return kept


@dataclass
class Caches:
    """The stores of claims, IPAddresses, Clusters, and pools per (group, kind)."""

    claims: Store = field(default_factory=lambda: Store(project_claim))
    addresses: Store = field(default_factory=lambda: Store(project_claim))
    clusters: Store = field(default_factory=lambda: Store(project_cluster))
    pools: dict[tuple[str, str], Store] = field(default_factory=dict)
    namespaces: Sequence[str] = ()

    def serve(self, kinds: Sequence[PoolKind], kind_of: KindLookup, namespaces: Sequence[str] = ()) -> None:
        """Add a store for each of `kinds` and the claim and IPAddress indexes, which resolve a `poolRef` through
        `kind_of`; the informers watch `namespaces` (none: all)."""
        self.namespaces = namespaces
        self.pools.update({(kind.group, kind.kind): Store(project_pool) for kind in kinds})

        def by_pool(obj: Object) -> Iterable[Hashable]:
            ref = referenced_pool(obj, kind_of)
            return [ref] if ref is not None else []

        def by_pool_address(obj: Object) -> Iterable[Hashable]:
            ref = referenced_pool(obj, kind_of)
            address = (obj.get("spec") or {}).get("address")
            return [(ref, normalized_address(str(address)))] if ref is not None and address else []

        self.claims.add_index(POOL, by_pool)
        self.claims.add_index(CLUSTER, _claim_cluster)
        self.addresses.add_index(POOL, by_pool)
        self.addresses.add_index(POOL_ADDRESS, by_pool_address)

    def pool(self, ref: PoolRef) -> Object | None:
        store = self.pools.get((ref.group, ref.kind))
        return store.get(ref.namespace, ref.name) if store is not None else None

    def cached_addresses(self, ref: PoolRef) -> list[Object] | None:
        """The cached IPAddresses naming the pool (`BackendContext.cached_addresses`); None unless the IPAddress
        cache has synced and watches every namespace the pool's IPAddresses may be in."""
        watched = not self.namespaces or ref.namespace in self.namespaces
        return self.addresses.by_index(POOL, ref) if watched and self.addresses.synced else None

    def cached_pools(self, kind: PoolKind) -> list[Object] | None:
        """The cached pools of `kind` (`BackendContext.cached_pools`); None until every pool cache has synced."""
        store = self.pools.get((kind.group, kind.kind))
        return store.items() if store is not None and self._pools_synced() else None

    def admission_synced(self) -> bool:
        """Whether the caches admission reads (IPAddresses, pools) have synced."""
        return self.addresses.synced and self._pools_synced()

    def _pools_synced(self) -> bool:
        return all(store.synced for store in self.pools.values())


def _claim_cluster(claim: Object) -> Iterable[Hashable]:
    meta = claim["metadata"]
    name = claim["spec"].get("clusterName") or (meta.get("labels") or {}).get(LABEL_CLUSTER_NAME)
    return [(meta["namespace"], name)] if name else []


async def patch_cached(
    kube: KubeClient, store: Store, resource: Resource, obj: Object, patch: Object, *, subresource: str | None = None
) -> Object:
    """Merge-patch `obj` guarded by its resourceVersion and cache the answer in `store` (read-your-writes); on a
    conflict, the object is read again into the cache before the error propagates, so that the retry works from it."""
    meta = obj["metadata"]
    name, namespace = meta["name"], meta.get("namespace")
    body = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": meta["resourceVersion"]}}
    try:
        updated = await kube.patch(resource, name, body, namespace, subresource=subresource)
    except ApiError as error:
        if error.conflict or error.not_found:
            fresh = await kube.get(resource, name, namespace)
            if fresh is not None:
                store.upsert(resource.typed(fresh))
        raise
    resource.typed(updated)
    finalized = updated["metadata"].get("deletionTimestamp") and not updated["metadata"].get("finalizers")
    if finalized:  # the API server deletes it now: it must not linger in the cache
        store.remove((updated["metadata"].get("namespace"), updated["metadata"]["name"]), updated)
    else:
        store.upsert(updated)
    return updated
