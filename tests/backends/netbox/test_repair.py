"""The NetBox backend's repair capability called directly, against the real NetBox: a force-deleted claim's address
listed and released, an address deleted behind our back recorded again, an address re-taken by someone else
reported and never handed out, a holding changed meanwhile kept, paged and paced listings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from backends.netbox import NetboxBackend
from backends.netbox.spec import CLAIM_REF_FIELD, CLAIM_UID_FIELD, OWNER_TAG
from ipam_provider.backend.contract import Allocation, BackendContext, BackendError, PoolRef, ReleaseImpossibleError
from ipam_provider.backend.repair import Holding, RestoreOutcome
from ipam_provider.repair.pacer import CountingPacer
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.netbox_backend import (
    client_of,
    create_secret,
    fast_settings,
    ip_range,
    marked,
    new_claim,
    pool_of,
    prefix,
    unique_name,
)

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

Object = dict[str, Any]


def mark(netbox: NetBoxServer, address: str, uid: str, ref: str, **fields: Any) -> Any:
    """An IP address with both ownership marks, made directly in NetBox (as another replica or an earlier run)."""
    tag = netbox.api().extras.tags.get(slug=OWNER_TAG)
    custom = {CLAIM_UID_FIELD: uid, CLAIM_REF_FIELD: ref}
    return netbox.api().ipam.ip_addresses.create(address=address, tags=[tag.id], custom_fields=custom, **fields)


def at(netbox: NetBoxServer, address: str) -> list[Any]:
    """Every NetBox IP address at `address` (any mask) in the global table."""
    found = netbox.api().ipam.ip_addresses.filter(address=address, vrf_id="null")
    return [r for r in found if str(r.address).split("/")[0] == address]


async def test_the_backend_offers_the_repair_capability(backend: NetboxBackend) -> None:
    assert backend.capabilities().repair is backend


async def test_a_force_deleted_claims_address_is_listed_then_released(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.150.0.0/24")
    netbox.create_prefix("10.150.1.0/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "leaky", [prefix("10.150.0.0/24")])
    ref = PoolRef.from_object(pool)
    gone, kept = new_claim(namespace, "gone"), new_claim(namespace, "kept")
    leaked = await backend.allocate(ref, pool, gone)  # its claim is then force-deleted: no release ever comes
    await backend.allocate(ref, pool, kept)
    # Not holdings: an address by hand, our tag without a claim UID, a claim UID without our tag, ours elsewhere.
    netbox.api().ipam.ip_addresses.create(address="10.150.0.200/24", description="by hand")
    tag = netbox.api().extras.tags.get(slug=OWNER_TAG)
    netbox.api().ipam.ip_addresses.create(address="10.150.0.201/24", tags=[tag.id])
    untagged = {CLAIM_UID_FIELD: "uid-without-tag", CLAIM_REF_FIELD: f"{namespace}/untagged"}
    netbox.api().ipam.ip_addresses.create(address="10.150.0.202/24", custom_fields=untagged)
    mark(netbox, "10.150.1.5/24", "uid-of-another-pool", f"{namespace}/elsewhere")

    holdings = await backend.list_holdings(ref, pool, CountingPacer())

    by_uid = {h.claim_uid: h for h in holdings}
    assert set(by_uid) == {gone.uid, kept.uid}
    leak = by_uid[gone.uid]
    assert leak.address == leaked.address
    assert leak.claim == f"{namespace}/gone"
    assert leak.handle == str(marked(netbox, gone.uid)[0].id)
    assert leak.created_at is not None and leak.created_at > 1.7e9
    assert await backend.release_holding(ref, pool, leak) is True
    assert marked(netbox, gone.uid) == []
    assert len(marked(netbox, kept.uid)) == 1, "only the leak is released"
    assert await backend.release_holding(ref, pool, leak) is False, "already gone (404)"
    assert [h.claim_uid for h in await backend.list_holdings(ref, pool, CountingPacer())] == [kept.uid]


async def test_an_impossible_release_leaves_the_address_to_the_loop(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.159.0.0/29")
    await create_secret(kube, namespace, netbox)
    gone = pool_of(namespace, "gone", [prefix("10.159.0.0/29")])
    claim = new_claim(namespace, "orphan")
    allocation = await backend.allocate(PoolRef.from_object(gone), gone, claim)
    restarted = NetboxBackend(BackendContext(kube=kube), fast_settings())  # never saw the pool, which is gone
    try:
        with pytest.raises(ReleaseImpossibleError, match=claim.uid):
            await restarted.release(PoolRef.from_object(gone), None, claim, allocation)
        assert len(marked(netbox, claim.uid)) == 1, "left in NetBox, for the repair loop"
        covering = pool_of(namespace, "covering", [prefix("10.159.0.0/29")])
        ref = PoolRef.from_object(covering)
        [holding] = await restarted.list_holdings(ref, covering, CountingPacer())
        assert (holding.claim, holding.claim_uid) == (f"{namespace}/orphan", claim.uid)
        assert await restarted.release_holding(ref, covering, holding) is True
        assert marked(netbox, claim.uid) == []
    finally:
        await restarted.close()


async def test_holdings_follow_the_sources_and_their_vrf(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    vrf = netbox.api().ipam.vrfs.create(name=unique_name("repair"))
    netbox.create_prefix("10.151.0.0/24", vrf=vrf.id)
    netbox.create_prefix("10.151.0.0/24")
    netbox.create_ip_range("10.151.1.10/24", "10.151.1.19/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "scoped", [prefix("10.151.0.0/24", vrf=vrf.name), ip_range("10.151.1.10", "10.151.1.19")])
    ref = PoolRef.from_object(pool)
    await backend.report(ref, pool, [])  # the ownership marks
    in_vrf = mark(netbox, "10.151.0.7/24", "in-vrf", f"{namespace}/a", vrf=vrf.id)
    mark(netbox, "10.151.0.7/24", "global-table", f"{namespace}/b")  # same address, the global table
    in_range = mark(netbox, "10.151.1.12/24", "in-range", f"{namespace}/c")
    mark(netbox, "10.151.1.20/24", "past-the-range", f"{namespace}/d")

    holdings = await backend.list_holdings(ref, pool, CountingPacer())

    assert [(h.handle, h.claim_uid) for h in holdings] == [
        (str(in_vrf.id), "in-vrf"),
        (str(in_range.id), "in-range"),
    ]


async def test_an_address_deleted_behind_our_back_is_recorded_again_for_its_claim(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.152.0.0/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "restored", [prefix("10.152.0.0/29")])
    ref = PoolRef.from_object(pool)
    claim = new_claim(namespace, "machine-0")
    allocation = await backend.allocate(ref, pool, claim)
    marked(netbox, claim.uid)[0].delete()  # behind our back

    restore = await backend.restore(ref, pool, claim, allocation)

    assert restore.outcome is RestoreOutcome.RECORDED
    records = marked(netbox, claim.uid)
    assert [str(r.address) for r in records] == [f"{allocation.address}/29"]
    assert restore.detail == f"NetBox IP address {records[0].id}"
    assert (records[0].custom_fields or {})[CLAIM_REF_FIELD] == f"{namespace}/machine-0"
    assert (await backend.restore(ref, pool, claim, allocation)).outcome is RestoreOutcome.HELD
    assert len(marked(netbox, claim.uid)) == 1, "never a second record"
    # The other claims are not given the restored address.
    others = [await backend.allocate(ref, pool, new_claim(namespace, f"other-{i}")) for i in range(5)]
    assert allocation.address not in {a.address for a in others}
    # The claim's release (its IPAddress still names the deleted id) finds the new record by UID.
    await backend.release(ref, pool, claim, allocation)
    assert marked(netbox, claim.uid) == []


async def test_an_address_taken_meanwhile_is_reported_and_never_handed_out(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.153.0.0/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "taken", [prefix("10.153.0.0/29")])
    ref = PoolRef.from_object(pool)
    claim = new_claim(namespace, "victim")
    allocation = await backend.allocate(ref, pool, claim)
    marked(netbox, claim.uid)[0].delete()
    foreign = netbox.api().ipam.ip_addresses.create(address=f"{allocation.address}/29", description="a machine")

    restore = await backend.restore(ref, pool, claim, allocation)

    assert restore.outcome is RestoreOutcome.TAKEN
    assert restore.detail == f"NetBox IP address {foreign.id} (not ours)"
    assert [r.id for r in at(netbox, allocation.address)] == [foreign.id], "nothing created, nothing deleted"
    assert marked(netbox, claim.uid) == []
    others = [await backend.allocate(ref, pool, new_claim(namespace, f"next-{i}")) for i in range(5)]
    assert allocation.address not in {a.address for a in others}
    assert [r.id for r in at(netbox, allocation.address)] == [foreign.id]
    # Held by another claim of ours: named.
    second = others[0]
    restore = await backend.restore(ref, pool, claim, Allocation(second.address, 29, None, {}))
    assert restore.outcome is RestoreOutcome.TAKEN
    assert restore.detail.endswith(f"(claim {namespace}/next-0)")


async def test_a_restored_claim_with_a_new_uid_takes_back_its_own_address(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.154.0.0/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "rekey", [prefix("10.154.0.0/29")])
    ref = PoolRef.from_object(pool)
    before = new_claim(namespace, "moved")
    allocation = await backend.allocate(ref, pool, before)
    after = new_claim(namespace, "moved")  # same name, new UID (a restore or a move)

    restore = await backend.restore(ref, pool, after, allocation)

    assert restore.outcome is RestoreOutcome.RECORDED
    assert "re-keyed" in restore.detail
    assert marked(netbox, before.uid) == []
    assert [str(r.address) for r in marked(netbox, after.uid)] == [f"{allocation.address}/29"]


async def test_a_holding_changed_since_it_was_listed_is_kept(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.155.0.0/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "changed", [prefix("10.155.0.0/29")])
    ref = PoolRef.from_object(pool)
    rekeyed, untagged = new_claim(namespace, "rekeyed"), new_claim(namespace, "untagged")
    await backend.allocate(ref, pool, rekeyed)
    await backend.allocate(ref, pool, untagged)
    holdings = {h.claim_uid: h for h in await backend.list_holdings(ref, pool, CountingPacer())}
    first = marked(netbox, rekeyed.uid)[0]
    first.custom_fields[CLAIM_UID_FIELD] = "a-new-claim-uid"  # re-keyed meanwhile (a restored claim)
    first.save()
    second = marked(netbox, untagged.uid)[0]
    second.tags = []  # taken over by a person
    second.save()

    assert await backend.release_holding(ref, pool, holdings[rekeyed.uid]) is False
    assert await backend.release_holding(ref, pool, holdings[untagged.uid]) is False
    assert netbox.api().ipam.ip_addresses.get(first.id) is not None
    assert netbox.api().ipam.ip_addresses.get(second.id) is not None
    not_for_a_claim = Holding(holdings[rekeyed.uid].address, "", "", str(first.id))
    assert await backend.release_holding(ref, pool, not_for_a_claim) is False


@pytest.mark.parametrize("count", [8, 9])
async def test_the_listing_is_paged_and_paced(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, count: int
) -> None:
    backend = NetboxBackend(BackendContext(kube=kube), fast_settings(repair_page_size=3))
    try:
        cidr = f"10.156.{count}.0/27"
        netbox.create_prefix(cidr)
        await create_secret(kube, namespace, netbox)
        pool = pool_of(namespace, "paged", [prefix(cidr)])
        ref = PoolRef.from_object(pool)
        claims = [new_claim(namespace, f"c{i}") for i in range(count)]
        for claim in claims:
            await backend.allocate(ref, pool, claim)  # also resolves the pool's sources (cached)
        client = await client_of(backend, pool)
        pacer = CountingPacer()
        sent = client.requests_sent

        holdings = await backend.list_holdings(ref, pool, pacer)

        assert sorted(h.claim_uid for h in holdings) == sorted(c.uid for c in claims)
        pages = count // 3 + 1  # the last page is empty when the count is a multiple of the page size
        assert pacer.waits == pages, "one wait before each page"
        assert client.requests_sent - sent == pages
    finally:
        await backend.close()


async def test_addresses_outside_the_pool(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.157.0.0/29")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "shrunk", [prefix("10.157.0.0/29")])
    ref = PoolRef.from_object(pool)
    inside = await backend.allocate(ref, pool, new_claim(namespace, "inside"))

    outside = await backend.outside_pool(ref, pool, [inside.address, "10.157.0.9", "10.157.0.0", "nonsense"])

    assert set(outside) == {"10.157.0.9", "10.157.0.0", "nonsense"}
    assert "10.157.0.0/29" in outside["10.157.0.9"]
    restore = await backend.restore(ref, pool, new_claim(namespace, "far"), Allocation("10.157.0.9", 29, None, {}))
    assert restore.outcome is RestoreOutcome.OUTSIDE
    assert at(netbox, "10.157.0.9") == [], "nothing recorded outside the pool"


async def test_an_unreachable_netbox_is_a_backend_error(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    await create_secret(kube, namespace, netbox, url="http://127.0.0.1:9")  # nothing listens there
    pool = pool_of(namespace, "down", [prefix("10.158.0.0/29")])
    ref = PoolRef.from_object(pool)
    with pytest.raises(BackendError):
        await backend.list_holdings(ref, pool, CountingPacer())
    with pytest.raises(BackendError):
        await backend.restore(ref, pool, new_claim(namespace, "x"), Allocation("10.158.0.1", 29, None, {}))
    assert await backend.outside_pool(ref, pool, ["10.158.0.1"]) == {}, "cannot tell now"
