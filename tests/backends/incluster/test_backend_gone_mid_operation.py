"""A pool whose deletion is observed while one of its operations awaits, or before one starts, keeps no state in the
in-cluster backend once that operation ends, and what the operation made is held by no unrelated pool."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Mapping
from typing import Any

from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
from backends.incluster.naming import RESERVATIONS
from ipam_provider.backend.contract import BackendContext, ClaimContext, PoolRef
from ipam_provider.common import Object
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.resources import Resource
from tests.support.fake_kube import FakeKube

CLAIM = ClaimContext("ns", "claim", "uid-claim")


class GatedKube(FakeKube):
    """A FakeKube whose reservation creates or lists wait, once `gate(verb)` is called, until `open()`."""

    def __init__(self) -> None:
        super().__init__()
        self.gated: str | None = None
        self.entered, self._opened = asyncio.Event(), asyncio.Event()

    def gate(self, verb: str) -> None:
        self.gated = verb

    def open(self) -> None:
        self.gated = None
        self._opened.set()

    async def _wait(self, verb: str, resource: Resource) -> None:
        if self.gated == verb and resource == RESERVATIONS:
            self.entered.set()
            await self._opened.wait()

    async def create(
        self,
        resource: Resource,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        field_validation: str | None = None,
    ) -> Object:
        await self._wait("create", resource)
        return await super().create(resource, body, namespace, field_validation=field_validation)

    async def list(self, resource: Resource, *args: Any, **kwargs: Any) -> tuple[builtins.list[Object], str]:
        await self._wait("list", resource)
        return await super().list(resource, *args, **kwargs)


def pool(name: str, domain: str | None = None) -> Object:
    spec: Object = {"addresses": ["10.1.0.10-10.1.0.20"], "prefix": 24}
    spec |= {"uniquenessDomain": domain} if domain else {}
    meta = {"name": name, "namespace": "ns", "generation": 1, "uid": f"uid-{name}", "resourceVersion": "1"}
    return {"apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool", "metadata": meta, "spec": spec}


def live_backend(kube: FakeKube, *pools: Object) -> InClusterBackend:
    backend = InClusterBackend(BackendContext(kube=kube))
    for obj in pools:
        kube.put(pool_resource(IN_CLUSTER_POOL), obj)
        backend.observe_pool(IN_CLUSTER_POOL, None, obj)
    return backend


def kept_for(backend: InClusterBackend, ref: PoolRef) -> list[str]:
    """Which of the backend's per-pool maps hold `ref`."""
    ledger = backend.ledger
    maps: dict[str, Mapping[PoolRef, object]] = {
        "_indexes": ledger._indexes,
        "_building": ledger._building,
        "_domains": ledger.reservations._domains,
        "_parsed": backend._parsed,
        "all_inside": backend.repair.all_inside,
    }
    return [name for name, kept in maps.items() if ref in kept]


async def test_a_reservation_of_a_domain_pool_deleted_meanwhile_is_not_held_by_pools_without_a_domain() -> None:
    kube = GatedKube()
    domain_pool, plain = pool("a", domain="d"), pool("c")
    a_ref, c_ref = IN_CLUSTER_POOL.ref("ns", "a"), IN_CLUSTER_POOL.ref("ns", "c")
    backend = live_backend(kube, domain_pool, plain)
    await backend.prepare(c_ref, plain)
    kube.gate("create")
    allocation = asyncio.create_task(backend.allocate(a_ref, domain_pool, CLAIM))
    await kube.entered.wait()
    backend.observe_pool(IN_CLUSTER_POOL, domain_pool, None)
    kube.open()
    await allocation
    index = backend.ledger.get(c_ref)
    assert index is not None and not index.by_address, "pool c holds the reservation made for deleted pool a"


async def test_an_index_built_while_its_pool_was_deleted_is_dropped_with_its_lock() -> None:
    kube = GatedKube()
    obj, ref = pool("p"), IN_CLUSTER_POOL.ref("ns", "p")
    backend = live_backend(kube, obj)
    kube.gate("list")
    allocation = asyncio.create_task(backend.allocate(ref, obj, CLAIM))
    await kube.entered.wait()
    backend.observe_pool(IN_CLUSTER_POOL, obj, None)
    kube.open()
    await allocation
    assert kept_for(backend, ref) == []


async def test_operations_of_a_pool_already_deleted_keep_nothing() -> None:
    kube = GatedKube()
    obj, ref = pool("p", domain="d"), IN_CLUSTER_POOL.ref("ns", "p")
    backend = live_backend(kube, obj)
    backend.observe_pool(IN_CLUSTER_POOL, obj, None)
    await backend.prepare(ref, obj)
    assert await backend.repair.outside_pool(ref, obj, ["10.1.0.11"]) == {}
    await backend.report(ref, obj, [])
    assert kept_for(backend, ref) == []
