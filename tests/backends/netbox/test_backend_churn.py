"""The NetBox backend in process, on an in-memory API server (no NetBox: the Secret names a port where nothing
listens): a Global pool's claims never see the URL of the Secret it uses, and pools created and deleted leave
nothing behind in the backend's per-pool state.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from backends.netbox import NetboxBackend, NetboxSettings
from backends.netbox.resolver import Resolver
from backends.netbox.spec import GLOBAL_NETBOX_POOL
from ipam_provider.backend.contract import Allocation, BackendContext, BackendError, PoolRef
from ipam_provider.backend.live_pools import LivePools
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from ipam_provider.repair.pacer import CountingPacer
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS
from tests.support.fake_kube import FakeKube
from tests.support.footprint import footprint, footprint_growth
from tests.support.netbox_backend import fast_settings, global_netbox_pool, new_claim, prefix

Object = dict[str, Any]
SECRET_URL = "http://127.0.0.1:9/the-lenders-secret-url"  # nothing listens here
LENDER = "operator"


def lending_kube() -> FakeKube:
    kube = FakeKube()
    kube.put(NAMESPACES, {"metadata": {"name": LENDER, "labels": {SECRET_REFS_LABEL: "true"}}})
    body = {"metadata": {"name": "netbox", "namespace": LENDER}, "stringData": {"url": SECRET_URL, "token": "t"}}
    kube.put(SECRETS, body)
    return kube


def churn_settings() -> NetboxSettings:
    """`fast_settings` with its one retry (still made) a few milliseconds after the first attempt: nothing listens
    at SECRET_URL, so every attempt fails at once, and a longer wait between them only makes the churn slow."""
    client = dataclasses.replace(fast_settings().client, backoff=0.002, max_backoff=0.01)
    return fast_settings(client=client)


def global_pool(name: str) -> Object:
    body = global_netbox_pool(name, [prefix("10.0.0.0/24")], "netbox", LENDER)
    body["metadata"].update(generation=1, uid=str(uuid.uuid4()))
    return body


def sizes(backend: NetboxBackend) -> dict[str, int]:
    """The size of every per-pool structure of the backend."""
    resolver, connections = backend.resolver, backend.resolver.connections
    return {
        "known": len(resolver.known),
        "resolved": len(resolver._resolved),
        "ownership locks": len(resolver._ownership_locks),
        "ledger indexes": len(backend.ledger._indexes),
        "gone": len(connections._gone),
        "pending": len(getattr(connections, "_pending", ())),
        "uses": len(connections._uses),
        "allowed": len(connections._allowed),
        "clients": len(connections._clients),
        "failures": len(backend._failures),
    }


async def test_a_global_pools_claims_never_see_its_secrets_url() -> None:
    backend = NetboxBackend(BackendContext(lending_kube()), fast_settings())
    pool = global_pool("shared")
    ref = PoolRef.from_object(pool)
    try:
        report = await backend.report(ref, pool, [])
        assert SECRET_URL in report.message, report  # the pool's own condition names its NetBox
        try:
            await backend.allocate(ref, pool, new_claim("tenant", "c"))
        except BackendError as error:
            message = str(error)
        else:
            raise AssertionError("allocated from a NetBox that is not there")
        assert "127.0.0.1" not in message and "the-lenders-secret-url" not in message, message
        assert "the pool's NetBox" in message, message
    finally:
        await backend.close()


async def test_a_restores_failure_on_a_claims_event_never_names_the_url() -> None:
    backend = NetboxBackend(BackendContext(lending_kube()), fast_settings())
    pool = global_pool("shared")
    allocation = Allocation(address="10.0.0.5", prefix=24)
    try:
        try:
            await backend.restore(PoolRef.from_object(pool), pool, new_claim("tenant", "c"), allocation)
        except BackendError as error:
            message = error.message
        else:
            raise AssertionError("restored into a NetBox that is not there")
        assert "127.0.0.1" not in message and "the pool's NetBox" in message, message
    finally:
        await backend.close()


async def test_pools_created_and_deleted_leave_no_per_pool_state() -> None:
    backend = NetboxBackend(BackendContext(lending_kube()), churn_settings())
    try:
        before = sizes(backend)
        pools = [global_pool(f"pool-{n}") for n in range(20)]
        for pool in pools:
            backend.observe_pool(GLOBAL_NETBOX_POOL, None, pool)
        reports = await asyncio.gather(*(backend.report(PoolRef.from_object(p), p, []) for p in pools))
        assert not any(r.ready for r in reports)
        for pool in pools:
            ref = PoolRef.from_object(pool)
            backend.ledger.index(ref)  # as an allocation does
            with contextlib.suppress(BackendError):  # the pool is going: its last claim's release
                await backend.release(ref, None, new_claim("tenant", "c"), None)
            backend.observe_pool(GLOBAL_NETBOX_POOL, pool, None)
        assert sizes(backend) == before
    finally:
        await backend.close()


class DeletingPacer(CountingPacer):
    """Observes its pool's deletion at the first wait: the deletion comes while the operation runs."""

    def __init__(self, backend: NetboxBackend, body: Object) -> None:
        super().__init__()
        self.backend, self.body = backend, body

    async def wait(self) -> None:
        await super().wait()
        if self.waits == 1:
            self.backend.observe_pool(GLOBAL_NETBOX_POOL, self.body, None)


