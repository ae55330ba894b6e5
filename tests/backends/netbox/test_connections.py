"""The NetBox connection layer against the real NetBox (Secrets in the real API server): the overall deadline of a
call, a closed client, a token rotated while another pool still works with the old one, v1 tokens, the token
never in any log record, and the owner tag a token may not create.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import pytest
import structlog

from backends.netbox import NetboxBackend
from backends.netbox.client import ClientClosedError, Endpoint, NetboxClient
from backends.netbox.spec import OWNER_TAG
from ipam_provider.backend.contract import BackendContext, PoolNotReadyError, PoolRef
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import SECRETS
from tests.support.cluster import wait_for
from tests.support.netbox_backend import (
    READ_TYPES,
    create_secret,
    create_token,
    fast_settings,
    get_or_create_tag,
    marked,
    new_claim,
    pool_of,
    prefix,
    recheck_ownership,
    unique_name,
    user_token,
)
from tools.netbox_proxy import NetboxProxy

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer


# Long enough for a healthy NetBox answer on a loaded 2-core machine, short enough to keep the test quick.
DEADLINE = 3.0


async def test_a_call_ends_within_its_deadline(kube: KubeClient, namespace: str, netbox: NetBoxServer) -> None:
    netbox.create_prefix("10.90.0.0/29")
    settings = fast_settings(client=dataclasses.replace(fast_settings().client, deadline=DEADLINE))
    backend = NetboxBackend(BackendContext(kube=kube), settings)
    try:
        with NetboxProxy(netbox.url) as proxy:
            await create_secret(kube, namespace, netbox, name="slow", url=proxy.url)
            pool = pool_of(namespace, "slow", [prefix("10.90.0.0/29")], secret="slow")
            # A GET whose answer comes after 3 deadlines (each retry's too): transient, reported at once.
            proxy.delay_next("GET", "/api/ipam/prefixes/", 3 * DEADLINE)
            started = time.monotonic()
            report = await backend.report(PoolRef.from_object(pool), pool, [])
            assert time.monotonic() - started < 2 * DEADLINE, "the GET was waited for beyond the deadline"
            assert (report.ready, report.reason) == (False, "NetBoxUnreachable"), report.message
            assert f"did not finish within {DEADLINE:.0f} s" in report.message
            assert (await backend.report(PoolRef.from_object(pool), pool, [])).ready
            # A POST whose answer comes after 3 deadlines: an unknown outcome, resolved by the UID lookup.
            claim = new_claim(namespace, "slow-post")
            proxy.delay_next("POST", "available-ips", 3 * DEADLINE)
            started = time.monotonic()
            allocation = await backend.allocate(PoolRef.from_object(pool), pool, claim)
            assert time.monotonic() - started < 2 * DEADLINE, "the POST was waited for beyond the deadline"
            assert [r.address for r in marked(netbox, claim.uid)] == [f"{allocation.address}/29"]
    finally:
        await backend.close()


async def test_a_closed_client_raises_a_backend_error(netbox: NetBoxServer) -> None:
    client = NetboxClient(Endpoint(netbox.url, netbox.token), fast_settings().client)
    assert await client.call("GET status", lambda api: api.status())
    await client.close()
    with pytest.raises(ClientClosedError, match="was closed"):
        await client.call("GET status", lambda api: api.status())


async def test_a_rotated_token_never_closes_a_client_in_use(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.91.0.0/29")
    await create_secret(kube, namespace, netbox)
    first = pool_of(namespace, "first", [prefix("10.91.0.0/29")])
    second = pool_of(namespace, "second", [prefix("10.91.0.0/29")])
    assert (await backend.report(PoolRef.from_object(first), first, [])).ready
    parsed_first = backend.resolver.parse(PoolRef.from_object(first), first)
    parsed_second = backend.resolver.parse(PoolRef.from_object(second), second)
    rotated = create_token(netbox, 1)
    async with backend.resolver.connections.use(parsed_first) as old:  # the first pool is in the middle of an operation
        await kube.patch(SECRETS, "netbox", {"stringData": {"token": rotated}}, namespace)
        backend.resolver.connections.invalidate(parsed_second)
        new = await backend.resolver.connections.client(parsed_second)
        assert new is not old and not old.closed
        assert await old.call("GET status", lambda api: api.status())  # still works with the old token

    async def old_closed() -> bool:
        return old.closed

    await wait_for(old_closed, timeout=10.0, interval=0.05, message="the retired client to be closed")
    # The second pool works with the new client; the old one's cached ownership marks are dropped.
    assert (
        await backend.allocate(PoolRef.from_object(second), second, new_claim(namespace, "rotated"))
    ).address == "10.91.0.1"
    assert new.ownership is not None


async def test_a_v1_token_allocates_and_releases(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.92.0.0/29")
    token = create_token(netbox, 1, version=1)
    assert not token.startswith("nbt_") and len(token) == 40
    await create_secret(kube, namespace, netbox, name="v1", token=token)
    pool = pool_of(namespace, "v1", [prefix("10.92.0.0/29")], secret="v1")
    claim = new_claim(namespace, "v1")
    allocation = await backend.allocate(PoolRef.from_object(pool), pool, claim)
    assert [r.address for r in marked(netbox, claim.uid)] == [f"{allocation.address}/29"]
    await backend.release(PoolRef.from_object(pool), pool, claim, allocation)
    assert marked(netbox, claim.uid) == []


async def test_the_token_never_appears_in_logs(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer, caplog: pytest.LogCaptureFixture
) -> None:
    netbox.create_prefix("10.93.0.0/29")
    bad = netbox.token[:-8] + "deadbeef"
    await create_secret(kube, namespace, netbox)
    await create_secret(kube, namespace, netbox, name="bad", token=bad)
    await create_secret(kube, namespace, netbox, name="down", url="http://127.0.0.1:9")
    pools = [pool_of(namespace, name, [prefix("10.93.0.0/29")], secret=name) for name in ("netbox", "bad", "down")]
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="urllib3")  # kubernetes_asyncio sets it to WARNING
    with structlog.testing.capture_logs() as records:
        for pool in pools:
            await backend.report(PoolRef.from_object(pool), pool, [])
            claim = new_claim(namespace, f"log-{pool['metadata']['name']}")
            try:
                allocation = await backend.allocate(PoolRef.from_object(pool), pool, claim)
            except PoolNotReadyError:
                continue
            await backend.release(PoolRef.from_object(pool), pool, claim, allocation)
    events = {r["event"] for r in records}
    assert {"netbox address held", "address released", "allocation failed", "netbox call retried"} <= events
    assert any(r.levelno == logging.DEBUG for r in caplog.records), "stdlib DEBUG records were not captured"
    texts = [repr(r) for r in records] + [r.getMessage() for r in caplog.records] + [caplog.text]
    for secret in (netbox.token, bad, netbox.token.split(".")[-1], bad.split(".")[-1]):
        assert not [t for t in texts if secret in t]


async def test_an_owner_tag_the_token_may_not_create(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.94.0.0/29")
    token = user_token(netbox, unique_name("no-tags"), view=READ_TYPES, write=["ipam.ipaddress"])
    await create_secret(kube, namespace, netbox, name="no-tags", token=token)
    pool = pool_of(namespace, "no-tags", [prefix("10.94.0.0/29")], secret="no-tags")
    existing = netbox.api().extras.tags.get(slug=OWNER_TAG)
    if existing is not None:
        existing.delete()
    try:
        report = await backend.report(PoolRef.from_object(pool), pool, [])
        assert (report.ready, report.reason) == (False, "TagMissing"), report.message
        assert f"name and slug {OWNER_TAG!r}" in report.message and "Tags" in report.message
        with pytest.raises(PoolNotReadyError, match=OWNER_TAG):
            await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "no-tag"))
    finally:
        get_or_create_tag(netbox, OWNER_TAG)
    recheck_ownership(backend)
    assert (await backend.report(PoolRef.from_object(pool), pool, [])).ready
