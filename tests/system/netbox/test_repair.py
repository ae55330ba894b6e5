"""The repair loop on a NetboxIPPool, end to end: the real API server, the controller with a short repair interval
and grace period, and the real NetBox. Leaked NetBox addresses (of a claim force-deleted without its finalizer,
and one made for a claim that vanished before its IPAddress was written) are released; an address deleted in
NetBox behind our back is recorded again for its claim; an address re-taken by a foreign object is reported as a
duplicate (Events, the pool's AddressesRecorded condition) and never handed to another claim; an address outside a
pool that moved elsewhere is reported. Each test waits for what only the repair loop does, so each fails with the
loop off (`interval=0`)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from backends.netbox.spec import CLAIM_REF_FIELD, CLAIM_UID_FIELD, OWNER_TAG
from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.netbox_backend import NB_POOLS, create_secret, marked, nb_claim, netbox_pool, prefix
from tests.support.objects import wait_address, wait_event

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

REPAIR = RepairSettings(interval=0.5, grace_period=1.0)
Object = dict[str, Any]


async def start_pool(kube: KubeClient, namespace: str, netbox: NetBoxServer, cidr: str) -> None:
    netbox.create_prefix(cidr)
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("net", [prefix(cidr)]), namespace)


async def test_leaked_netbox_addresses_are_released(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    await start_pool(kube, namespace, netbox, "10.160.0.0/24")
    async with netbox_controller(repair=REPAIR) as controller:
        for name in ("kept", "forced"):
            await kube.create(CLAIMS, nb_claim(name, "net"), namespace)
        kept = await wait_address(kube, namespace, "kept")
        await wait_address(kube, namespace, "forced")
        kept_claim, forced_claim = [await kube.get(CLAIMS, name, namespace) for name in ("kept", "forced")]
        assert kept_claim is not None and forced_claim is not None
        # A claim force-deleted without its finalizer; its IPAddress deleted as the garbage collector would (this
        # API server runs none).
        await kube.patch(CLAIMS, "forced", {"metadata": {"finalizers": None}}, namespace)
        await kube.delete(CLAIMS, "forced", namespace)
        await kube.delete(ADDRESSES, "forced", namespace)
        # And an address a process made just before its claim was force-deleted: no IPAddress was ever written.
        tag = netbox.api().extras.tags.get(slug=OWNER_TAG)
        marks = {CLAIM_UID_FIELD: str(uuid.uuid4()), CLAIM_REF_FIELD: f"{namespace}/ghost"}
        ghost = netbox.api().ipam.ip_addresses.create(address="10.160.0.77/24", tags=[tag.id], custom_fields=marks)

        async def released() -> bool:
            gone = netbox.api().ipam.ip_addresses.get(ghost.id) is None
            return gone and not marked(netbox, forced_claim["metadata"]["uid"])

        await wait_for(released, timeout=90, message="the repair loop to release both leaked NetBox addresses")
        # The ghost can only go through the repair loop. The force-deleted claim's address may also be released by
        # the claim's own path, when the controller still saw the claim as it went: either way, it is gone.
        await wait_event(kube, namespace, controller, "RepairReleasedLeak", "10.160.0.77")
        held = [str(r.address) for r in marked(netbox, kept_claim["metadata"]["uid"])]
        assert held == [f"{kept['spec']['address']}/24"], "the live claim's address stays"


async def test_an_address_deleted_behind_our_back_is_recorded_again(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    await start_pool(kube, namespace, netbox, "10.161.0.0/24")
    async with netbox_controller(repair=REPAIR) as controller:
        created = await kube.create(CLAIMS, nb_claim("node-0", "net"), namespace)
        address = (await wait_address(kube, namespace, "node-0"))["spec"]["address"]
        uid = created["metadata"]["uid"]
        (record,) = marked(netbox, uid)
        record.delete()  # behind our back: the fulfilled claim itself sends NetBox no request

        async def recorded() -> list[Any]:
            return marked(netbox, uid)

        (again,) = await wait_for(recorded, timeout=60, message="the repair loop to record the address again")
        assert str(again.address) == f"{address}/24" and again.id != record.id
        await wait_event(kube, namespace, controller, "RepairRestoredAllocation", address)
    # The claim's release (its IPAddress names the deleted id) deletes the new record.
    async with netbox_controller(repair=RepairSettings(interval=0)):
        await kube.delete(CLAIMS, "node-0", namespace)
        await wait_for(lambda: _gone(kube, namespace, "node-0"), timeout=60, message="claim node-0 to be gone")
        assert marked(netbox, uid) == []


async def _gone(kube: KubeClient, namespace: str, name: str) -> bool:
    return await kube.get(CLAIMS, name, namespace) is None


async def test_an_address_re_taken_by_a_foreign_object_is_a_duplicate_never_handed_out(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    await start_pool(kube, namespace, netbox, "10.162.0.0/24")
    async with netbox_controller(repair=REPAIR) as controller:
        created = await kube.create(CLAIMS, nb_claim("node-0", "net"), namespace)
        address = (await wait_address(kube, namespace, "node-0"))["spec"]["address"]
        (record,) = marked(netbox, created["metadata"]["uid"])
        record.delete()
        foreign = netbox.api().ipam.ip_addresses.create(address=f"{address}/24", description="a machine")
        holder = f"NetBox IP address {foreign.id} (not ours)"

        async def duplicate() -> Object | None:
            pool = await kube.get(NB_POOLS, "net", namespace)
            conditions = ((pool or {}).get("status") or {}).get("conditions") or []
            found = next((c for c in conditions if c.get("type") == "AddressesRecorded"), None)
            return found if found is not None and found.get("reason") == "DuplicateAddress" else None

        condition = await wait_for(duplicate, timeout=60, message="the pool's AddressesRecorded to be DuplicateAddress")
        assert f"{namespace}/node-0" in condition["message"] and holder in condition["message"], condition
        await wait_event(kube, namespace, controller, "DuplicateAddress", holder)
        at_address = netbox.api().ipam.ip_addresses.filter(address=address, vrf_id="null")
        assert [r.id for r in at_address] == [foreign.id], "the foreign object stays; nothing of ours is made"
        await kube.create(CLAIMS, nb_claim("node-1", "net"), namespace)
        assert (await wait_address(kube, namespace, "node-1"))["spec"]["address"] != address


async def test_an_address_outside_a_shrunk_pool_is_reported(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    await start_pool(kube, namespace, netbox, "10.163.0.0/24")
    netbox.create_prefix("10.164.0.0/24")
    async with netbox_controller(repair=REPAIR) as controller:
        await kube.create(CLAIMS, nb_claim("node-0", "net"), namespace)
        address = (await wait_address(kube, namespace, "node-0"))["spec"]["address"]
        # The pool moves to another prefix: the live IPAddress now names an address outside it.
        await kube.patch(NB_POOLS, "net", {"spec": {"sources": [prefix("10.164.0.0/24")]}}, namespace)
        text = await wait_event(kube, namespace, controller, "AddressOutsidePool", address)
        assert "DuplicateAddress" not in text
