"""The requested-address annotation on the NetBox backend against the real NetBox, called directly (as the
reconciler calls it) and, in the last test, through the controller: exactly the requested address, or
AllocationFailed saying it is outside the pool or held (and by whom); an earlier attempt's address is adopted; and
two replicas racing for one address never both get it, even in a VRF where NetBox itself lets duplicates through.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from backends.netbox import NetboxBackend
from backends.netbox.allocator import Allocator
from backends.netbox.spec import ANNOTATION_IP_ID, CLAIM_REF_FIELD, CLAIM_UID_FIELD, OWNER_TAG
from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.backend.contract import (
    REQUESTED_ADDRESS_ANNOTATION,
    Allocation,
    AllocationFailedError,
    BackendContext,
    ClaimContext,
    PoolRef,
)
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.netbox_backend import (
    NB_POOLS,
    client_of,
    create_secret,
    delete_claim,
    fast_settings,
    ip_range,
    marked,
    nb_claim,
    netbox_pool,
    new_claim,
    pool_of,
    prefix,
    record_gateway,
    unique_name,
)
from tests.support.objects import wait_address, wait_claim_reason
from tools.netbox_proxy import NetboxProxy

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

Object = dict[str, Any]
ROUNDS = 20


def asking(namespace: str, name: str, address: str) -> ClaimContext:
    """A new claim that asks for `address`."""
    return ClaimContext(
        namespace=namespace,
        name=name,
        uid=str(uuid.uuid4()),
        annotations={REQUESTED_ADDRESS_ANNOTATION: address},
    )


def holders(netbox: NetBoxServer, address: str, vrf: Any = None) -> list[Any]:
    """Every NetBox IP address at `address` (without its mask) in the VRF (None: the global table)."""
    found = netbox.api().ipam.ip_addresses.filter(address=address, vrf_id=vrf.id if vrf is not None else "null")
    return [r for r in found if str(r.address).split("/")[0] == address]


async def test_requested_address_is_held_exactly(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.74.0.0/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "asked", [prefix("10.74.0.0/24")])
    ref = PoolRef.from_object(pool)
    claim = asking(namespace, "wants-77", "10.74.0.77")
    allocation = await backend.allocate(ref, pool, claim)
    assert (allocation.address, allocation.prefix) == ("10.74.0.77", 24)
    [record] = marked(netbox, claim.uid)
    assert str(record.address) == "10.74.0.77/24" and record.id == int(allocation.annotations[ANNOTATION_IP_ID])
    assert record.custom_fields[CLAIM_REF_FIELD] == f"{namespace}/wants-77"
    assert OWNER_TAG in [t.slug for t in record.tags]
    # A claim without the annotation still gets NetBox's lowest free address, which is not the requested one.
    dynamic = await backend.allocate(ref, pool, new_claim(namespace, "plain"))
    assert dynamic.address == "10.74.0.1"
    # Fulfilled: the IPAddress is trusted, whatever the claim asks for now.
    moved = ClaimContext(namespace, "wants-77", claim.uid, annotations={REQUESTED_ADDRESS_ANNOTATION: "10.74.0.99"})
    assert await backend.allocate(ref, pool, moved, existing=allocation) == allocation
    await backend.release(ref, pool, claim, allocation)
    assert holders(netbox, "10.74.0.77") == []


async def test_outside_the_pool_is_refused_with_the_reason(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.75.0.0/24")
    record_gateway(netbox, "10.75.0.1/24")
    rng = netbox.create_ip_range("10.75.1.10/24", "10.75.1.20/24", mark_populated=True)
    await create_secret(kube, namespace, netbox)
    sources = [prefix("10.75.0.0/24", gateway="10.75.0.1"), ip_range(id=rng.id)]
    pool = pool_of(namespace, "strict", sources)
    ref = PoolRef.from_object(pool)
    cases = {
        "192.0.2.7": "outside NetboxIPPool/",
        "10.75.0.0": "a reserved address of 10.75.0.0/24",
        "10.75.0.255": "a reserved address of 10.75.0.0/24",
        "10.75.0.1": "the gateway of 10.75.0.0/24",
        "10.75.1.15": "marked populated",
        "2001:db8::5": "outside NetboxIPPool/",
    }
    await backend.allocate(ref, pool, new_claim(namespace, "warm-up"))  # the pool's sources, resolved once
    client = await client_of(backend, pool)
    for address, why in cases.items():
        claim = asking(namespace, "out", address)
        before = client.requests_sent
        with pytest.raises(AllocationFailedError) as failure:
            await backend.allocate(ref, pool, claim)
        assert f"requested address {address} is outside {ref}" in failure.value.message
        assert why in failure.value.message
        assert client.requests_sent == before, "an address outside the pool costs no NetBox request"
        assert marked(netbox, claim.uid) == []
    with pytest.raises(AllocationFailedError, match="not an IP address"):
        await backend.allocate(ref, pool, asking(namespace, "bad", "10.75.0.300"))


async def test_held_by_another_claim_or_by_hand(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.76.0.0/24")
    manual = netbox.api().ipam.ip_addresses.create(address="10.76.0.5/24", description="by hand")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "busy", [prefix("10.76.0.0/24")])
    ref = PoolRef.from_object(pool)
    first = await backend.allocate(ref, pool, asking(namespace, "first", "10.76.0.9"))
    assert first.address == "10.76.0.9"
    second = asking(namespace, "second", "10.76.0.9")
    with pytest.raises(AllocationFailedError) as failure:
        await backend.allocate(ref, pool, second)
    assert failure.value.message == (
        f"requested address 10.76.0.9 is already held by claim {namespace}/first in {ref}; request another address"
    )
    third = asking(namespace, "third", "10.76.0.5")
    with pytest.raises(AllocationFailedError) as failure:
        await backend.allocate(ref, pool, third)
    assert f"held by a NetBox IP address not managed by this provider (id {manual.id})" in failure.value.message
    assert marked(netbox, second.uid) == [] and marked(netbox, third.uid) == []
    assert [r.id for r in holders(netbox, "10.76.0.5")] == [manual.id]
    assert netbox.api().ipam.ip_addresses.get(manual.id).description == "by hand"


async def test_an_earlier_attempt_is_adopted_and_a_stray_address_deleted(
    kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.77.0.0/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "again", [prefix("10.77.0.0/24")])
    ref = PoolRef.from_object(pool)
    claim = asking(namespace, "crashed", "10.77.0.30")
    crashed = NetboxBackend(BackendContext(kube=kube), fast_settings())
    try:
        before_crash = await crashed.allocate(ref, pool, claim)  # made in NetBox, then the process "died"
    finally:
        await crashed.close()
    restarted = NetboxBackend(BackendContext(kube=kube), fast_settings())
    try:
        again = await restarted.allocate(ref, pool, claim)
        assert again == before_crash, "the address made before the crash is the claim's"
        assert len(marked(netbox, claim.uid)) == 1
        # A claim that got a dynamic address, lost it before its IPAddress was written, and now asks for one.
        late = new_claim(namespace, "asked-late")
        stray = await restarted.allocate(ref, pool, late)
        asked = ClaimContext(namespace, late.name, late.uid, annotations={REQUESTED_ADDRESS_ANNOTATION: "10.77.0.40"})
        held = await restarted.allocate(ref, pool, asked)
        assert held.address == "10.77.0.40"
        assert [str(r.address) for r in marked(netbox, late.uid)] == ["10.77.0.40/24"]
        assert holders(netbox, stray.address) == []
    finally:
        await restarted.close()


async def test_a_younger_duplicate_of_ours_gives_way(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    """The check after the create: a claim whose address (made by an attempt that died before checking) is younger
    than another object at the same address deletes its own and fails as held. The VRF lets duplicates in."""
    vrf = netbox.api().ipam.vrfs.create(name=unique_name("dup"), enforce_unique=False)
    netbox.create_prefix("10.78.0.0/24", vrf=vrf.id)
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "dup", [prefix("10.78.0.0/24", vrf=vrf.name)])
    ref = PoolRef.from_object(pool)
    winner = await backend.allocate(ref, pool, asking(namespace, "older", "10.78.0.8"))
    loser = asking(namespace, "younger", "10.78.0.8")
    younger = netbox.api().ipam.ip_addresses.create(
        address="10.78.0.8/24",
        vrf=vrf.id,
        tags=[{"slug": OWNER_TAG}],
        custom_fields={CLAIM_UID_FIELD: loser.uid, CLAIM_REF_FIELD: f"{namespace}/younger"},
    )
    with pytest.raises(AllocationFailedError) as failure:
        await backend.allocate(ref, pool, loser)
    assert f"already held by claim {namespace}/older" in failure.value.message
    assert netbox.api().ipam.ip_addresses.get(younger.id) is None
    assert [r.id for r in holders(netbox, "10.78.0.8", vrf)] == [int(winner.annotations[ANNOTATION_IP_ID])]


async def test_an_older_object_gives_way_to_a_younger_one_that_stays(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    """Ids do not decide who keeps the address (transactions may commit out of id order): the oldest object's
    claim waits for the others to give way, and gives way itself when one stays (it was kept already)."""
    vrf = netbox.api().ipam.vrfs.create(name=unique_name("order"), enforce_unique=False)
    netbox.create_prefix("10.81.0.0/24", vrf=vrf.id)
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "order", [prefix("10.81.0.0/24", vrf=vrf.name)])
    ref = PoolRef.from_object(pool)
    late, kept = asking(namespace, "committed-late", "10.81.0.8"), asking(namespace, "kept", "10.81.0.8")

    def ours(claim: ClaimContext) -> Any:
        custom_fields = {CLAIM_UID_FIELD: claim.uid, CLAIM_REF_FIELD: f"{namespace}/{claim.name}"}
        address = "10.81.0.8/24"
        return netbox.api().ipam.ip_addresses.create(
            address=address, vrf=vrf.id, tags=[{"slug": OWNER_TAG}], custom_fields=custom_fields
        )

    older, younger = ours(late), ours(kept)
    with pytest.raises(AllocationFailedError) as failure:
        await backend.allocate(ref, pool, late)
    assert f"already held by claim {namespace}/kept" in failure.value.message
    assert netbox.api().ipam.ip_addresses.get(older.id) is None
    assert [r.id for r in holders(netbox, "10.81.0.8", vrf)] == [younger.id]


async def race(
    replicas: list[NetboxBackend], ref: PoolRef, pool: Object, claims: list[ClaimContext], round_number: int
) -> tuple[list[tuple[ClaimContext, Allocation]], list[AllocationFailedError]]:
    """One round: both replicas ask at once; never both win. When both gave way (each saw the other's object),
    both ask again after their `retry_after`, as the reconciler would, until one wins (at most 4 attempts)."""
    for _ in range(4):
        results = await asyncio.gather(
            *(r.allocate(ref, pool, c) for r, c in zip(replicas, claims, strict=True)), return_exceptions=True
        )
        won = [(c, r) for c, r in zip(claims, results, strict=True) if isinstance(r, Allocation)]
        lost = [r for r in results if isinstance(r, AllocationFailedError)]
        assert len(won) + len(lost) == 2 and len(won) <= 1, f"round {round_number}: {results}"
        if won:
            return won, lost
        assert all(f.retry_after is not None and f.retry_after <= 3.0 for f in lost), f"round {round_number}: {lost}"
        await asyncio.sleep(max(f.retry_after or 0.0 for f in lost))
    raise AssertionError(f"round {round_number}: nobody won in 4 attempts")


async def test_two_replicas_racing_for_one_address_never_both_get_it(
    kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    """Two independent backends (two controller processes) ask for the same address at once, 20 times. The VRF does
    not enforce unique addresses, so NetBox creates both objects whenever both POSTs pass its checks: the proxy holds
    each POST for a moment, so that both replicas have looked the address up before either object exists."""
    vrf = netbox.api().ipam.vrfs.create(name=unique_name("race"), enforce_unique=False)
    netbox.create_prefix("10.79.0.0/24", vrf=vrf.id)
    replicas = [NetboxBackend(BackendContext(kube=kube), fast_settings()) for _ in range(2)]
    try:
        with NetboxProxy(netbox.url) as proxy:
            await create_secret(kube, namespace, netbox, url=proxy.url)
            pool = pool_of(namespace, "race", [prefix("10.79.0.0/24", vrf=vrf.name)])
            ref = PoolRef.from_object(pool)
            for index, replica in enumerate(replicas):  # warm: ownership marks and sources resolved
                await replica.allocate(ref, pool, asking(namespace, f"warm-{index}", f"10.79.0.{200 + index}"))
            both_created = 0
            for round_number in range(ROUNDS):
                address = f"10.79.0.{10 + round_number}"
                claims = [asking(namespace, f"r{round_number}-{i}", address) for i in range(2)]
                for _ in claims:
                    proxy.delay_next("POST", "/api/ipam/ip-addresses/", 0.5, before=True)
                posts_before = len(proxy.events("POST", "/api/ipam/ip-addresses/"))
                won, lost = await race(replicas, ref, pool, claims, round_number)
                winner, allocation = won[0]
                assert allocation.address == address
                assert f"requested address {address} is already held by claim {namespace}/" in lost[0].message
                left = holders(netbox, address, vrf)
                assert [r.id for r in left] == [int(allocation.annotations[ANNOTATION_IP_ID])], "a duplicate is left"
                assert left[0].custom_fields[CLAIM_UID_FIELD] == winner.uid
                posts = proxy.events("POST", "/api/ipam/ip-addresses/")[posts_before:]
                both_created += sum(1 for e in posts if e.outcome == "forwarded 201") == 2
            print(f"\n{both_created} of {ROUNDS} rounds: NetBox created both objects; the younger one gave way")
            assert both_created > 0, "NetBox never created both objects: the check after the create was not exercised"
    finally:
        for replica in replicas:
            await replica.close()


async def test_through_the_controller_free_taken_and_outside(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    netbox.create_prefix("10.80.0.0/24")
    manual = netbox.api().ipam.ip_addresses.create(address="10.80.0.5/24", description="a printer")
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("net", [prefix("10.80.0.0/24")]), namespace)
    ask = REQUESTED_ADDRESS_ANNOTATION
    async with netbox_controller():
        await kube.create(CLAIMS, nb_claim("free", "net", annotations={ask: "10.80.0.42"}), namespace)
        address = await wait_address(kube, namespace, "free")
        assert (address["spec"]["address"], address["spec"]["prefix"]) == ("10.80.0.42", 24)
        for name, asked in (("same", "10.80.0.42"), ("printer", "10.80.0.5"), ("outside", "10.99.0.1")):
            await kube.create(CLAIMS, nb_claim(name, "net", annotations={ask: asked}), namespace)
        messages = {}
        for name in ("same", "printer", "outside"):
            failed = await wait_claim_reason(kube, namespace, name, "AllocationFailed", timeout=60)
            messages[name] = next(c for c in failed["status"]["conditions"] if c["type"] == "Ready")["message"]
            assert await kube.get(ADDRESSES, name, namespace) is None
        pool = f"NetboxIPPool/{namespace}/net"
        assert messages["same"] == (
            f"requested address 10.80.0.42 is already held by claim {namespace}/free in {pool}; request another address"
        )
        assert messages["printer"] == (
            f"requested address 10.80.0.5 is already held by a NetBox IP address not managed by this provider "
            f"(id {manual.id}) in {pool}; request another address"
        )
        assert messages["outside"] == f"requested address 10.99.0.1 is outside {pool}; request an address of the pool"
        assert [str(r.address) for r in holders(netbox, "10.80.0.42")] == ["10.80.0.42/24"]
        await delete_claim(kube, namespace, "free")
        assert holders(netbox, "10.80.0.42") == []


async def test_crash_between_post_and_check_then_annotation_removed(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process stops after creating a requested address and before its keep-if-alone check, while an address
    made by hand takes the same address (the VRF lets duplicates in); the claim's annotation is then removed. The
    next process's normal path finds the claim's address by UID: it was made for a requested address (its
    description says so), so it is checked, found shared, deleted, and the claim gets another address."""
    vrf = netbox.api().ipam.vrfs.create(name=unique_name("crash"), enforce_unique=False)
    netbox.create_prefix("10.83.0.0/24", vrf=vrf.id)
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "crash", [prefix("10.83.0.0/24", vrf=vrf.name)])
    ref = PoolRef.from_object(pool)
    claim = asking(namespace, "crashed", "10.83.0.30")

    async def crash(*_: Any) -> None:
        raise RuntimeError("the process stops here")

    crashing = NetboxBackend(BackendContext(kube=kube), fast_settings())
    try:
        monkeypatch.setattr(Allocator, "keep_if_alone", crash)
        with pytest.raises(RuntimeError):
            await crashing.allocate(ref, pool, claim)
    finally:
        await crashing.close()
    monkeypatch.undo()
    [made] = marked(netbox, claim.uid)
    assert made.description.endswith(" [requested address]")
    manual = netbox.api().ipam.ip_addresses.create(address="10.83.0.30/24", vrf=vrf.id, description="by hand")
    plain = ClaimContext(namespace, claim.name, claim.uid)  # the annotation removed
    restarted = NetboxBackend(BackendContext(kube=kube), fast_settings())
    try:
        with pytest.raises(AllocationFailedError) as failure:
            await restarted.allocate(ref, pool, plain)
        assert "it was deleted, and an address is asked again" in failure.value.message
        assert failure.value.retry_after is not None
        assert [r.id for r in holders(netbox, "10.83.0.30", vrf)] == [manual.id]
        allocation = await restarted.allocate(ref, pool, plain)
    finally:
        await restarted.close()
    assert allocation.address != "10.83.0.30"
    assert [str(r.address).split("/")[0] for r in marked(netbox, claim.uid)] == [allocation.address]


