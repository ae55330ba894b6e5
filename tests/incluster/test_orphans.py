"""Reservations of deleted pools against the real API server: a pool removed through the skip-validate annotation
whose claims and IPAddresses went without their finalizers running (as after `clusterctl move`) leaves
reservations no release will ever remove; the controller removes them, except where an IPAddress still names
the address."""

from __future__ import annotations

import pytest

from backends.incluster import sweeps as incluster_sweeps
from backends.incluster.reservations import RESERVATIONS, ReservationClient, reservation_name
from ipam_provider.backend.contract import PoolRef
from ipam_provider.controller import Controller
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.resources import ADDRESSES, IPAM_GROUP
from tests.support.cluster import wait_for
from tests.support.objects import POOLS, pool


def address_object(name: str, pool_name: str, address: str) -> dict[str, object]:
    return {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {"name": name},
        "spec": {
            "claimRef": {"name": name},
            "poolRef": {"apiGroup": IPAM_GROUP, "kind": "InClusterIPPool", "name": pool_name},
            "address": address,
            "prefix": 24,
        },
    }


async def test_reservations_of_deleted_pools_are_removed_unless_an_ipaddress_names_them(
    kube: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch, in_process_controller: Controller
) -> None:
    monkeypatch.setattr(incluster_sweeps, "ORPHAN_SWEEP_INTERVAL", 0.0)
    monkeypatch.setattr(incluster_sweeps, "STRAY_GRACE", 0.0)
    reservations = ReservationClient(kube)
    gone = PoolRef(IPAM_GROUP, "InClusterIPPool", namespace, "moved-away")
    named = PoolRef(IPAM_GROUP, "InClusterIPPool", namespace, "moved-with-address")
    await reservations.create(gone, "10.77.0.5", 24, None, namespace, "ghost", "uid-ghost")
    await reservations.create(named, "10.78.0.5", 24, None, namespace, "kept", "uid-kept")
    # The IPAddress of the second one is still there (its move is not finished): its address stays held.
    await kube.create(ADDRESSES, address_object("kept", "moved-with-address", "10.78.0.5"), namespace)
    # Any in-cluster pool's report runs the sweep.
    await kube.create(POOLS, pool("live", ["10.79.0.0/28"], 24), namespace)

    async def orphan_removed() -> bool:
        return await kube.get(RESERVATIONS, reservation_name(gone, "10.77.0.5")) is None

    await wait_for(orphan_removed, message="the reservation of the deleted pool to be removed")
    assert await kube.get(RESERVATIONS, reservation_name(named, "10.78.0.5")) is not None, (
        "a reservation an IPAddress still names is kept"
    )
