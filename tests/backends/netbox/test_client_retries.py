"""Retries against the real NetBox, with faults injected by the proxy of tools/netbox_proxy.py.

The intent (backends/netbox/client.py and allocator.py): idempotent calls (GETs, DELETE, PATCH) are retried with
exponential backoff on 5xx answers and connection errors, up to `ClientSettings.attempts`; a burst longer than that
becomes NetBoxUnreachable (pool) / PoolNotReady (claims), and recovers by itself. The allocating POST is tried
exactly once per call: a 5xx or a lost connection is an unknown outcome, resolved by looking the claim up by UID;
only when NetBox holds nothing for the claim is it asked again (`retry_after`), so a 503 (NetBox did nothing) costs
a lookup and a short wait, and a POST that NetBox carried out is never POSTed again.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from backends.netbox import NetboxBackend
from backends.netbox.client import ClientSettings
from backends.netbox.reasons import RETRY_UNREACHABLE
from backends.netbox.spec import ANNOTATION_IP_ID, CLAIM_UID_FIELD
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    BackendContext,
    BackendError,
    ClaimContext,
    PoolNotReadyError,
    PoolRef,
)
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.netbox_backend import create_secret, fast_settings, marked, new_claim, pool_of, prefix
from tools.netbox_proxy import Event, NetboxProxy

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

Object = dict[str, Any]

ATTEMPTS = 4
BACKOFF = 0.3  # delays after failed attempts 0, 1, 2: 0.3, 0.6, 1.2 s (±20 % jitter)
UNKNOWN_RETRY = 0.5
SOURCE_LOOKUP = "/api/ipam/prefixes/?"  # the GET that resolves a source given by CIDR
ALLOCATE = "available-ips"


def settings() -> Any:
    client = ClientSettings(attempts=ATTEMPTS, backoff=BACKOFF, max_backoff=5.0, connect_timeout=2.0, read_timeout=15.0)
    return fast_settings(client=client, unknown_retry_seconds=UNKNOWN_RETRY)


@pytest_asyncio.fixture
async def backend(kube: KubeClient) -> AsyncIterator[NetboxBackend]:
    instance = NetboxBackend(BackendContext(kube=kube), settings())
    yield instance
    await instance.close()


async def proxied_pool(kube: KubeClient, namespace: str, netbox: NetBoxServer, proxy: NetboxProxy, cidr: str) -> Object:
    name = f"p{cidr.split('.')[1]}"
    await create_secret(kube, namespace, netbox, name=name, url=proxy.url)
    return pool_of(namespace, name, [prefix(cidr)], secret=name)


def lookup_of(claim: ClaimContext) -> str:
    """The path part of the claim's UID lookup (GET /api/ipam/ip-addresses/?tag=…&cf_capi_claim_uid=<uid>)."""
    return f"cf_{CLAIM_UID_FIELD}={claim.uid}"


def trace(proxy: NetboxProxy, claim: ClaimContext, since: float = 0.0) -> list[str]:
    """What happened to the allocating POSTs (all of them since `since`) and the claim's UID lookups, in order."""
    lookup = lookup_of(claim)
    return [
        f"{e.method} {e.outcome}"
        for e in proxy.events()
        if e.start >= since
        and ((e.method == "POST" and ALLOCATE in e.path) or (e.method == "GET" and lookup in e.path))
    ]


def assert_backoff(attempts: list[Event]) -> list[float]:
    """The pauses between consecutive attempts grow as the backoff says: at least 80 % of BACKOFF·2^i each."""
    gaps = [later.start - earlier.end for earlier, later in itertools.pairwise(attempts)]
    for index, gap in enumerate(gaps):
        nominal = BACKOFF * 2**index
        assert 0.8 * nominal <= gap <= 1.2 * nominal + 1.0, f"pause {index} was {gap:.3f} s, not about {nominal} s"
    if len(gaps) >= 2:
        assert gaps[-1] > gaps[0], f"the pauses did not grow: {gaps}"
    return gaps


def forwarded_posts(proxy: NetboxProxy) -> list[str]:
    return [f for f in proxy.faults.forwarded if f.startswith("POST") and ALLOCATE in f]


