"""The repair loop through the real controller and the real API server, for in-cluster pools: the reservation of a
claim force-deleted without its finalizer is released (a release record under a reuse grace period), a reservation
deleted behind the controller's back is restored for its claim, stray reservations are released while rightful
ones stay, an address left outside a shrunk pool is reported, and the reservations of a deleted pool go unless an
IPAddress names them. Each test fails with the loop off (`REPAIR` with `interval=0`)."""

from __future__ import annotations

from typing import Any

import pytest

from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
from backends.incluster.naming import LABEL_POOL, RESERVATIONS, pool_hash, reservation_name
from backends.incluster.reservations import Reservation, ReservationClient
from ipam_provider.api.capi import ADDRESSES, ANNOTATION_PAUSED, CLAIMS, IPAM_GROUP
from ipam_provider.backend.contract import Allocation, ClaimContext, PoolRef
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import POOLS, claim, pool, wait_address

REPAIR = RepairSettings(interval=1.0, grace_period=2.0)


async def reservation_of(kube: KubeClient, ref: PoolRef, address: str) -> Reservation | None:
    found = await kube.get(RESERVATIONS, reservation_name(ref, address))
    return Reservation.parse(found) if found is not None else None


async def force_delete(kube: KubeClient, namespace: str, name: str) -> None:
    """The claim deleted without its finalizer (paused first, so that the controller neither adds the finalizer back
    nor releases the claim meanwhile), and its IPAddress deleted (by the garbage collector, which this control plane
    does not run); the IPAddress keeps our finalizer, which the repair loop removes."""
    await kube.patch(CLAIMS, name, {"metadata": {"annotations": {ANNOTATION_PAUSED: ""}}}, namespace)
    await kube.patch(CLAIMS, name, {"metadata": {"finalizers": None}}, namespace)
    await kube.delete(CLAIMS, name, namespace)
    await kube.delete(ADDRESSES, name, namespace)


async def pool_event_reasons(kube: KubeClient, namespace: str, wanted: set[str]) -> set[str] | None:
    events, _ = await kube.list(EVENTS, namespace)
    found = {e["reason"] for e in events if e["involvedObject"]["kind"] == "InClusterIPPool"}
    return found if wanted <= found else None


@pytest.mark.parametrize("grace", [None, 3600], ids=["deleted", "release-record"])
async def test_a_force_deleted_claims_reservation_is_released_and_a_lost_one_restored(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory, grace: int | None
) -> None:
    spec: dict[str, Any] = {} if grace is None else {"addressReuseGracePeriodSeconds": grace}
    await kube.create(POOLS, pool("net", ["10.122.0.10-10.122.0.20"], 24, **spec), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "net")
    async with controller_factory(namespaces=[namespace], repair=REPAIR):
        for name in ("kept", "forced"):
            await kube.create(CLAIMS, claim(name, "net"), namespace)
        kept, forced = [(await wait_address(kube, namespace, name))["spec"]["address"] for name in ("kept", "forced")]
        kept_uid = ((await kube.get(CLAIMS, "kept", namespace)) or {})["metadata"]["uid"]
        await force_delete(kube, namespace, "forced")
        await kube.delete(RESERVATIONS, reservation_name(ref, kept))  # behind the controller's back

        async def leak_released() -> bool:
            left = await reservation_of(kube, ref, forced)
            return (
                left is None if grace is None else left is not None and left.claim_uid == "" and bool(left.released_at)
            )

        async def restored() -> bool:
            again = await reservation_of(kube, ref, kept)
            return again is not None and again.claim_uid == kept_uid

        await wait_for(leak_released, timeout=60, message="the force-deleted claim's reservation to be released")
        await wait_for(restored, timeout=60, message="the deleted reservation to be restored for its claim")
        assert await kube.get(ADDRESSES, "forced", namespace) is None, "its finalizer was removed"
        wanted = {"RepairSuspectedLeak", "RepairReleasedLeak", "RepairRestoredAllocation"}
        await wait_for(lambda: pool_event_reasons(kube, namespace, wanted), timeout=30, message="the Events")


