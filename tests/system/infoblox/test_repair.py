"""The repair loop on an InfobloxIPPool, end to end: the real API server, the controller with a short repair interval
and grace period, infoblox-client and the WAPI simulator. Leaked grid objects (of a claim force-deleted without its
finalizer, and of a claim that vanished before its IPAddress was written) are released; an
object deleted behind our back is recorded again at the IPAddress's address; an address re-taken by a foreign
object is reported as a duplicate (Events, the pool's AddressesRecorded condition) and never handed to another
claim; an address outside a pool that moved elsewhere is reported. Each test waits for what only the repair loop
does, so each fails with the loop off (`interval=0`)."""

from __future__ import annotations

import uuid
from typing import Any

from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.infoblox import POOLS, Grid
from tests.support.objects import wait_address, wait_event

REPAIR = RepairSettings(interval=0.5, grace_period=1.0)
Object = dict[str, Any]


def at(grid: Grid, address: str) -> list[Object]:
    return [o for o in grid.sim.state.objects("fixedaddress") if o["ipv4addr"] == address]


async def test_leaked_grid_objects_are_released(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller(repair=REPAIR) as controller:
        for name in ("kept", "forced"):
            await grid.create_claim(name, "net")
        kept = await wait_address(kube, namespace, "kept")
        await wait_address(kube, namespace, "forced")
        kept_claim, forced_claim = [await kube.get(CLAIMS, name, namespace) for name in ("kept", "forced")]
        assert kept_claim is not None and forced_claim is not None
        # A claim force-deleted without its finalizer; its IPAddress deleted by the garbage collector (which this
        # API server does not run), so it waits on the controller's own finalizer.
        await kube.patch(CLAIMS, "forced", {"metadata": {"finalizers": None}}, namespace)
        await kube.delete(CLAIMS, "forced", namespace)
        await kube.delete(ADDRESSES, "forced", namespace)
        # And an object a process posted just before its claim was force-deleted: no IPAddress was ever written.
        marks = {
            "CAPI-Claim-UID": str(uuid.uuid4()),
            "CAPI-Claim-Namespace": namespace,
            "CAPI-Claim-Name": "ghost",
            "CAPI-Pool": f"{namespace}/net",
        }
        ghost = grid.sim.state.add_fixed_address("10.10.0.77", extattrs=marks)

        async def released() -> bool:
            return grid.sim.state.get(ghost) is None and not grid.objects_of(forced_claim["metadata"]["uid"])

        await wait_for(released, timeout=60, message="the repair loop to release both leaked fixed addresses")
        # The ghost's object can only go through the repair loop. The force-deleted claim's may also be released by
        # the claim's own path, when the controller still saw the claim as it went: either way, it is gone.
        await wait_event(kube, namespace, controller, "RepairReleasedLeak", "10.10.0.77")
        assert await kube.get(ADDRESSES, "forced", namespace) is None
        held = [o["ipv4addr"] for o in grid.objects_of(kept_claim["metadata"]["uid"])]
        assert held == [kept["spec"]["address"]], "the live claim's object stays"


async def test_an_object_deleted_behind_our_back_is_recorded_again(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller(repair=REPAIR) as controller:
        created = await grid.create_claim("node-0", "net")
        address = (await wait_address(kube, namespace, "node-0"))["spec"]["address"]
        uid = created["metadata"]["uid"]
        (obj,) = grid.objects_of(uid)
        grid.sim.state.delete(obj["_ref"])

        async def recorded() -> list[Object]:
            return grid.objects_of(uid)

        (again,) = await wait_for(recorded, timeout=30, message="the repair loop to record the address again")
        assert again["ipv4addr"] == address
        await wait_event(kube, namespace, controller, "RepairRestoredAllocation", address)


async def test_an_address_re_taken_by_a_foreign_object_is_a_duplicate_never_handed_out(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller(repair=REPAIR) as controller:
        created = await grid.create_claim("node-0", "net")
        address = (await wait_address(kube, namespace, "node-0"))["spec"]["address"]
        (obj,) = grid.objects_of(created["metadata"]["uid"])
        grid.sim.state.delete(obj["_ref"])
        foreign = grid.sim.state.add_fixed_address(address, comment="a machine outside Kubernetes")

        async def duplicate() -> Object | None:
            pool = await kube.get(POOLS, "net", namespace)
            conditions = ((pool or {}).get("status") or {}).get("conditions") or []
            found = next((c for c in conditions if c.get("type") == "AddressesRecorded"), None)
            return found if found is not None and found.get("reason") == "DuplicateAddress" else None

        condition = await wait_for(duplicate, timeout=30, message="the pool's AddressesRecorded to be DuplicateAddress")
        assert f"{namespace}/node-0" in condition["message"] and foreign in condition["message"], condition
        await wait_event(kube, namespace, controller, "DuplicateAddress", foreign)
        assert [o["_ref"] for o in at(grid, address)] == [foreign], "the foreign object stays; nothing of ours is made"
        await grid.create_claim("node-1", "net")
        assert (await wait_address(kube, namespace, "node-1"))["spec"]["address"] != address


async def test_an_address_outside_a_shrunk_pool_is_reported(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_network("10.12.0.0/24")
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller(repair=REPAIR) as controller:
        await grid.create_claim("node-0", "net")
        address = (await wait_address(kube, namespace, "node-0"))["spec"]["address"]
        # The pool moves to another network: the live IPAddress now names an address outside it.
        await kube.patch(POOLS, "net", {"spec": {"subnets": [{"cidr": "10.12.0.0/24"}]}}, namespace)
        text = await wait_event(kube, namespace, controller, "AddressOutsidePool", address)
        assert "DuplicateAddress" not in text
