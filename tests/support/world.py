"""The reconcilers wired to the fake API server and the fake backend, with builders for the objects they read.

`make_world()` is the one place that builds a `ReconcileContext`: a change of its constructor is one edit here.
`World.add` writes an object to the fake server and into the caches, as the informers would; `World.sync()` brings
the caches in line with the server, as a relist would (a test calls it where watch events would have arrived).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from ipam_provider.api.capi import ADDRESSES, ANNOTATION_PAUSED, CLAIMS, CLUSTERS, READY
from ipam_provider.backend.contract import PoolKind, PoolRef
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.cache import Caches
from ipam_provider.reconcile.claims import ClaimReconciler
from ipam_provider.reconcile.context import ReconcileContext, pool_resource
from ipam_provider.reconcile.pools import PoolReconciler
from ipam_provider.runtime.cache.store import Store, object_key
from ipam_provider.runtime.events import EventRecorder
from ipam_provider.runtime.kube.resources import EVENTS, Resource
from tests.support.fake_backend import FAKE_POOL, FakeBackend
from tests.support.fake_kube import FakeKube

Object = dict[str, Any]
NS = "ns"
POOLS = pool_resource(FAKE_POOL)


@dataclass
class World:
    kube: FakeKube
    backend: FakeBackend
    ctx: ReconcileContext
    claims: ClaimReconciler
    pools: PoolReconciler
    journal: list[str]
    pool_changes: list[PoolRef] = field(default_factory=list)

    def stores(self) -> list[tuple[Resource, Store]]:
        caches = self.ctx.caches
        pairs = [(CLAIMS, caches.claims), (ADDRESSES, caches.addresses), (CLUSTERS, caches.clusters)]
        pairs += [(pool_resource(kind), caches.pools[(kind.group, kind.kind)]) for kind in self.ctx.registry.kinds]
        return pairs

    def add(self, resource: Resource, obj: Object) -> Object:
        """Store `obj` in the server as it is and bring the caches in line; return it as stored."""
        stored = self.kube.put(resource, obj)
        self.sync()
        return stored

    def sync(self) -> None:
        """Every cache holds what the server holds now (a relist: newer versions in, deleted objects out)."""
        for resource, store in self.stores():
            present = {object_key(obj): obj for obj in self.kube.stored_all(resource)}
            for obj in present.values():
                store.upsert(obj)
            for cached in store.items():
                if object_key(cached) not in present:
                    store.remove(object_key(cached))

    def claim(self, name: str, namespace: str = NS) -> Object:
        found = self.kube.stored(CLAIMS, name, namespace)
        assert found is not None, f"claim {namespace}/{name} is gone"
        return found

    def address(self, name: str, namespace: str = NS) -> Object | None:
        return self.kube.stored(ADDRESSES, name, namespace)

    async def events(self, namespace: str = NS) -> list[tuple[str, str, str, str]]:
        """(type, reason, involved object's kind, its name) of every Event recorded so far, oldest first."""
        await self.ctx.recorder.flush()
        return [
            (e["type"], e["reason"], e["involvedObject"]["kind"], e["involvedObject"]["name"])
            for e in self.kube.stored_all(EVENTS, namespace)
        ]

    async def forget_requests(self) -> None:
        """Write the Events recorded so far, then forget every request and backend call made until now."""
        await self.ctx.recorder.flush()
        self.kube.requests.clear()
        self.journal.clear()


def make_world(backend: FakeBackend | None = None) -> World:
    journal: list[str] = []
    backend = backend or FakeBackend()
    backend.journal = journal
    kube = FakeKube(journal)
    registry = BackendRegistry([backend])
    caches = Caches()
    caches.serve(registry.kinds, registry.kind_of)
    pool_changes: list[PoolRef] = []
    ctx = ReconcileContext(kube, caches, registry, EventRecorder(kube, "test"), pool_changes.append)
    return World(kube, backend, ctx, ClaimReconciler(ctx), PoolReconciler(ctx), journal, pool_changes)


# --- objects ---------------------------------------------------------------------------------------------------


def pool(name: str = "net", *, kind: PoolKind = FAKE_POOL, namespace: str | None = NS, **meta: Any) -> Object:
    metadata: Object = {"name": name, **meta}
    if kind.namespaced:
        metadata["namespace"] = namespace
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": metadata, "spec": {"size": 254}}


def claim(
    name: str = "m1",
    pool_name: str = "net",
    *,
    kind: PoolKind = FAKE_POOL,
    cluster: str | None = None,
    namespace: str = NS,
    **meta: Any,
) -> Object:
    spec: Object = {"poolRef": {"apiGroup": kind.group, "kind": kind.kind, "name": pool_name}}
    if cluster is not None:
        spec["clusterName"] = cluster
    return {
        "apiVersion": CLAIMS.api_version,
        "kind": CLAIMS.kind,
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": spec,
    }


def cluster(name: str = "c1", *, paused: bool = False, namespace: str = NS, **meta: Any) -> Object:
    return {
        "apiVersion": CLUSTERS.api_version,
        "kind": CLUSTERS.kind,
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": {"paused": paused},
    }


def address(
    name: str,
    claim_name: str,
    pool_name: str = "net",
    ip: str = "10.0.0.99",
    *,
    kind: PoolKind = FAKE_POOL,
    namespace: str = NS,
    **meta: Any,
) -> Object:
    return {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": {
            "claimRef": {"name": claim_name},
            "poolRef": {"apiGroup": kind.group, "kind": kind.kind, "name": pool_name},
            "address": ip,
            "prefix": 24,
            "gateway": "10.0.0.1",
        },
    }


PAUSED = {ANNOTATION_PAUSED: ""}


def ready_of(obj: Object) -> Object | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == READY), None)


def ready_state(obj: Object) -> tuple[str, str] | None:
    """(status, reason) of the Ready condition."""
    condition = ready_of(obj)
    return (condition["status"], condition["reason"]) if condition is not None else None


def resynced(seconds: float | None, period: float = 600.0) -> bool:
    """Whether a reconcile asked to come back after `period` (the sync period, by default), stretched by a tenth
    at most."""
    return seconds is not None and period <= seconds <= period * 1.1


@pytest.fixture
def world() -> World:
    """The reconcilers against a fresh in-memory API server and fake backend."""
    return make_world()
