"""The chaos run's NetBox harness (benchmarks/chaos/netbox.py) against the real NetBox: it prepares pools that
allocate through its fault proxy, each fault kind meets requests and ends by itself, `delete_behind_back` deletes
exactly one of our addresses in NetBox, and `truth()` sees what the backend allocated.

The backend is called directly, as the reconciler calls it, with the pools and Secret the harness answers (the
Secret is created in the real API server). Traffic during a fault is real requests through the proxy.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import random
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
import requests

from backends.netbox import NetboxBackend
from benchmarks.chaos.backends import ChaosBackend, TruthRecord
from benchmarks.chaos.netbox import FAULT_KINDS, NetboxChaos
from ipam_provider.backend.contract import Allocation, BackendError, ClaimContext, PoolRef
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import SECRETS
from tools.netbox_proxy import NetboxProxy

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

Object = dict[str, Any]
REQUEST_TIMEOUT = 2.0  # the client timeout the `netbox-timeout` fault outlasts here


@pytest_asyncio.fixture
async def harness(netbox: NetBoxServer) -> AsyncIterator[NetboxChaos]:
    chaos = NetboxChaos(
        url=netbox.url,
        token=netbox.token,
        run_dir=netbox.run_dir,
        max_pools=2,
        request_timeout=REQUEST_TIMEOUT,
        fault_window=6.0,
    )
    await chaos.start()
    yield chaos
    await chaos.stop()


async def apply_pools(harness: NetboxChaos, kube: KubeClient, namespace: str, count: int = 2) -> list[Object]:
    """Creates the harness's Secret in the API server; answers its pools as the reconciler hands them over."""
    secret, *pools = harness.manifests(namespace, count)
    await kube.create(SECRETS, secret, namespace)
    for pool in pools:
        pool["metadata"].update(generation=1, uid=str(uuid.uuid4()))
    return pools


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


def status_through_proxy(harness: NetboxChaos, netbox: NetBoxServer) -> int:
    answer = requests.get(
        f"{harness.proxy.url}/api/status/", headers={"Authorization": f"Bearer {netbox.token}"}, timeout=30
    )
    return answer.status_code


async def during(harness: NetboxChaos, kind: str, traffic: Callable[[threading.Event], list[str]]) -> list[str]:
    """Injects `kind` while `traffic` sends requests (in a thread) until the fault is over; answers what the traffic
    saw."""
    done = threading.Event()
    seen = asyncio.create_task(asyncio.to_thread(traffic, done))
    try:
        await harness.inject(kind, random.Random(15))
    finally:
        done.set()
    return await seen


def status_loop(harness: NetboxChaos, netbox: NetBoxServer) -> Callable[[threading.Event], list[str]]:
    """GET /api/status/ through the proxy again and again: each answer's status, or the exception's name."""

    def run(done: threading.Event) -> list[str]:
        seen: list[str] = []
        with requests.Session() as session:
            while not done.is_set():
                try:
                    answer = session.get(
                        f"{harness.proxy.url}/api/status/",
                        headers={"Authorization": f"Bearer {netbox.token}"},
                        timeout=REQUEST_TIMEOUT,
                    )
                    seen.append(str(answer.status_code))
                except requests.RequestException as error:
                    seen.append(type(error).__name__)
        return seen

    return run


