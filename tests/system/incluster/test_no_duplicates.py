"""No address is ever handed out twice within a pool: across restarts, with lagging watches and stale
indexes, with two controllers at once, under load, and after a SIGKILL."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends.incluster.naming import RESERVATIONS
from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory, controller_command
from tests.support.objects import POOLS, claim, pool, wait_address


async def assert_unique_and_complete(
    kube: KubeClient, namespace: str, expected_claims: int, timeout: float = 120
) -> dict[str, list[str]]:
    """Every claim fulfilled (within `timeout` seconds), no address twice per pool, exactly one reservation per
    claim (no leak)."""

    async def all_ready() -> list[dict[str, Any]] | None:
        claims, _ = await kube.list(CLAIMS, namespace)
        ready = [c for c in claims if (c.get("status") or {}).get("addressRef")]
        return claims if len(ready) == expected_claims == len(claims) else None

    await wait_for(all_ready, timeout=timeout, message=f"{expected_claims} claims fulfilled in {namespace}")
    addresses, _ = await kube.list(ADDRESSES, namespace)
    by_pool: dict[str, list[str]] = collections.defaultdict(list)
    for address in addresses:
        by_pool[address["spec"]["poolRef"]["name"]].append(address["spec"]["address"])
    for pool_name, values in by_pool.items():
        duplicates = [a for a, n in collections.Counter(values).items() if n > 1]
        assert not duplicates, f"pool {pool_name} handed out {duplicates} more than once"
    assert sum(len(v) for v in by_pool.values()) == expected_claims

    async def one_reservation_per_claim() -> bool:
        # Strays left by overlapping replicas are released by the repair loop; wait for that.
        reservations, _ = await kube.list(RESERVATIONS)
        mine = [r for r in reservations if r["spec"]["claim"].get("namespace") == namespace]
        per_claim = collections.Counter(r["spec"]["claim"]["uid"] for r in mine)
        state.update(count=len(mine), worst=per_claim.most_common(1))
        return len(mine) == expected_claims and all(n == 1 for n in per_claim.values())

    state: dict[str, Any] = {}
    await wait_for(
        one_reservation_per_claim,
        timeout=60,
        message=lambda: f"one reservation per claim ({expected_claims}); have {state}: a leak",
    )
    return by_pool


# The repair loop (which releases stray reservations) at a test's pace.
FAST_REPAIR = RepairSettings(interval=1.0, grace_period=2.0)


async def create_claims(kube: KubeClient, namespace: str, names_and_pools: list[tuple[str, str]]) -> None:
    semaphore = asyncio.Semaphore(20)

    async def one(name: str, pool_name: str) -> None:
        async with semaphore:
            await kube.create(CLAIMS, claim(name, pool_name), namespace)

    await asyncio.gather(*(one(n, p) for n, p in names_and_pools))


async def test_no_duplicates_after_a_restart(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(POOLS, pool("net", ["10.40.0.0/24"], 24), namespace)
    async with controller_factory(namespaces=[namespace]):
        await create_claims(kube, namespace, [(f"first-{i}", "net") for i in range(10)])
        await assert_unique_and_complete(kube, namespace, 10)
    before = {a["metadata"]["name"]: a["spec"]["address"] for a in (await kube.list(ADDRESSES, namespace))[0]}
    # A new process knows nothing: it must learn what is held before it allocates.
    async with controller_factory(namespaces=[namespace]):
        await create_claims(kube, namespace, [(f"second-{i}", "net") for i in range(10)])
        await assert_unique_and_complete(kube, namespace, 20)
    after = {a["metadata"]["name"]: a["spec"]["address"] for a in (await kube.list(ADDRESSES, namespace))[0]}
    assert {k: after[k] for k in before} == before, "existing claims keep their addresses across a restart"


async def test_a_stale_index_never_hands_out_an_address_held_by_another_process(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(POOLS, pool("net", ["10.41.0.0/28"], 28), namespace)
    async with controller_factory(namespaces=[namespace]):
        await create_claims(kube, namespace, [("a", "net")])
        assert (await wait_address(kube, namespace, "a"))["spec"]["address"] == "10.41.0.1"
        # The controller's index of the pool is built now. Another replica holds .2 behind its back.
        other = await kube.create(
            RESERVATIONS,
            {
                "apiVersion": RESERVATIONS.api_version,
                "kind": RESERVATIONS.kind,
                "metadata": {"name": _reservation_name(namespace, "10.41.0.2"), "labels": _labels(namespace, "x")},
                "spec": {
                    "pool": {
                        "apiGroup": "ipam.cluster.x-k8s.io",
                        "kind": "InClusterIPPool",
                        "namespace": namespace,
                        "name": "net",
                    },
                    "address": "10.41.0.2",
                    "prefix": 28,
                    "claim": {"namespace": namespace, "name": "elsewhere", "uid": "x"},
                },
            },
        )
        await create_claims(kube, namespace, [("b", "net")])
        b = await wait_address(kube, namespace, "b")
        assert b["spec"]["address"] == "10.41.0.3", "the address held elsewhere must be skipped, not duplicated"
        await kube.delete(RESERVATIONS, other["metadata"]["name"])


def _reservation_name(namespace: str, address: str, pool_name: str = "net") -> str:
    from backends.incluster.naming import reservation_name
    from ipam_provider.backend.contract import PoolRef

    return reservation_name(PoolRef("ipam.cluster.x-k8s.io", "InClusterIPPool", namespace, "net"), address)


def _labels(namespace: str, uid: str) -> dict[str, str]:
    from backends.incluster.naming import LABEL_CLAIM_UID, LABEL_POOL, pool_hash
    from ipam_provider.backend.contract import PoolRef

    ref = PoolRef("ipam.cluster.x-k8s.io", "InClusterIPPool", namespace, "net")
    return {LABEL_POOL: pool_hash(ref), LABEL_CLAIM_UID: uid}


class LaggingKubeClient(KubeClient):
    """A client whose watches deliver every event `lag` seconds after the API server sent it."""

    lag = 0.3

    async def watch(
        self, resource: Resource, namespace: str | None = None, **kwargs: Any
    ) -> AsyncIterator[tuple[str, Any]]:
        loop = asyncio.get_running_loop()
        pending: asyncio.Queue[tuple[float, tuple[str, Any]] | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for event in super(LaggingKubeClient, self).watch(resource, namespace, **kwargs):
                    await pending.put((loop.time() + self.lag, event))
            finally:
                await pending.put(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await pending.get()) is not None:
                await asyncio.sleep(max(0.0, item[0] - loop.time()))
                yield item[1]
            await reader  # re-raise what ended the watch (e.g. 410 Gone)
        finally:
            reader.cancel()


async def test_no_duplicates_with_three_controllers_one_lagging(
    kube: KubeClient, kubeconfig: Path, namespace: str
) -> None:
    """Replicas overlapping in the worst way: two controllers allocate from the same pools for different
    claims (split by --watch-filter) with independent indexes, and a third sees every event late."""
    from backends.incluster import create_backend
    from ipam_provider.backend.contract import BackendContext
    from ipam_provider.backend.registry import BackendRegistry
    from ipam_provider.controller import Controller, ControllerSettings

    for index, name in enumerate(("p1", "p2")):
        await kube.create(POOLS, pool(name, [f"10.42.{index}.0/25"], 24), namespace)

    async def start(watch_filter: str | None, lagging: bool) -> tuple[Controller, asyncio.Task[None], KubeClient]:
        client = await KubeClient.from_kubeconfig(str(kubeconfig))
        if lagging:
            client.__class__ = LaggingKubeClient
        registry = BackendRegistry([create_backend(BackendContext(kube=client))])
        controller = Controller(
            client,
            registry,
            ControllerSettings(namespaces=[namespace], watch_filter=watch_filter, workers=4, repair=FAST_REPAIR),
        )
        ready = asyncio.Event()
        task = asyncio.create_task(controller.run(ready))
        await asyncio.wait_for(ready.wait(), 30)
        return controller, task, client

    running = [await start("a", False), await start("b", False), await start(None, True)]

    def labelled(name: str, pool_name: str, replica: str) -> dict[str, Any]:
        body = claim(name, pool_name, labels={"cluster.x-k8s.io/watch-filter": replica})
        return body

    async def create(prefix: str, count: int) -> None:
        await asyncio.gather(
            *(
                kube.create(CLAIMS, labelled(f"{prefix}-{i}", f"p{i % 2 + 1}", "ab"[(i // 2) % 2]), namespace)
                for i in range(count)
            )
        )

    try:
        await create("c", 80)
        await assert_unique_and_complete(kube, namespace, 80)
        # Release some and claim more while all three run, so that stale indexes meet reused addresses.
        for i in range(0, 40, 4):
            await kube.delete(CLAIMS, f"c-{i}", namespace)
        await create("d", 20)
        await assert_unique_and_complete(kube, namespace, 80 - 10 + 20)
    finally:
        for controller, task, client in running:
            controller.stop()
            await asyncio.wait_for(task, 30)
            await client.close()


async def test_300_claims_at_once_across_3_pools(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    for index in range(3):
        await kube.create(POOLS, pool(f"pool-{index}", [f"10.43.{index}.0/24"], 24), namespace)
    started = asyncio.get_running_loop().time()
    async with controller_factory(namespaces=[namespace], workers=8):
        await create_claims(kube, namespace, [(f"m-{i}", f"pool-{i % 3}") for i in range(300)])
        by_pool = await assert_unique_and_complete(kube, namespace, 300)
    elapsed = asyncio.get_running_loop().time() - started
    assert {name: len(values) for name, values in by_pool.items()} == {f"pool-{i}": 100 for i in range(3)}
    print(f"\n300 claims over 3 pools fulfilled in {elapsed:.1f} s")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
async def test_a_signal_mid_run_then_restart(
    kube: KubeClient, kubeconfig: Path, namespace: str, signum: signal.Signals
) -> None:
    """SIGKILL mid-burst, or SIGTERM (in-flight reconciles finish, exit 0), then a restart converges: every claim
    fulfilled, no duplicate, no reservation left without its IPAddress."""
    for index in range(2):
        await kube.create(POOLS, pool(f"k-{index}", [f"10.44.{index}.0/24"], 24), namespace)
    command = [
        *controller_command(kubeconfig, namespace),
        "--repair-interval=1s",
        "--repair-grace-period=2s",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
        "--workers=4",
        "--log-level=warning",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = await asyncio.create_subprocess_exec(*command, env=env)
    second: asyncio.subprocess.Process | None = None
    try:
        await create_claims(kube, namespace, [(f"k-{i}", f"k-{i % 2}") for i in range(150)])

        async def some_done() -> int | None:
            addresses, _ = await kube.list(ADDRESSES, namespace)
            return len(addresses) if len(addresses) >= 20 else None

        done_before = await wait_for(some_done, timeout=60, message="some claims fulfilled before the kill")
        first.send_signal(signum)
        assert await asyncio.wait_for(first.wait(), 30) == (-signal.SIGKILL if signum == signal.SIGKILL else 0)
        print(f"\n{signum.name} with {done_before} of 150 IPAddresses written")
        second = await asyncio.create_subprocess_exec(*command, env=env)
        await assert_unique_and_complete(kube, namespace, 150)
        second.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(second.wait(), 30) == 0, "SIGTERM must stop the controller cleanly"
    finally:
        for process in (first, second):
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()
