"""The first use of a pool reserves the addresses of IPAddresses that have no reservation. With the controller's
synced cache able to answer for the pool, they are taken from it (no LIST of every IPAddress on a restart);
otherwise from the API server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import cast

from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
from backends.incluster.naming import RESERVATIONS, pool_hash
from ipam_provider.api.capi import ADDRESSES
from ipam_provider.backend.contract import Allocation, BackendContext, ClaimContext, PoolRef
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.common import Object
from ipam_provider.controller import Controller, ControllerSettings
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import GLOBAL_POOLS, POOLS, global_pool, pool
from tests.system.incluster.test_migration import go_provider_address


def namespaced(address: Object, namespace: str, pool_name: str) -> Object:
    address["metadata"]["namespace"] = namespace
    address["spec"]["poolRef"]["kind"] = "InClusterIPPool"
    address["spec"]["poolRef"]["name"] = pool_name
    return address


async def allocate(backend: InClusterBackend, ref: PoolRef, pool: Object, claim: ClaimContext) -> Allocation:
    """Allocate, retrying while the API server answers 429 (the reservation CRD's storage may still be
    initialising when this is the session's first test), as the controller's queue would."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await backend.allocate(ref, pool, claim)
        except ApiError as error:
            if not error.throttled or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_the_scan_reads_the_cache_when_it_can_answer(kube: KubeClient, namespace: str) -> None:
    created = await kube.create(POOLS, pool("cached", ["10.47.0.10-10.47.0.20"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "cached")
    # Known only to the "cache": had the scan listed the API server, 10.47.0.10 would be handed out.
    only_cached = namespaced(go_provider_address("old", "uid-old", "cached", "10.47.0.10"), namespace, "cached")
    asked: list[PoolRef] = []

    def cached(asked_ref: PoolRef) -> Sequence[Object] | None:
        asked.append(asked_ref)
        return [only_cached]

    backend = InClusterBackend(BackendContext(kube=kube, cached_addresses=cached))
    new = ClaimContext(namespace=namespace, name="new", uid="uid-new")
    allocation = await allocate(backend, ref, created, new)
    assert asked == [ref]
    assert allocation.address == "10.47.0.11", "the cached IPAddress's address is held by a reservation first"
    items, _ = await kube.list(RESERVATIONS, label_selector=f"ipam.cluster.x-k8s.io/pool-hash={pool_hash(ref)}")
    assert sorted(item["spec"]["address"] for item in items) == ["10.47.0.10", "10.47.0.11"]
    await backend.close()


async def test_without_the_cache_the_scan_lists_the_api_server(kube: KubeClient, namespace: str) -> None:
    created = await kube.create(POOLS, pool("listed", ["10.48.0.10-10.48.0.20"], 24), namespace)
    await kube.create(
        ADDRESSES, namespaced(go_provider_address("old", "u", "listed", "10.48.0.10"), namespace, "listed"), namespace
    )
    backend = InClusterBackend(BackendContext(kube=kube))  # its cached_addresses answers None
    allocation = await allocate(
        backend, IN_CLUSTER_POOL.ref(namespace, "listed"), created, ClaimContext(namespace, "new", "uid-new")
    )
    assert allocation.address == "10.48.0.11"
    await backend.close()


async def test_the_controller_answers_only_for_pools_whose_namespaces_it_watches(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(GLOBAL_POOLS, global_pool(f"g-{namespace}", ["10.49.0.0/28"], 24))
    await kube.create(POOLS, pool("p", ["10.49.1.0/28"], 24), namespace)
    await kube.create(ADDRESSES, namespaced(go_provider_address("a", "u", "p", "10.49.1.5"), namespace, "p"), namespace)
    namespaced_ref = IN_CLUSTER_POOL.ref(namespace, "p")
    global_ref = PoolRef(IN_CLUSTER_POOL.group, "GlobalInClusterIPPool", None, f"g-{namespace}")
    async with controller_factory(namespaces=[namespace]) as restricted:
        cached = restricted.caches.cached_addresses(namespaced_ref)
        assert cached is not None and [a["spec"]["address"] for a in cached] == ["10.49.1.5"]
        assert restricted.caches.cached_addresses(global_ref) is None, "its IPAddresses may be in unwatched namespaces"
        assert restricted.caches.cached_addresses(IN_CLUSTER_POOL.ref("elsewhere", "p")) is None
    async with controller_factory() as everywhere:
        assert everywhere.caches.cached_addresses(global_ref) == []
        assert everywhere.caches.cached_addresses(namespaced_ref) is not None
        await kube.delete(GLOBAL_POOLS, global_ref.name)  # cluster-scoped: no namespace's deletion takes it away

        async def gone() -> bool:
            return await kube.get(GLOBAL_POOLS, global_ref.name) is None

        await wait_for(gone, timeout=30, message=f"{global_ref.name} to be gone (the controller lifts its finalizer)")


def test_an_unsynced_controller_does_not_answer() -> None:
    kube = cast(KubeClient, object())  # never called: nothing runs
    registry = BackendRegistry([InClusterBackend(BackendContext(kube=kube))])
    controller = Controller(kube, registry, ControllerSettings())
    assert controller.caches.cached_addresses(IN_CLUSTER_POOL.ref("ns", "p")) is None


async def test_a_prepared_index_is_scanned_before_its_first_allocation(kube: KubeClient, namespace: str) -> None:
    created = await kube.create(POOLS, pool("prepared", ["10.51.0.10-10.51.0.20"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "prepared")
    only_cached = namespaced(go_provider_address("old", "uid-old", "prepared", "10.51.0.10"), namespace, "prepared")
    synced = False  # the cache answers only once it has synced, after `prepare`

    def cached(asked_ref: PoolRef) -> Sequence[Object] | None:
        return [only_cached] if synced else None

    backend = InClusterBackend(BackendContext(kube=kube, cached_addresses=cached))
    try:
        await backend.prepare(ref, created)
        prepared = backend.ledger.get(ref)
        assert prepared is not None and not prepared.scanned, "built from the reservations alone"
        synced = True
        allocation = await allocate(backend, ref, created, ClaimContext(namespace, "new", "uid-new"))
        assert allocation.address == "10.51.0.11", "the scan ran first, from the synced cache"
        assert backend.ledger.get(ref) is prepared and prepared.scanned
    finally:
        await backend.close()


async def test_the_controller_prepares_the_pools_it_finds_at_start(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(POOLS, pool("early", ["10.52.0.0/28"], 24), namespace)
    async with controller_factory(namespaces=[namespace]) as controller:
        found = controller.registry.lookup(IN_CLUSTER_POOL.group, IN_CLUSTER_POOL.kind)
        assert found is not None and isinstance(found[0], InClusterBackend)
        backend = found[0]
        ref = IN_CLUSTER_POOL.ref(namespace, "early")
        await wait_for(lambda: _prepared(backend, ref), timeout=30, message="pool prepared")


async def _prepared(backend: InClusterBackend, ref: PoolRef) -> bool:
    return backend.ledger.get(ref) is not None