async def allocate_like_the_reconciler(
    backend: NetboxBackend, pool: Object, claim: ClaimContext, *, tries: int = 6
) -> tuple[Allocation, list[tuple[float, BackendError]]]:
    """Allocate as the reconciler does: after a BackendError, wait its retry_after and call again."""
    failures: list[tuple[float, BackendError]] = []
    for _ in range(tries):
        try:
            return await backend.allocate(PoolRef.from_object(pool), pool, claim), failures
        except BackendError as error:
            failures.append((time.monotonic(), error))
            assert error.retry_after is not None, f"no retry_after on {error!r}"
            await asyncio.sleep(error.retry_after)
    raise AssertionError(f"not allocated after {tries} tries: {[e.message for _, e in failures]}")


async def test_a_read_is_retried_with_growing_backoff_after_503s_and_a_dropped_connection(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.81.0.0/29")
    with NetboxProxy(netbox.url) as proxy:
        pool = await proxied_pool(kube, namespace, netbox, proxy, "10.81.0.0/29")
        proxy.answer_next(503, ATTEMPTS - 1, "GET", SOURCE_LOOKUP)
        report = await backend.report(PoolRef.from_object(pool), pool, [])
        assert report.ready, report.message
        attempts = proxy.events("GET", SOURCE_LOOKUP)
        assert [e.outcome for e in attempts] == ["answered 503"] * (ATTEMPTS - 1) + ["forwarded 200"]
        gaps = assert_backoff(attempts)
        print(f"\npauses between the GET's attempts: {', '.join(f'{g:.3f} s' for g in gaps)}")
        # A connection dropped before NetBox saw the GET is retried the same way.
        proxy.drop_next("GET", SOURCE_LOOKUP)
        report = await backend.report(PoolRef.from_object(pool), pool, [])
        assert report.ready, report.message
        assert [e.outcome for e in proxy.events("GET", SOURCE_LOOKUP)[ATTEMPTS:]] == ["dropped", "forwarded 200"]
        # Nothing else failed on the way: the allocation that follows costs its one POST.
        claim = new_claim(namespace, "after-retries")
        allocation = await backend.allocate(PoolRef.from_object(pool), pool, claim)
        assert [r.address for r in marked(netbox, claim.uid)] == [f"{allocation.address}/29"]
        assert trace(proxy, claim) == ["POST forwarded 201"]


async def test_a_burst_longer_than_the_retries_makes_the_pool_unreachable_then_recovers(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.82.0.0/29")
    with NetboxProxy(netbox.url) as proxy:
        pool = await proxied_pool(kube, namespace, netbox, proxy, "10.82.0.0/29")
        proxy.answer_next(502, 2 * ATTEMPTS, "GET", SOURCE_LOOKUP)  # the report's attempts, then the allocation's
        report = await backend.report(PoolRef.from_object(pool), pool, [])
        assert (report.ready, report.reason) == (False, "NetBoxUnreachable"), report.message
        assert "answered 502" in report.message and "check that NetBox is running" in report.message
        assert len(proxy.events("GET", SOURCE_LOOKUP)) == ATTEMPTS, "not exactly the retry budget"
        claim = new_claim(namespace, "during-burst")
        with pytest.raises(PoolNotReadyError) as failure:
            await backend.allocate(PoolRef.from_object(pool), pool, claim)
        assert "answered 502" in failure.value.message
        assert failure.value.retry_after == RETRY_UNREACHABLE
        assert len(proxy.events("GET", SOURCE_LOOKUP)) == 2 * ATTEMPTS
        assert proxy.events("POST", ALLOCATE) == [], "allocated from a source that could not be resolved"
        # The burst is over: the pool is ready again and the claim gets exactly one address.
        report = await backend.report(PoolRef.from_object(pool), pool, [])
        assert report.ready, report.message
        allocation = await backend.allocate(PoolRef.from_object(pool), pool, claim)
        assert [r.address for r in marked(netbox, claim.uid)] == [f"{allocation.address}/29"]


async def test_a_post_that_never_reached_netbox_is_looked_up_then_asked_again(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.83.0.0/29")
    with NetboxProxy(netbox.url) as proxy:
        pool = await proxied_pool(kube, namespace, netbox, proxy, "10.83.0.0/29")
        assert (
            await backend.report(PoolRef.from_object(pool), pool, [])
        ).ready  # ownership marks and sources, before the faults
        claim = new_claim(namespace, "refused")
        proxy.answer_next(503, 1, "POST", ALLOCATE)  # NetBox (behind a gateway) did nothing
        proxy.drop_next("POST", ALLOCATE)  # the connection is reset before NetBox sees the request
        allocation, failures = await allocate_like_the_reconciler(backend, pool, claim)
        # Each failed POST was followed by a lookup of the claim's UID (it found nothing), never by a blind re-POST;
        # the next POST came only after the retry_after the claim was given.
        assert trace(proxy, claim) == [
            "POST answered 503",
            "GET forwarded 200",
            "POST dropped",
            "GET forwarded 200",
            "POST forwarded 201",
        ]
        assert [type(e) for _, e in failures] == [AllocationFailedError, AllocationFailedError]
        assert "answered 503" in failures[0][1].message and "asked again" in failures[0][1].message
        assert "connection closed without an answer" in failures[1][1].message
        assert all(e.retry_after == UNKNOWN_RETRY for _, e in failures)
        posts = proxy.events("POST", ALLOCATE)
        for earlier, later in itertools.pairwise(posts):
            assert later.start - earlier.end >= UNKNOWN_RETRY, "asked again before its retry_after"
        assert len(forwarded_posts(proxy)) == 1
        records = marked(netbox, claim.uid)
        assert [r.address for r in records] == [f"{allocation.address}/29"]
        assert allocation.annotations[ANNOTATION_IP_ID] == str(records[0].id)


async def test_a_post_lost_after_netbox_did_it_is_resolved_by_the_lookup_not_posted_again(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.84.0.0/29")
    with NetboxProxy(netbox.url) as proxy:
        pool = await proxied_pool(kube, namespace, netbox, proxy, "10.84.0.0/29")
        assert (await backend.report(PoolRef.from_object(pool), pool, [])).ready
        # 1. The answer to the POST is lost, and the lookup's first answers are 503: the lookup is retried with
        #    backoff and finds the address NetBox made. One call, one POST.
        claim = new_claim(namespace, "lost")
        proxy.lose_next("POST", ALLOCATE)
        proxy.answer_next(503, ATTEMPTS - 1, "GET", lookup_of(claim))
        allocation = await backend.allocate(PoolRef.from_object(pool), pool, claim)
        assert trace(proxy, claim) == ["POST lost", *["GET answered 503"] * (ATTEMPTS - 1), "GET forwarded 200"]
        assert_backoff(proxy.events("GET", lookup_of(claim)))
        records = marked(netbox, claim.uid)
        assert [r.address for r in records] == [f"{allocation.address}/29"], "allocated twice, or leaked"
        assert allocation.annotations[ANNOTATION_IP_ID] == str(records[0].id)
        # 2. The lookup itself fails beyond its retries: the claim is not ready, and its next attempt looks it up
        #    first and uses the address made by the lost POST; it is not POSTed again.
        other = new_claim(namespace, "lost-then-unreachable")
        since = time.monotonic()
        proxy.lose_next("POST", ALLOCATE)
        proxy.answer_next(503, ATTEMPTS, "GET", lookup_of(other))
        with pytest.raises(PoolNotReadyError) as failure:
            await backend.allocate(PoolRef.from_object(pool), pool, other)
        assert "answered 503" in failure.value.message
        held = await backend.allocate(PoolRef.from_object(pool), pool, other)
        assert trace(proxy, other, since) == ["POST lost", *["GET answered 503"] * ATTEMPTS, "GET forwarded 200"]
        records = marked(netbox, other.uid)
        assert [r.address for r in records] == [f"{held.address}/29"], "allocated twice, or leaked"
        assert held.address != allocation.address
        assert len(forwarded_posts(proxy)) == 2, "a POST was sent again after NetBox had carried it out"