async def test_stray_reservations_are_released_and_rightful_ones_kept(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(POOLS, pool("net", ["10.122.1.0/28"], 28), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "net")
    reservations = ReservationClient(kube)
    async with controller_factory(namespaces=[namespace], repair=REPAIR):
        await kube.create(CLAIMS, claim("kept", "net"), namespace)
        kept = (await wait_address(kube, namespace, "kept"))["spec"]["address"]
        kept_uid = ((await kube.get(CLAIMS, "kept", namespace)) or {})["metadata"]["uid"]
        # One whose claim never existed, and an extra one held for the live claim, whose IPAddress names another.
        await reservations.create(
            ref, Allocation("10.122.1.9", 28, None), ClaimContext(namespace, "ghost", "ghost-uid")
        )
        await reservations.create(ref, Allocation("10.122.1.10", 28, None), ClaimContext(namespace, "kept", kept_uid))

        async def swept() -> list[str] | None:
            items, _ = await kube.list(RESERVATIONS, label_selector=f"{LABEL_POOL}={pool_hash(ref)}")
            left = sorted(item["spec"]["address"] for item in items)
            return left if left == [kept] else None

        await wait_for(swept, timeout=60, message="the stray reservations to be released, the rightful one kept")


async def test_an_address_held_for_another_claim_is_reported_as_a_duplicate_and_never_taken(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(POOLS, pool("net", ["10.122.5.10-10.122.5.20"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "net")
    report_only = RepairSettings(interval=1.0, grace_period=2.0, report_only=True)  # else the other holder goes
    async with controller_factory(namespaces=[namespace], repair=report_only):
        await kube.create(CLAIMS, claim("twice", "net"), namespace)
        address = (await wait_address(kube, namespace, "twice"))["spec"]["address"]
        # Behind the controller's back, the address's reservation now holds it for another claim.
        await kube.delete(RESERVATIONS, reservation_name(ref, address))
        await ReservationClient(kube).create(
            ref, Allocation(address, 24, None), ClaimContext(namespace, "elsewhere", "uid-elsewhere")
        )

        async def duplicate_condition() -> str:
            stored = await kube.get(POOLS, "net", namespace) or {}
            for condition in (stored.get("status") or {}).get("conditions") or []:
                if condition["type"] == "AddressesRecorded" and condition["reason"] == "DuplicateAddress":
                    return str(condition["message"])
            return ""

        message = await wait_for(duplicate_condition, timeout=60, message="AddressesRecorded=False/DuplicateAddress")
        assert f"IPAddress {namespace}/twice" in message and f"claim {namespace}/elsewhere in pool {ref}" in message
        held = await reservation_of(kube, ref, address)
        assert held is not None and held.claim_uid == "uid-elsewhere", "a duplicate is never taken over"
        wanted = {"DuplicateAddress"}
        await wait_for(lambda: pool_event_reasons(kube, namespace, wanted), timeout=30, message="the Warning")


async def test_an_address_left_outside_a_shrunk_pool_is_reported(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(POOLS, pool("shrinks", ["10.122.2.10-10.122.2.20"], 24), namespace)
    async with controller_factory(namespaces=[namespace], repair=REPAIR):
        await kube.create(CLAIMS, claim("c", "shrinks"), namespace)
        address = (await wait_address(kube, namespace, "c"))["spec"]["address"]
        await kube.patch(POOLS, "shrinks", {"spec": {"addresses": ["10.122.2.15-10.122.2.20"]}}, namespace)

        async def reported() -> str | None:
            events, _ = await kube.list(EVENTS, namespace)
            found = [e["message"] for e in events if e["reason"] == "AddressOutsidePool"]
            return found[0] if found else None

        message = await wait_for(reported, timeout=60, message="an AddressOutsidePool Event")
        assert f"{address} (it is not in spec.addresses)" in message, message


async def test_reservations_of_a_deleted_pool_go_unless_an_ipaddress_names_them(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    reservations = ReservationClient(kube)
    gone = PoolRef(IPAM_GROUP, "InClusterIPPool", namespace, "moved-away")
    named = PoolRef(IPAM_GROUP, "InClusterIPPool", namespace, "moved-with-address")
    await reservations.create(gone, Allocation("10.122.3.5", 24, None), ClaimContext(namespace, "ghost", "uid-ghost"))
    await reservations.create(named, Allocation("10.122.4.5", 24, None), ClaimContext(namespace, "kept", "uid-kept"))
    # The IPAddress of the second one is still there (its move is not finished): its address stays held.
    body = {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {"name": "kept"},
        "spec": {
            "claimRef": {"name": "kept"},
            "poolRef": {"apiGroup": IPAM_GROUP, "kind": "InClusterIPPool", "name": "moved-with-address"},
            "address": "10.122.4.5",
            "prefix": 24,
        },
    }
    await kube.create(ADDRESSES, body, namespace)
    async with controller_factory(namespaces=[namespace], repair=REPAIR) as controller:
        for backend in controller.registry.backends:  # every pass sweeps (else once per ten minutes)
            if isinstance(backend, InClusterBackend):
                backend.repair.orphan_sweep_every = 0.0

        async def orphan_removed() -> bool:
            return await reservation_of(kube, gone, "10.122.3.5") is None

        await wait_for(orphan_removed, timeout=60, message="the reservation of the deleted pool to be removed")
        assert await reservation_of(kube, named, "10.122.4.5") is not None, "an IPAddress still names it"
