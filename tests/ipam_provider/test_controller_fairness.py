"""The controller's workers are shared fairly among namespaces: claims of a namespace whose backend never answers
hold at most all but a quarter of the workers, and another namespace's claim is reconciled at once.

In process: the controller's own queue and workers, with the reconcile replaced by one that never returns for the
stalling namespace (as a NetBox that accepts and never answers holds a worker up to its deadline)."""

from __future__ import annotations

import asyncio
from typing import Any

from backends.incluster.backend import InClusterBackend
from ipam_provider.backend.contract import BackendContext
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.controller import Controller, ControllerSettings
from ipam_provider.watch import ClaimKey, PoolKey, QueueKey, tenant_of


def test_a_key_s_tenant_is_its_namespace_and_cluster_scoped_pools_are_one_tenant() -> None:
    controller = stalling_controller(asyncio.Event(), [])
    (kind,) = [k for k in controller.registry.kinds if k.kind == "InClusterIPPool"]
    (global_kind,) = [k for k in controller.registry.kinds if k.kind == "GlobalInClusterIPPool"]
    assert tenant_of(ClaimKey("team-a", "c")) == "team-a"
    assert tenant_of(PoolKey(kind.ref("team-a", "p"))) == "team-a"
    assert tenant_of(PoolKey(global_kind.ref(None, "g"))) is None


def stalling_controller(release: asyncio.Event, served: list[QueueKey]) -> Controller:
    kube: Any = object()  # never called: the reconcile is replaced
    registry = BackendRegistry([InClusterBackend(BackendContext(kube=kube))])
    controller = Controller(kube, registry, ControllerSettings(workers=8))

    async def dispatch(key: QueueKey) -> float | None:
        if isinstance(key, ClaimKey) and key.namespace == "stalling":
            await release.wait()
        served.append(key)
        return None

    controller._dispatch = dispatch  # type: ignore[method-assign]
    return controller


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_namespace_whose_backend_stalls_leaves_workers_for_the_others() -> None:
    release, served = asyncio.Event(), list[QueueKey]()
    controller = stalling_controller(release, served)
    workers = [asyncio.create_task(controller._worker()) for _ in range(8)]
    try:
        for number in range(100):  # a hundred pools of one namespace, each with a claim
            controller.queue.add(ClaimKey("stalling", f"claim-{number}"), f"stalling-pool-{number}")
        await settle()
        assert controller.queue.holding("stalling") == 6, "two of eight workers are kept for other namespaces"
        for name in ("a", "b"):
            controller.queue.add(ClaimKey("team-b", name), "team-b-pool-" + name)
        controller.queue.add(ClaimKey("team-c", "c"), "team-c-pool")
        await asyncio.wait_for(settle(), 5)
        assert served == [ClaimKey("team-b", "a"), ClaimKey("team-c", "c"), ClaimKey("team-b", "b")]
        assert controller.queue.holding("stalling") == 6
    finally:
        release.set()
        controller.queue.shutdown()
        await asyncio.wait_for(asyncio.gather(*workers), 5)