async def churn_cycle(backend: NetboxBackend, cycle: int) -> None:
    """A pool through its life (its NetBox unreachable), then the repair loop's calls with a pool whose deletion
    was observed before them or while they ran."""
    claim = new_claim("tenant", f"c{cycle}")
    allocation = Allocation("10.0.0.5", 24)
    for name in (f"pool-{cycle}", f"stale-{cycle}", f"late-{cycle}"):
        body = global_pool(name)
        ref = PoolRef.from_object(body)
        backend.observe_pool(GLOBAL_NETBOX_POOL, None, body)
        assert not (await backend.report(ref, body, [])).ready
        with contextlib.suppress(BackendError):
            await backend.allocate(ref, body, claim)
        if name.startswith("late"):
            with contextlib.suppress(BackendError):
                await backend.list_holdings(ref, body, DeletingPacer(backend, body))
            continue
        if name.startswith("pool"):
            with contextlib.suppress(BackendError):
                await backend.release(ref, body, claim, allocation)
        backend.observe_pool(GLOBAL_NETBOX_POOL, body, None)
        if name.startswith("stale"):
            await backend.report(ref, body, [])
            await backend.outside_pool(ref, body, ["10.0.0.5"])
            for call in (
                backend.list_holdings(ref, body, CountingPacer()),
                backend.restore(ref, body, claim, allocation),
                backend.release(ref, None, claim, allocation),
            ):
                with contextlib.suppress(BackendError):
                    await call


async def churn_growth(cycles: int = 3) -> dict[str, tuple[int, int]]:
    backend = NetboxBackend(BackendContext(lending_kube()), churn_settings())
    try:
        await churn_cycle(backend, 0)  # warm-up
        await settled()
        before = footprint(backend)
        for cycle in range(1, cycles + 1):
            await churn_cycle(backend, cycle)
        await settled()
        return footprint_growth(before, footprint(backend))
    finally:
        await backend.close()


async def settled() -> None:
    """Let retired clients finish closing (their close runs in a task)."""
    for _ in range(50):
        if len(asyncio.all_tasks()) <= 1:
            return
        await asyncio.sleep(0.02)


async def test_churned_pools_and_stale_operations_leave_the_footprint_unchanged() -> None:
    assert await churn_growth() == {}


@contextlib.contextmanager
def _kept(self: LivePools, ref: PoolRef) -> Iterator[None]:
    yield


CLEANUPS: dict[str, tuple[object, str, object, str]] = {
    # name: (owner, attribute, no-op replacement, a path that must then grow)
    "Resolver.forget": (Resolver, "forget", lambda self, ref: None, "NetboxBackend.resolver.known"),
    "LivePools.operation": (LivePools, "operation", _kept, "NetboxBackend.resolver.known"),
}


@pytest.mark.parametrize("cleanup", sorted(CLEANUPS))
async def test_each_cleanup_is_needed(cleanup: str, monkeypatch: pytest.MonkeyPatch) -> None:
    owner, attribute, replacement, path = CLEANUPS[cleanup]
    monkeypatch.setattr(owner, attribute, replacement)
    grown = await churn_growth(cycles=2)
    assert path in grown, grown
