"""What the backend must never do, against the real NetBox (Secrets in the real API server): hand out a gateway,
trust a UID field NetBox does not filter by, give an IPv4 address a /64, look Ready while every claim fails,
let a copied IPAddress steal or free another claim's address, or allocate twice after a lost POST without a
Unique UID field. Each test here failed before its fix.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from backends.netbox import NetboxBackend, reasons
from backends.netbox.spec import ANNOTATION_IP_ID, CLAIM_REF_FIELD, CLAIM_UID_FIELD
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    BackendContext,
    BackendError,
    ClaimContext,
    PoolNotReadyError,
    PoolRef,
    PoolReport,
)
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.netbox_backend import (
    READ_TYPES,
    claim_uid_of,
    create_secret,
    fast_settings,
    marked,
    new_claim,
    owned_addresses,
    pool_of,
    prefix,
    recheck_ownership,
    record_gateway,
    unique_name,
    user_token,
)
from tools.netbox_proxy import NetboxProxy

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer


async def test_a_gateway_inside_a_source_must_be_recorded(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.80.0.0/29")
    netbox.create_ip_range("10.80.1.10/24", "10.80.1.12/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "gw", [prefix("10.80.0.0/29", gateway="10.80.0.1")])
    report = await backend.report(PoolRef.from_object(pool), pool, [])
    assert (report.ready, report.reason) == (False, "GatewayNotRecorded"), report.message
    assert "record 10.80.0.1/29 in NetBox" in report.message
    with pytest.raises(PoolNotReadyError, match=r"10\.80\.0\.1"):
        await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "early"))
    assert owned_addresses(netbox, parent="10.80.0.0/29") == []
    record_gateway(netbox, "10.80.0.1/29")
    assert (await backend.report(PoolRef.from_object(pool), pool, [])).ready
    allocation = await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "after"))
    assert (allocation.address, allocation.gateway) == ("10.80.0.2", "10.80.0.1")
    # A gateway NetBox never hands out from the source (outside a range) needs no record.
    outside = pool_of(namespace, "gw-range", [{"ipRange": {"start": "10.80.1.10", "end": "10.80.1.12"}}])
    outside["spec"]["gateway"] = "10.80.1.1"
    assert (await backend.report(PoolRef.from_object(outside), outside, [])).ready


async def test_a_gateway_netbox_hands_out_is_deleted_not_given(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.81.0.0/29")
    gateway = record_gateway(netbox, "10.81.0.1/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "gw-guard", [prefix("10.81.0.0/29", gateway="10.81.0.1")])
    assert (
        await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "first"))
    ).address == "10.81.0.2"
    # An IPAddress naming the gateway is refused.
    with pytest.raises(AllocationFailedError, match="gateway"):
        await backend.allocate(
            PoolRef.from_object(pool), pool, new_claim(namespace, "adopt-gw"), existing=Allocation("10.81.0.1", 29)
        )
    gateway.delete()  # someone removes the record while the pool's sources are cached: NetBox offers .1 again
    claim = new_claim(namespace, "second")
    with pytest.raises(PoolNotReadyError, match="gateway"):
        await backend.allocate(PoolRef.from_object(pool), pool, claim)
    assert marked(netbox, claim.uid) == [], "the gateway NetBox handed out was kept"
    assert list(netbox.api().ipam.ip_addresses.filter(address="10.81.0.1")) == []
    report = await backend.report(PoolRef.from_object(pool), pool, [])
    assert (report.ready, report.reason) == (False, "GatewayNotRecorded")


async def test_a_uid_field_netbox_does_not_filter_by_is_refused(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.82.0.0/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "filter", [prefix("10.82.0.0/29")])
    assert (await backend.report(PoolRef.from_object(pool), pool, [])).ready  # creates the fields
    field = netbox.api().extras.custom_fields.get(name=CLAIM_UID_FIELD)
    field.update({"filter_logic": "disabled"})
    try:
        recheck_ownership(backend)
        report = await backend.report(PoolRef.from_object(pool), pool, [])
        assert (report.ready, report.reason) == (False, "CustomFieldInvalid"), report.message
        assert "filter logic" in report.message and "Exact" in report.message
        with pytest.raises(PoolNotReadyError, match="filter logic"):
            await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "unfiltered"))
    finally:
        field.update({"filter_logic": "exact"})
    recheck_ownership(backend)
    assert (await backend.report(PoolRef.from_object(pool), pool, [])).ready


async def test_prefix_length_longer_than_the_family(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    source = netbox.create_prefix("10.83.0.0/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "len", [prefix(id=source.id, prefixLength=64)])  # by id: only NetBox knows the family
    report = await backend.report(PoolRef.from_object(pool), pool, [])
    assert (report.ready, report.reason) == (False, "InvalidConfiguration"), report.message
    assert "prefixLength 64" in report.message and "at most 32" in report.message
    with pytest.raises(PoolNotReadyError, match="prefixLength"):
        await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "len"))
    assert owned_addresses(netbox, parent="10.83.0.0/29") == []
    ok = pool_of(namespace, "len-ok", [prefix("10.83.0.0/29", prefixLength=32)])
    assert (await backend.allocate(PoolRef.from_object(ok), ok, new_claim(namespace, "len-ok"))).prefix == 32


async def test_a_read_only_token_shows_on_the_pool(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.84.0.0/29")
    await create_secret(kube, namespace, netbox)
    admin_pool = pool_of(namespace, "admin", [prefix("10.84.0.0/29")])
    assert (await backend.report(PoolRef.from_object(admin_pool), admin_pool, [])).ready  # the ownership marks exist
    username = unique_name("reader")
    token = user_token(netbox, username, view=READ_TYPES)
    await create_secret(kube, namespace, netbox, name="reader", token=token)
    pool = pool_of(namespace, "reader", [prefix("10.84.0.0/29")], secret="reader")
    assert (await backend.report(PoolRef.from_object(pool), pool, [])).ready  # every GET works
    with pytest.raises(PoolNotReadyError, match="token"):
        await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "denied"))
    report = await backend.report(PoolRef.from_object(pool), pool, [])
    assert (report.ready, report.reason) == (False, "AuthenticationFailed"), report.message
    assert "last allocation" in report.message and token.split(".")[-1] not in report.message
    assert report.status_fields()["ipAddresses"]["free"] == 6  # the counts are still reported
    # The administrator grants the permission: the next allocation succeeds, and the pool is Ready again.
    api = netbox.api()
    user = api.users.users.get(username=username)
    api.users.permissions.create(
        name=f"{username}-add", object_types=["ipam.ipaddress"], actions=["add"], users=[user.id]
    )
    assert (
        await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "allowed"))
    ).address == "10.84.0.1"
    assert (await backend.report(PoolRef.from_object(pool), pool, [])).ready


async def test_a_copied_ipaddress_neither_steals_nor_frees(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.85.0.0/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "copy", [prefix("10.85.0.0/29")])
    ref = PoolRef.from_object(pool)
    victim = new_claim(namespace, "victim")
    held = await backend.allocate(PoolRef.from_object(pool), pool, victim)
    record = netbox.api().ipam.ip_addresses.get(int(held.annotations[ANNOTATION_IP_ID]))
    assert record.custom_fields[CLAIM_REF_FIELD] == f"{namespace}/victim"
    # Someone copies the victim's IPAddress manifest (annotations included) for another claim.
    thief = new_claim(namespace, "thief")
    copied = copy.deepcopy(held)
    with pytest.raises(AllocationFailedError, match="not taken over"):
        await backend.allocate(PoolRef.from_object(pool), pool, thief, existing=copied)
    assert [claim_uid_of(r) for r in marked(netbox, victim.uid)] == [victim.uid], "the address was re-keyed"
    await backend.release(ref, pool, thief, copied)
    assert netbox.api().ipam.ip_addresses.get(record.id) is not None, "another claim's address was freed"
    # The same claim after a restore or clusterctl move (same namespace/name, new UID) is re-keyed, and releases.
    moved = ClaimContext(namespace=namespace, name="victim", uid="moved-" + victim.uid)
    again = await backend.allocate(PoolRef.from_object(pool), pool, moved, existing=held)
    assert again.address == held.address and [r.id for r in marked(netbox, moved.uid)] == [record.id]
    await backend.release(ref, pool, moved, held)  # the annotation still names the old UID
    assert netbox.api().ipam.ip_addresses.get(record.id) is None


async def test_a_lost_post_without_unique_field_is_not_allocated_twice(
    kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.86.0.0/29")
    await create_secret(kube, namespace, netbox)
    setup = pool_of(namespace, "setup", [prefix("10.86.0.0/29")])
    assert (await _report_once(kube, setup)).ready  # the ownership marks exist
    field = netbox.api().extras.custom_fields.get(name=CLAIM_UID_FIELD)
    client = dataclasses.replace(fast_settings().client, deadline=1.0)
    settings = fast_settings(uncertain_seconds=30.0, client=client)
    backend = NetboxBackend(BackendContext(kube=kube), settings)
    field.update({"unique": False})
    try:
        with NetboxProxy(netbox.url) as proxy:
            await create_secret(kube, namespace, netbox, name="late", url=proxy.url)
            pool = pool_of(namespace, "late", [prefix("10.86.0.0/29")], secret="late")
            # Every call has the 1 s deadline, which a loaded machine can exceed: look until a report gets through.
            report = await _report_until_ready(backend, pool, within=20.0)
            assert report.ready and "not Unique" in report.message
            claim = new_claim(namespace, "late")
            # The POST reaches NetBox 3 s late, long after the client gave up on it (deadline 1 s).
            proxy.delay_next("POST", "available-ips", 3.0, before=True)
            started = asyncio.get_running_loop().time()
            allocation = await _allocate_until_done(backend, pool, claim, within=20.0)
            assert proxy.faults.delayed, "the fault was not injected"
            await asyncio.sleep(max(0.0, started + 4.5 - asyncio.get_running_loop().time()))  # the late POST is in
            records = marked(netbox, claim.uid)
            assert [r.address for r in records] == [f"{allocation.address}/29"], "allocated twice"
            await backend.release(PoolRef.from_object(pool), pool, claim, allocation)
            assert marked(netbox, claim.uid) == []
    finally:
        field.update({"unique": True})
        await backend.close()


async def _report_once(kube: KubeClient, pool: Any) -> Any:
    backend = NetboxBackend(BackendContext(kube=kube), fast_settings())
    try:
        return await backend.report(PoolRef.from_object(pool), pool, [])
    finally:
        await backend.close()


async def _report_until_ready(backend: NetboxBackend, pool: Any, within: float) -> PoolReport:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        report = await backend.report(PoolRef.from_object(pool), pool, [])
        if report.ready or report.reason != reasons.UNREACHABLE or asyncio.get_running_loop().time() > deadline:
            return report
        await asyncio.sleep(0.5)


async def _allocate_until_done(backend: NetboxBackend, pool: Any, claim: ClaimContext, within: float) -> Allocation:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await backend.allocate(PoolRef.from_object(pool), pool, claim)
        except BackendError as error:  # retried as the reconciler retries: also a lookup past the 1 s deadline
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(error.retry_after or 0.5)