async def test_the_claims_own_address_in_another_vrf_is_a_stray(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    """An earlier address of the claim at the requested IP but in another VRF than the pool's source is not adopted
    (the check lists the source's VRF only, and would never see it): it is deleted, and the address is made in the
    source's VRF."""
    other_vrf = netbox.api().ipam.vrfs.create(name=unique_name("elsewhere"))
    netbox.create_prefix("10.84.0.0/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "global", [prefix("10.84.0.0/24")])
    ref = PoolRef.from_object(pool)
    claim = asking(namespace, "moved", "10.84.0.30")
    elsewhere = netbox.api().ipam.ip_addresses.create(
        address="10.84.0.30/24",
        vrf=other_vrf.id,
        tags=[{"slug": OWNER_TAG}],
        custom_fields={CLAIM_UID_FIELD: claim.uid, CLAIM_REF_FIELD: f"{namespace}/moved"},
    )
    allocation = await backend.allocate(ref, pool, claim)
    assert allocation.address == "10.84.0.30"
    assert netbox.api().ipam.ip_addresses.get(elsewhere.id) is None
    [record] = marked(netbox, claim.uid)
    assert record.vrf is None and record.id == int(allocation.annotations[ANNOTATION_IP_ID])


async def test_an_address_in_a_populated_range_inside_a_prefix_is_outside(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    """NetBox's available-ips of a prefix skips the addresses of an ip-range marked populated inside it, so such an
    address is not the pool's to hand out; an address of the prefix beside the range is."""
    netbox.create_prefix("10.85.0.0/24")
    netbox.create_ip_range("10.85.0.10/24", "10.85.0.20/24", mark_populated=True)
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "populated", [prefix("10.85.0.0/24")])
    ref = PoolRef.from_object(pool)
    claim = asking(namespace, "inside", "10.85.0.15")
    with pytest.raises(AllocationFailedError) as failure:
        await backend.allocate(ref, pool, claim)
    assert f"requested address 10.85.0.15 is outside {ref}" in failure.value.message
    assert "ip-range 10.85.0.10-10.85.0.20 of 10.85.0.0/24, marked populated" in failure.value.message
    assert marked(netbox, claim.uid) == []
    beside = await backend.allocate(ref, pool, asking(namespace, "beside", "10.85.0.25"))
    assert beside.address == "10.85.0.25"


async def test_after_a_restore_the_claims_earlier_address_is_rekeyed_not_held(
    kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    """A restore (or `clusterctl move`) gives the claim a new UID before its IPAddress exists: its NetBox address at
    the requested IP, recording the same namespace/name, is re-keyed and kept, not reported as held by itself."""
    netbox.create_prefix("10.86.0.0/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "restore", [prefix("10.86.0.0/24")])
    ref = PoolRef.from_object(pool)
    before = asking(namespace, "restored", "10.86.0.44")
    first = NetboxBackend(BackendContext(kube=kube), fast_settings())
    try:
        made = await first.allocate(ref, pool, before)
    finally:
        await first.close()
    after = ClaimContext(namespace, "restored", str(uuid.uuid4()), annotations=before.annotations)
    restarted = NetboxBackend(BackendContext(kube=kube), fast_settings())
    try:
        allocation = await restarted.allocate(ref, pool, after)
    finally:
        await restarted.close()
    assert allocation.address == "10.86.0.44"
    assert allocation.annotations[ANNOTATION_IP_ID] == made.annotations[ANNOTATION_IP_ID]
    assert marked(netbox, before.uid) == [] and len(marked(netbox, after.uid)) == 1
