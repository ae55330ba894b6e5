"""The NetBox backend in process, on an in-memory API server (no NetBox: the Secret names a port where nothing
listens): a Global pool's claims never see the URL of the Secret it uses, and pools created and deleted leave
nothing behind in the backend's per-pool state.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from backends.netbox import NetboxBackend
from backends.netbox.spec import GLOBAL_NETBOX_POOL
from ipam_provider.backend.contract import Allocation, BackendContext, BackendError, PoolRef
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS
from tests.backends.netbox.conftest import fast_settings, global_netbox_pool, new_claim, prefix
from tests.ipam_provider.fake_kube import FakeKube

Object = dict[str, Any]
SECRET_URL = "http://127.0.0.1:9/the-lenders-secret-url"  # nothing listens here
LENDER = "operator"


def lending_kube() -> FakeKube:
    kube = FakeKube()
    kube.put(NAMESPACES, {"metadata": {"name": LENDER, "labels": {SECRET_REFS_LABEL: "true"}}})
    body = {"metadata": {"name": "netbox", "namespace": LENDER}, "stringData": {"url": SECRET_URL, "token": "t"}}
    kube.put(SECRETS, body)
    return kube


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
    backend = NetboxBackend(BackendContext(lending_kube()), fast_settings())
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
