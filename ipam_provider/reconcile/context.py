"""What reconcilers share: the caches, the API client, the backends, the event recorder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ipam_provider.backend.contract import PoolKind, PoolRef
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.errors import ApiError
from ipam_provider.kube.resources import Resource
from ipam_provider.reconcile.events import EventRecorder
from ipam_provider.watch.store import Store

Object = dict[str, Any]


def shard_for(ref: PoolRef) -> str:
    """The work-queue shard of a pool: all work on one pool is serialised."""
    return f"{ref.kind}.{ref.group}/{ref.namespace or ''}/{ref.name}"


def pool_resource(kind: PoolKind) -> Resource:
    return Resource(kind.group, kind.version, kind.plural, kind.kind, kind.namespaced)


@dataclass
class Caches:
    """The informers' stores. Pools are kept per (group, kind)."""

    claims: Store = field(default_factory=Store)
    addresses: Store = field(default_factory=Store)
    clusters: Store = field(default_factory=Store)
    pools: dict[tuple[str, str], Store] = field(default_factory=dict)

    def pool(self, ref: PoolRef) -> Object | None:
        store = self.pools.get((ref.group, ref.kind))
        return store.get(ref.namespace, ref.name) if store is not None else None


@dataclass
class ReconcileContext:
    kube: KubeClient
    caches: Caches
    registry: BackendRegistry
    recorder: EventRecorder
    pool_changed: Callable[[PoolRef], None] = lambda ref: None


async def patch_cached(
    context: ReconcileContext,
    store: Store,
    resource: Resource,
    obj: Object,
    patch: Object,
    *,
    subresource: str | None = None,
) -> Object:
    """Merge-patch `obj` guarded by its resourceVersion, and cache the answer (read-your-writes).

    On a conflict the object is read again from the API server into the cache before the error propagates,
    so the retry works from fresh data.
    """
    meta = obj["metadata"]
    body = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": meta["resourceVersion"]}}
    try:
        updated = await context.kube.patch(resource, meta["name"], body, meta.get("namespace"), subresource=subresource)
    except ApiError as error:
        if error.conflict or error.not_found:
            fresh = await context.kube.get(resource, meta["name"], meta.get("namespace"))
            if fresh is not None:
                fresh.setdefault("apiVersion", resource.api_version)
                fresh.setdefault("kind", resource.kind)
                store.upsert(fresh)
        raise
    updated.setdefault("apiVersion", resource.api_version)
    updated.setdefault("kind", resource.kind)
    finalized = updated["metadata"].get("deletionTimestamp") and not updated["metadata"].get("finalizers")
    if finalized:  # the API server deletes it now: it must not linger in the cache
        store.remove((updated["metadata"].get("namespace"), updated["metadata"]["name"]), updated)
    else:
        store.upsert(updated)
    return updated
