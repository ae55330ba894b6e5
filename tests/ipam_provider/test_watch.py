"""Which claims an event re-queues, and at which priority: the mapping from events to claim keys, without an API
server.

The reconciler is not run; the test reads the keys the pool handler put on the work queue.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from backends.incluster.backend import InClusterBackend
from ipam_provider import watch
from ipam_provider.backend.contract import BackendContext
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.controller import Controller, ControllerSettings
from ipam_provider.runtime.cache import informer
from ipam_provider.watch import ClaimKey, PoolKey

GROUP = "ipam.cluster.x-k8s.io"


def pool(generation: int = 1, ready: str | None = None, free: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": ready, "reason": "R", "lastTransitionTime": "t"}]
    if free is not None:
        status["ipAddresses"] = {"total": 10, "used": 10 - free, "free": free}
    return {
        "apiVersion": f"{GROUP}/v1alpha2",
        "kind": "InClusterIPPool",
        "metadata": {"namespace": "ns", "name": "pool", "uid": "u1", "generation": generation},
        "spec": {"addresses": ["10.0.0.0/29"], "prefix": 24},
        "status": status,
    }


def claim(name: str, fulfilled: bool) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"poolRef": {"apiGroup": GROUP, "kind": "InClusterIPPool", "name": "pool"}},
        "status": {"addressRef": {"name": name}} if fulfilled else {},
    }


@pytest.fixture
def controller() -> Controller:
    kube: Any = object()  # never called: nothing here runs a reconcile or an informer
    registry = BackendRegistry([InClusterBackend(BackendContext(kube=kube))])
    built = Controller(kube, registry, ControllerSettings())
    built.caches.claims.upsert(claim("done", fulfilled=True))
    built.caches.claims.upsert(claim("waiting", fulfilled=False))
    return built


def pool_handler(controller: Controller) -> Any:
    (kind,) = [k for k in controller.registry.kinds if k.kind == "InClusterIPPool"]
    return controller.handlers.on_pool(kind)


async def queued_claims(controller: Controller) -> set[str]:
    return set(await taken_in_order(controller))


async def taken_in_order(controller: Controller) -> list[str]:
    """The claims the queue hands out until it is empty, in order (each marked done at once)."""
    order = []
    while len(controller.queue):
        item = await asyncio.wait_for(controller.queue.get(), 1)
        assert item is not None
        key, shard = item
        if isinstance(key, ClaimKey):
            order.append(key.name)
        controller.queue.done(key, shard)
    return order


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (pool(ready="False"), pool(ready="True"), {"waiting"}),
        (pool(free=0), pool(free=3), {"waiting"}),
        (pool(ready="True", free=3), pool(ready="True", free=2), set()),
        (pool(ready="True"), pool(ready="False"), set()),
        (pool(generation=1), pool(generation=2), {"done", "waiting"}),
    ],
    ids=["turned-ready", "gained-free", "status-only", "turned-not-ready", "spec-changed"],
)
async def test_pool_modification_requeues_the_claims_it_concerns(
    controller: Controller, old: dict[str, Any], new: dict[str, Any], expected: set[str]
) -> None:
    pool_handler(controller)("MODIFIED", old, copy.deepcopy(new))
    assert await queued_claims(controller) == expected


async def test_pool_appearing_or_going_requeues_every_claim(controller: Controller) -> None:
    pool_handler(controller)("ADDED", None, pool())
    assert await queued_claims(controller) == {"done", "waiting"}
    pool_handler(controller)("DELETED", pool(), None)
    assert await queued_claims(controller) == {"done", "waiting"}


async def test_a_deleted_claim_requeues_the_claims_waiting_on_its_pool(controller: Controller) -> None:
    gone = claim("released", fulfilled=True)
    controller.handlers.on_claim("DELETED", gone, None)
    assert await queued_claims(controller) == {"released", "waiting"}
    controller.handlers.on_claim("MODIFIED", claim("done", fulfilled=True), claim("done", fulfilled=True))
    assert await queued_claims(controller) == {"done"}, "a live claim's change concerns that claim only"


async def test_fulfilled_claims_of_an_initial_list_wait_behind_every_other_claim(controller: Controller) -> None:
    controller.caches.claims.upsert(claim("listed-done", fulfilled=True))
    controller.caches.claims.upsert(claim("listed-waiting", fulfilled=False))
    token = informer._INITIAL_LIST.set(True)
    try:
        controller.handlers.on_claim("ADDED", None, claim("done", fulfilled=True))
        controller.handlers.on_claim("ADDED", None, claim("listed-done", fulfilled=True))
        controller.handlers.on_claim("ADDED", None, claim("listed-waiting", fulfilled=False))
    finally:
        informer._INITIAL_LIST.reset(token)
    controller.handlers.on_claim("ADDED", None, claim("waiting", fulfilled=False))
    assert await taken_in_order(controller) == ["listed-waiting", "waiting", "done", "listed-done"]


async def test_a_live_change_raises_a_listed_claim(controller: Controller) -> None:
    controller.caches.claims.upsert(claim("listed-done", fulfilled=True))
    token = informer._INITIAL_LIST.set(True)
    try:
        controller.handlers.on_claim("ADDED", None, claim("listed-done", fulfilled=True))
        controller.handlers.on_claim("ADDED", None, claim("done", fulfilled=True))
    finally:
        informer._INITIAL_LIST.reset(token)
    controller.handlers.on_claim("MODIFIED", claim("done", fulfilled=True), claim("done", fulfilled=True))
    assert await taken_in_order(controller) == ["done", "listed-done"]


def other_pools(controller: Controller, known: dict[str, Any] | None = None) -> None:
    """As the initial list shows them: another pool of each in-cluster kind over the same addresses (the in-cluster
    backend's reports span the pools they overlap), a pool of disjoint addresses, and `known`."""
    listed = []
    for kind in controller.registry.kinds:
        for name, addresses in (("other", "10.0.0.0/29"), ("far", "10.9.0.0/29")):
            other = pool()
            other["kind"] = kind.kind
            other["metadata"] = {"name": name, "uid": f"u-{kind.kind}-{name}", "generation": 1}
            other["spec"]["addresses"] = [addresses]
            if kind.namespaced:
                other["metadata"]["namespace"] = "ns"
            listed.append((kind, other))
    if known is not None:
        listed.append((controller.registry.kinds[0], known))
    token = informer._INITIAL_LIST.set(True)
    try:
        for kind, obj in listed:
            controller.caches.pools[(kind.group, kind.kind)].upsert(obj)
            controller.handlers.on_pool(kind)("ADDED", None, obj)
    finally:
        informer._INITIAL_LIST.reset(token)


async def queued_pools(controller: Controller) -> set[str]:
    found = set()
    while len(controller.queue):
        item = await asyncio.wait_for(controller.queue.get(), 1)
        assert item is not None
        key, shard = item
        if isinstance(key, PoolKey):
            found.add(str(key.ref))
        controller.queue.done(key, shard)
    return found


@pytest.mark.parametrize(
    ("type", "old", "new", "others"),
    [
        ("ADDED", None, pool(), True),
        ("DELETED", pool(), None, True),
        ("MODIFIED", pool(generation=1), pool(generation=2), True),
        ("MODIFIED", pool(free=3), pool(free=2), False),
    ],
    ids=["created", "deleted", "spec-changed", "status-only"],
)
async def test_a_pool_coming_going_or_changing_its_spec_requeues_the_pools_it_overlaps(
    controller: Controller,
    monkeypatch: pytest.MonkeyPatch,
    type: str,
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    others: bool,
) -> None:
    monkeypatch.setattr(watch, "POOL_STATUS_DELAY", 0.0)
    other_pools(controller, old)
    await queued_pools(controller)  # what the initial list enqueued
    pool_handler(controller)(type, old, new)
    linked = {"InClusterIPPool/ns/other", "GlobalInClusterIPPool/other"} if others else set()
    assert await queued_pools(controller) == {"InClusterIPPool/ns/pool", *linked}


async def test_pools_of_the_initial_list_do_not_requeue_each_other(
    controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch, "POOL_STATUS_DELAY", 0.0)
    other_pools(controller)
    await queued_pools(controller)
    token = informer._INITIAL_LIST.set(True)
    try:
        pool_handler(controller)("ADDED", None, pool())
    finally:
        informer._INITIAL_LIST.reset(token)
    assert await queued_pools(controller) == {"InClusterIPPool/ns/pool"}