class _Upstream(http.server.BaseHTTPRequestHandler):
    """Answers 200 to anything: a stand-in upstream for the proxy's own bookkeeping, never for NetBox."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_DELETE = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_proxy_faults_can_be_watched_and_withdrawn() -> None:
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        with NetboxProxy(f"http://127.0.0.1:{upstream.server_address[1]}") as proxy, requests.Session() as session:
            burst = proxy.answer_next(503, count=3)
            assert session.get(f"{proxy.url}/api/status/", timeout=30).status_code == 503
            assert proxy.pending(burst) == 2 and proxy.withdraw(burst) == 2 and proxy.pending(burst) == 0
            lost = proxy.lose_next(None, "/api/ipam/")  # any method
            assert proxy.pending(lost) == 1
            with pytest.raises(requests.ConnectionError):
                session.delete(f"{proxy.url}/api/ipam/ip-addresses/1/", timeout=30)
            assert proxy.pending(lost) == 0 and proxy.withdraw(lost) == 0
            late = proxy.delay_next(None, "/api/", 600.0)
            assert proxy.withdraw(late) == 1 and proxy.pending(late) == 0
            answers = [session.post(f"{proxy.url}/api/ipam/x/", timeout=30).status_code for _ in range(3)]
            assert answers == [200, 200, 200], "a withdrawn fault meets no request"
    finally:
        upstream.shutdown()
        upstream.server_close()


def test_restart_is_left_out_without_a_run_dir() -> None:
    chaos: ChaosBackend = NetboxChaos(url="http://127.0.0.1:1", token="nbt_x.y")
    assert list(chaos.fault_kinds) == list(FAULT_KINDS[:-1])
    assert "netbox-restart" in NetboxChaos(url="http://127.0.0.1:1", token="nbt_x.y", run_dir=Path("/tmp")).fault_kinds


async def test_truth_sees_what_the_backend_allocates_through_the_proxy(
    harness: NetboxChaos, backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    pools = await apply_pools(harness, kube, namespace)
    assert harness.pool_refs(namespace, 2) == [f"NetboxIPPool/{namespace}/chaos-netbox-{i}" for i in (0, 1)]
    expected: set[TruthRecord] = set()
    for index, count in ((0, 3), (1, 2)):
        pool = pools[index]
        for _ in range(count):
            made = claim(namespace)
            allocation = await backend.allocate(PoolRef.from_object(pool), pool, made)
            ref = f"NetboxIPPool/{namespace}/{pool['metadata']['name']}"
            expected.add(TruthRecord(ref, allocation.address, made.uid, ""))
    truth = await harness.truth()
    assert {(r.pool, r.address, r.claim_uid) for r in truth} == {(r.pool, r.address, r.claim_uid) for r in expected}
    assert all(r.handle.isdigit() for r in truth)
    proxy = harness.proxy
    assert len(proxy.events("POST", "available-ips")) == 5, "the pools must reach NetBox through the proxy"
    # The pools' token is the harness's own restricted user's, never the admin token.
    assert harness.manifests(namespace, 2)[0]["stringData"]["token"] != netbox.token


async def test_delete_behind_back_deletes_exactly_one_of_our_addresses(
    harness: NetboxChaos, backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    pools = await apply_pools(harness, kube, namespace)
    for pool in pools:
        for _ in range(2):
            await backend.allocate(PoolRef.from_object(pool), pool, claim(namespace))
    before = await harness.truth()
    everything = {a.id for a in netbox.api().ipam.ip_addresses.all()}
    what = await harness.delete_behind_back(random.Random(3))
    after = await harness.truth()
    gone = set(before) - set(after)
    assert len(gone) == 1 and set(after) < set(before)
    (deleted,) = gone
    assert f"#{deleted.handle} {deleted.address}" in what
    assert {a.id for a in netbox.api().ipam.ip_addresses.all()} == everything - {int(deleted.handle)}
    assert harness.proxy.events("DELETE") == [], "deleted directly in NetBox, not through the proxy"


async def test_a_5xx_burst_fires_and_ends(harness: NetboxChaos, netbox: NetBoxServer) -> None:
    seen = await during(harness, "netbox-5xx", status_loop(harness, netbox))
    bursts = [s for s in seen if s in ("502", "503")]
    assert len(bursts) >= 3 and harness.fired["netbox-5xx"] == 1
    assert status_through_proxy(harness, netbox) == 200


async def test_a_timeout_outlasts_the_request_timeout_and_ends(harness: NetboxChaos, netbox: NetBoxServer) -> None:
    seen = await during(harness, "netbox-timeout", status_loop(harness, netbox))
    assert "ReadTimeout" in seen and harness.fired["netbox-timeout"] == 1
    assert status_through_proxy(harness, netbox) == 200


async def test_a_lost_reply_is_carried_out_and_ends(
    harness: NetboxChaos, backend: NetboxBackend, kube: KubeClient, namespace: str
) -> None:
    (pool,) = await apply_pools(harness, kube, namespace, 1)
    ref = PoolRef.from_object(pool)
    held: dict[str, tuple[ClaimContext, Allocation]] = {}
    stop = asyncio.Event()

    async def churn() -> None:  # allocations and releases, each retried like the reconciler does
        while not stop.is_set():
            made = claim(namespace)
            held[made.uid] = (made, await settle(functools.partial(backend.allocate, ref, pool, made)))
            if len(held) > 2:
                oldest, allocation = held.pop(next(iter(held)))
                await settle(functools.partial(backend.release, ref, pool, oldest, allocation))

    worker = asyncio.create_task(churn())
    try:
        await harness.inject("netbox-lost-reply", random.Random(15))
    finally:
        stop.set()
        await worker
    assert harness.fired["netbox-lost-reply"] == 1 and harness.proxy.faults.lost
    truth = await harness.truth()
    assert {(r.claim_uid, r.address) for r in truth} == {(uid, a.address) for uid, (_, a) in held.items()}
    await backend.allocate(ref, pool, claim(namespace))  # answers normally afterwards


async def test_a_lost_reply_falls_back_to_any_request_when_nothing_is_written(
    harness: NetboxChaos, netbox: NetBoxServer
) -> None:
    seen = await during(harness, "netbox-lost-reply", status_loop(harness, netbox))
    assert harness.fired["netbox-lost-reply"] == 1 and "ConnectionError" in seen
    assert [e.method for e in harness.proxy.events() if e.outcome == "lost"] == ["GET"]
    assert status_through_proxy(harness, netbox) == 200


async def test_a_restart_restarts_the_web_server_and_ends(harness: NetboxChaos, netbox: NetBoxServer) -> None:
    run_dir = netbox.require_harness("restarting NetBox")
    before = (run_dir / "gunicorn.pid").read_text()
    await harness.inject("netbox-restart", random.Random(1))
    assert (run_dir / "gunicorn.pid").read_text() != before, "gunicorn was not restarted"
    assert harness.fired["netbox-restart"] == 1
    assert status_through_proxy(harness, netbox) == 200


@pytest.mark.parametrize("kind", ["netbox-flood", "wapi-503"])
async def test_an_unknown_fault_kind_is_refused(kind: str) -> None:
    with pytest.raises(ValueError, match="unknown NetBox fault kind"):
        await NetboxChaos(url="http://127.0.0.1:1", token="nbt_x.y").inject(kind, random.Random(0))


async def test_restart_needs_a_run_dir() -> None:
    with pytest.raises(ValueError, match="unknown NetBox fault kind 'netbox-restart'"):
        await NetboxChaos(url="http://127.0.0.1:1", token="nbt_x.y").inject("netbox-restart", random.Random(0))
