"""The chaos run's Infoblox harness (benchmarks/chaos/infoblox.py): it starts the WAPI simulator and prepares pools
the backend allocates from through the real infoblox-client, each fault kind meets requests and ends by itself,
`delete_behind_back` deletes exactly one of our objects in the simulator, and `truth()` sees what the backend
allocated.

The backend is called directly, as the reconciler calls it, with the Secret, InfobloxInstance and pools the
harness answers (Secret and instance created in the real API server).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import random
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio

from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.spec import INSTANCES
from benchmarks.chaos.backends import ChaosBackend
from benchmarks.chaos.infoblox import FAULT_KINDS, InfobloxChaos
from ipam_provider.backend.contract import Allocation, BackendContext, BackendError, ClaimContext, PoolRef
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import SECRETS
from tests.support.infoblox import FAST, lend_secrets

Object = dict[str, Any]
Held = dict[str, tuple[ClaimContext, Allocation]]
# What the simulator's request log says a fault did to a request: (status, fault).
SEEN = {"wapi-503": (503, "status"), "wapi-dropped": (None, "drop"), "wapi-lost-reply": (None, "drop_after_commit")}


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[InfobloxChaos]:
    chaos = InfobloxChaos(max_pools=2, fault_window=30.0)
    await chaos.start()
    yield chaos
    await chaos.stop()


@pytest_asyncio.fixture
async def backend(kube: KubeClient) -> AsyncIterator[InfobloxBackend]:
    made = InfobloxBackend(BackendContext(kube=kube), FAST)
    yield made
    await made.close()


@pytest_asyncio.fixture
async def pools(harness: InfobloxChaos, kube: KubeClient, namespace: str) -> AsyncIterator[list[Object]]:
    """The harness's Secret and instance, created in the API server; its two pools as the reconciler hands them
    over."""
    secret, instance, *made = harness.manifests(namespace, 2)
    await lend_secrets(kube, namespace)
    await kube.create(SECRETS, secret, namespace)
    await kube.create(INSTANCES, instance)
    for pool in made:
        pool["metadata"].update(generation=1, uid=str(uuid.uuid4()))
    yield made
    await kube.delete(INSTANCES, instance["metadata"]["name"])


def claim(namespace: str) -> ClaimContext:
    return ClaimContext(namespace=namespace, name=f"c-{uuid.uuid4().hex[:8]}", uid=str(uuid.uuid4()))


async def settle(step: Callable[[], Awaitable[Any]]) -> Any:
    """Runs a backend call until it succeeds, as the reconciler requeues after a backend error."""
    for _ in range(20):
        try:
            return await step()
        except BackendError:
            await asyncio.sleep(0.2)
    return await step()


async def churn(backend: InfobloxBackend, pool: Object, namespace: str, held: Held, stop: asyncio.Event) -> None:
    """Allocations and releases (at most three held at once) until `stop`, each retried like the reconciler."""
    ref = PoolRef.from_object(pool)
    while not stop.is_set():
        made = claim(namespace)
        held[made.uid] = (made, await settle(functools.partial(backend.allocate, ref, pool, made)))
        if len(held) > 2:
            oldest, allocation = held.pop(next(iter(held)))
            await settle(functools.partial(backend.release, ref, pool, oldest, allocation))


def test_fault_kinds() -> None:
    chaos: ChaosBackend = InfobloxChaos()
    assert list(chaos.fault_kinds) == ["wapi-503", "wapi-dropped", "wapi-lost-reply"] == list(FAULT_KINDS)


async def test_truth_sees_what_the_backend_allocates(
    harness: InfobloxChaos, backend: InfobloxBackend, pools: list[Object], namespace: str
) -> None:
    assert harness.pool_refs(namespace, 2) == [f"InfobloxIPPool/{namespace}/chaos-infoblox-{i}" for i in (0, 1)]
    expected = set()
    for pool, count in zip(pools, (3, 2), strict=True):
        for _ in range(count):
            made = claim(namespace)
            allocation = await backend.allocate(PoolRef.from_object(pool), pool, made)
            expected.add((f"InfobloxIPPool/{namespace}/{pool['metadata']['name']}", allocation.address, made.uid))
    truth = await harness.truth()
    assert {(r.pool, r.address, r.claim_uid) for r in truth} == expected
    assert all(harness.simulator.state.get(r.handle) is not None for r in truth)
    first = ipaddress.ip_network("10.78.0.0/27")
    assert all(ipaddress.ip_address(a) in first and a != "10.78.0.1" for p, a, _ in expected if p.endswith("-0"))


async def test_delete_behind_back_deletes_exactly_one_of_our_objects(
    harness: InfobloxChaos, backend: InfobloxBackend, pools: list[Object], namespace: str
) -> None:
    for pool in pools:
        for _ in range(2):
            await backend.allocate(PoolRef.from_object(pool), pool, claim(namespace))
    state = harness.simulator.state
    before, everything = await harness.truth(), set(state.refs("fixedaddress"))
    what = await harness.delete_behind_back(random.Random(3))
    after = await harness.truth()
    gone = set(before) - set(after)
    assert len(gone) == 1 and set(after) < set(before)
    (deleted,) = gone
    assert deleted.handle in what
    assert set(state.refs("fixedaddress")) == everything - {deleted.handle}, "one object, and only ours"


@pytest.mark.parametrize("kind", FAULT_KINDS)
async def test_each_fault_fires_and_ends(
    kind: str, harness: InfobloxChaos, backend: InfobloxBackend, pools: list[Object], namespace: str
) -> None:
    pool = pools[0]
    held: Held = {}
    stop = asyncio.Event()
    await backend.allocate(PoolRef.from_object(pool), pool, claim(namespace))  # warm: the instance is healthy
    worker = asyncio.create_task(churn(backend, pool, namespace, held, stop))
    try:
        await harness.inject(kind, random.Random(15))
    finally:
        stop.set()
        await worker
    assert harness.fired[kind] == 1
    status, fault = SEEN[kind]
    log = harness.simulator.request_log.entries
    assert [e for e in log if (e.status, e.fault) == (status, fault)], f"{kind} met no request"
    assert harness.simulator.faults.rules == [], "the fault's rule outlived it"
    truth = {(r.claim_uid, r.address) for r in await harness.truth() if r.pool.endswith("-0")}
    assert {(uid, a.address) for uid, (_, a) in held.items()} <= truth
    assert len(truth) == len(held) + 1, "an allocation leaked or was made twice"
    calls = len(log)
    await backend.allocate(PoolRef.from_object(pool), pool, claim(namespace))  # answers normally afterwards
    assert all(e.fault is None for e in harness.simulator.request_log.entries[calls:])


async def test_a_lost_reply_falls_back_to_any_request_when_nothing_is_written() -> None:
    chaos = InfobloxChaos(fault_window=4.0)
    await chaos.start()
    done = threading.Event()

    def reads() -> None:
        connector = chaos.simulator.connector()
        while not done.is_set():
            connector.get_object("network")  # urllib3 sends a GET whose answer was lost once more

    try:
        reader = asyncio.create_task(asyncio.to_thread(reads))
        await chaos.inject("wapi-lost-reply", random.Random(15))
        done.set()
        await reader
        lost = [e.method for e in chaos.simulator.request_log.entries if e.fault == "drop_after_commit"]
        assert lost == ["GET"] and chaos.fired["wapi-lost-reply"] == 1
        assert chaos.simulator.faults.rules == []
    finally:
        done.set()
        await chaos.stop()


async def test_an_unknown_fault_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown Infoblox fault kind 'netbox-5xx'"):
        await InfobloxChaos().inject("netbox-5xx", random.Random(0))
