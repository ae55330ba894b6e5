"""The NetBox backend called directly (as the reconciler calls it), against the real NetBox; Secrets live in the
real API server. These tests count HTTP requests and inject faults the controller tests cannot reach: a lost answer
to the allocating POST, TLS, a full source, an address made before a crash, a restore that changed claim UIDs.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest

from backends.netbox import NetboxBackend
from backends.netbox.spec import ANNOTATION_CLAIM_UID, ANNOTATION_IP_ID, CLAIM_REF_FIELD, CLAIM_UID_FIELD, OWNER_TAG
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    BackendContext,
    ClaimContext,
    PoolExhaustedError,
    PoolNotReadyError,
    PoolRef,
    ReleaseImpossibleError,
)
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import SECRETS as SECRET_RESOURCE
from tests.support.netbox_backend import (
    READ_TYPES,
    claim_uid_of,
    client_of,
    create_secret,
    fast_settings,
    get_or_create_field,
    ip_range,
    marked,
    new_claim,
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

Object = dict[str, Any]


async def test_steady_state_costs_at_most_one_request(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.50.0.0/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "steady", [prefix("10.50.0.0/24")])
    await backend.allocate(
        PoolRef.from_object(pool), pool, new_claim(namespace, "warm-up")
    )  # ownership marks and sources, once
    client = await client_of(backend, pool)
    before = client.requests_sent
    claims = [new_claim(namespace, f"c{i}") for i in range(20)]
    allocations = [await backend.allocate(PoolRef.from_object(pool), pool, c) for c in claims]
    assert client.requests_sent - before == 20, "a new claim must cost exactly one NetBox request"
    assert len({a.address for a in allocations}) == 20
    before = client.requests_sent
    again = [
        await backend.allocate(PoolRef.from_object(pool), pool, c, existing=a)
        for c, a in zip(claims, allocations, strict=True)
    ]
    assert again == allocations
    assert client.requests_sent == before, "a fulfilled claim must cost no NetBox request"
    before = client.requests_sent
    await backend.release(PoolRef.from_object(pool), pool, claims[0], allocations[0])
    assert client.requests_sent - before == 2  # GET (check the marks) + DELETE
    assert marked(netbox, claims[0].uid) == []


async def test_lost_answer_to_the_post_is_resolved_by_the_claim_uid(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.51.0.0/29")
    with NetboxProxy(netbox.url) as proxy:
        await create_secret(kube, namespace, netbox, name="via-proxy", url=proxy.url)
        pool = pool_of(namespace, "lossy", [prefix("10.51.0.0/29")], secret="via-proxy")
        claim = new_claim(namespace, "lost")
        proxy.lose_next("POST", "available-ips")
        allocation = await backend.allocate(PoolRef.from_object(pool), pool, claim)
        assert proxy.faults.lost, "the fault was not injected"
        records = marked(netbox, claim.uid)
        assert [r.address for r in records] == [f"{allocation.address}/29"], "allocated twice, or leaked"
        assert allocation.annotations[ANNOTATION_IP_ID] == str(records[0].id)
        # The next claim is served normally, from the next address.
        other = await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "next"))
        assert other.address != allocation.address


async def test_address_made_before_a_crash_is_used_again(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    created = netbox.create_prefix("10.52.0.0/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "crash", [prefix("10.52.0.0/29")])
    await backend.report(PoolRef.from_object(pool), pool, [])  # creates the ownership tag and custom field
    claim = new_claim(namespace, "survivor")
    tag = netbox.api().extras.tags.get(slug=OWNER_TAG)
    before_crash = created.available_ips.create({"tags": [tag.id], "custom_fields": {CLAIM_UID_FIELD: claim.uid}})
    allocation = await backend.allocate(PoolRef.from_object(pool), pool, claim)
    assert allocation.address == str(before_crash.address).split("/")[0]
    assert allocation.annotations[ANNOTATION_IP_ID] == str(before_crash.id)
    assert len(marked(netbox, claim.uid)) == 1


async def test_a_full_source_is_asked_last(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.53.0.0/30")
    netbox.create_prefix("10.53.1.0/28")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "ordered", [prefix("10.53.0.0/30"), prefix("10.53.1.0/28")])
    first = [await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, f"f{i}")) for i in range(3)]
    assert [a.address for a in first] == ["10.53.0.1", "10.53.0.2", "10.53.1.1"]  # 409, then the next source
    client = await client_of(backend, pool)
    before = client.requests_sent
    more = [await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, f"m{i}")) for i in range(5)]
    assert client.requests_sent - before == 5, "the full source must not cost a request per allocation"
    assert [a.address for a in more] == [f"10.53.1.{i}" for i in range(2, 7)]


async def test_exhausted_when_every_source_is_full(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    rng = netbox.create_ip_range("10.54.0.10/24", "10.54.0.10/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "tiny", [ip_range(id=rng.id)])
    await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "only"))
    with pytest.raises(PoolExhaustedError, match="every NetBox source is full"):
        await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "too-many"))


async def test_release_checks_the_marks(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.55.0.0/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "marks", [prefix("10.55.0.0/29")])
    ref = PoolRef.from_object(pool)
    kept_claim, found_claim = new_claim(namespace, "kept"), new_claim(namespace, "found")
    kept = await backend.allocate(PoolRef.from_object(pool), pool, kept_claim)
    found = await backend.allocate(PoolRef.from_object(pool), pool, found_claim)
    # Without an IPAddress (no annotations), the claim's address is found by its UID and deleted.
    await backend.release(ref, pool, found_claim, None)
    assert marked(netbox, found_claim.uid) == []
    # An address whose marks were removed by someone is never deleted, even when our annotation names it.
    record = netbox.api().ipam.ip_addresses.get(int(kept.annotations[ANNOTATION_IP_ID]))
    record.update({"tags": [], "description": "mine now"})
    await backend.release(ref, pool, kept_claim, kept)
    assert netbox.api().ipam.ip_addresses.get(record.id) is not None
    # Releasing again, or releasing what is gone, succeeds.
    await backend.release(ref, pool, found_claim, found)


async def test_existing_ipaddress_is_recorded_rekeyed_or_refused(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.56.0.0/29")
    record_gateway(netbox, "10.56.0.6/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "adopt", [prefix("10.56.0.0/29", gateway="10.56.0.6")])
    # An IPAddress made elsewhere (no annotations): the claim gets exactly its address in NetBox.
    claim = new_claim(namespace, "adopted")
    existing = Allocation("10.56.0.4", 29, "10.56.0.6")
    held = await backend.allocate(PoolRef.from_object(pool), pool, claim, existing=existing)
    assert (held.address, held.prefix, held.gateway) == ("10.56.0.4", 29, "10.56.0.6")
    assert [r.address for r in marked(netbox, claim.uid)] == ["10.56.0.4/29"]
    # After a restore the claim has a new UID: the NetBox address is re-keyed, not re-allocated.
    restored = ClaimContext(namespace=namespace, name="adopted", uid=str(uuid.uuid4()))
    again = await backend.allocate(PoolRef.from_object(pool), pool, restored, existing=held)
    assert again.annotations[ANNOTATION_IP_ID] == held.annotations[ANNOTATION_IP_ID]
    assert again.annotations[ANNOTATION_CLAIM_UID] == restored.uid
    assert [claim_uid_of(r) for r in marked(netbox, restored.uid)] == [restored.uid]
    # An address someone else holds in NetBox is never taken.
    netbox.api().ipam.ip_addresses.create(address="10.56.0.5/29", description="by hand")
    with pytest.raises(AllocationFailedError, match="already NetBox IP address"):
        await backend.allocate(
            PoolRef.from_object(pool), pool, new_claim(namespace, "thief"), existing=Allocation("10.56.0.5", 29)
        )


async def test_tls_verification(backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer) -> None:
    netbox.create_prefix("10.57.0.0/29")
    with NetboxProxy(netbox.url, tls=True) as proxy:
        body = {"url": proxy.url, "token": netbox.token}
        for name, data in (("tls-plain", body), ("tls-ca", {**body, "caBundle": proxy.ca_pem})):
            await kube.create(SECRET_RESOURCE, {"metadata": {"name": name}, "stringData": data}, namespace)
        untrusted = pool_of(namespace, "tls-untrusted", [prefix("10.57.0.0/29")], secret="tls-plain")
        report = await backend.report(PoolRef.from_object(untrusted), untrusted, [])
        assert (report.ready, report.reason) == (False, "TLSVerificationFailed")
        assert "caBundle" in report.message
        trusted = pool_of(namespace, "tls-trusted", [prefix("10.57.0.0/29")], secret="tls-ca")
        report = await backend.report(PoolRef.from_object(trusted), trusted, [])
        assert report.ready, report.message
        assert [(c.type, c.status, c.reason) for c in report.conditions] == [("TLSVerified", True, "Verified")]
        assert (
            await backend.allocate(PoolRef.from_object(trusted), trusted, new_claim(namespace, "tls"))
        ).address == "10.57.0.1"
        insecure = pool_of(
            namespace,
            "tls-insecure",
            [prefix("10.57.0.0/29")],
            secret="tls-plain",
            connection={"secretRef": {"name": "tls-plain"}, "insecureSkipVerify": True},
        )
        report = await backend.report(PoolRef.from_object(insecure), insecure, [])
        assert report.ready, report.message
        assert [(c.type, c.status, c.reason, c.warning) for c in report.conditions] == [
            ("TLSVerified", False, "InsecureSkipVerify", True)
        ]


async def test_failures_never_show_the_token(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.58.0.0/29")
    bad = netbox.token[:-8] + "deadbeef"
    await create_secret(kube, namespace, netbox, name="bad", token=bad)
    pool = pool_of(namespace, "bad", [prefix("10.58.0.0/29")], secret="bad")
    report = await backend.report(PoolRef.from_object(pool), pool, [])
    assert (report.ready, report.reason) == (False, "AuthenticationFailed")
    with pytest.raises(PoolNotReadyError) as failure:
        await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "denied"))
    # Unreachable: a port nothing listens on.
    await kube.create(
        SECRET_RESOURCE,
        {"metadata": {"name": "nowhere"}, "stringData": {"url": "http://127.0.0.1:9", "token": netbox.token}},
        namespace,
    )
    nowhere = pool_of(namespace, "nowhere", [prefix("10.58.0.0/29")], secret="nowhere")
    unreachable = await backend.report(PoolRef.from_object(nowhere), nowhere, [])
    assert (unreachable.ready, unreachable.reason) == (False, "NetBoxUnreachable")
    for text in (report.message, failure.value.message, str(failure.value), unreachable.message, repr(backend)):
        for secret in (bad, netbox.token, bad.split(".")[-1], netbox.token.split(".")[-1]):
            assert secret not in text


async def test_custom_field_that_cannot_be_created(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.59.0.0/29")
    token = limited_token(netbox, unique_name("limited"))
    await create_secret(kube, namespace, netbox, name="limited", token=token)
    pool = pool_of(namespace, "limited", [prefix("10.59.0.0/29")], secret="limited")
    existing_field = netbox.api().extras.custom_fields.get(name=CLAIM_UID_FIELD)
    if existing_field is not None:  # made by an earlier test of this module
        existing_field.delete()
    report = await backend.report(PoolRef.from_object(pool), pool, [])
    assert (report.ready, report.reason) == (False, "CustomFieldMissing"), report.message
    assert "Unique" in report.message and "Custom Fields" in report.message
    with pytest.raises(PoolNotReadyError):
        await backend.allocate(PoolRef.from_object(pool), pool, new_claim(namespace, "early"))
    # An administrator creates the field without Unique: the pool works, and says what would make it cheaper.
    netbox.create_custom_field(CLAIM_UID_FIELD)
    get_or_create_field(netbox, CLAIM_REF_FIELD)  # made by an earlier test, unless this one runs alone
    recheck_ownership(backend)
    report = await backend.report(PoolRef.from_object(pool), pool, [])
    assert report.ready and "not Unique" in report.message
    claim = new_claim(namespace, "late")
    allocation = await backend.allocate(PoolRef.from_object(pool), pool, claim)
    assert [r.address for r in marked(netbox, claim.uid)] == [f"{allocation.address}/29"]
    await backend.release(PoolRef.from_object(pool), pool, claim, allocation)
    netbox.api().extras.custom_fields.get(name=CLAIM_UID_FIELD).delete()  # later tests get a Unique one again


def limited_token(netbox: NetBoxServer, username: str) -> str:
    """A v2 token of a user who may read everything we look up and write IP addresses, but not custom fields."""
    return user_token(netbox, username, view=READ_TYPES, write=["ipam.ipaddress"])


async def test_mixed_families_and_unknown_pools(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.64.0.0/29")
    netbox.create_prefix("2001:db8:64::/64")
    await create_secret(kube, namespace, netbox)
    mixed = pool_of(namespace, "mixed", [prefix("10.64.0.0/29"), prefix("2001:db8:64::/64")])
    report = await backend.report(PoolRef.from_object(mixed), mixed, [])
    assert (report.ready, report.reason) == (
        False,
        "InvalidConfiguration",
    ) and "one pool per IP family" in report.message
    wrong_gateway = pool_of(namespace, "gw", [prefix("2001:db8:64::/64", gateway="10.64.0.1")])
    with pytest.raises(PoolNotReadyError, match="not of the source's IP family"):
        await backend.allocate(PoolRef.from_object(wrong_gateway), wrong_gateway, new_claim(namespace, "gw"))
    # A release for a pool that is gone and was never seen by this controller cannot be done: it says what to do.
    gone = PoolRef.from_object(pool_of(namespace, "gone", [prefix("10.64.0.0/29")]))
    fresh = NetboxBackend(BackendContext(kube=kube), fast_settings())
    try:
        claim = new_claim(namespace, "orphan")
        with pytest.raises(ReleaseImpossibleError, match=claim.uid):
            await fresh.release(gone, None, claim, None)
    finally:
        await fresh.close()
