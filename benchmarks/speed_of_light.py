"""The speed-of-light baseline of `benchmarks/incluster_throughput.py`: our controller's writes with nothing else.

For each claim, in this order, the same requests with the same body shapes as our controller's allocation of a
new claim on an InClusterIPPool: the ReleaseAddress finalizer (merge PATCH of the claim, guarded by its
resourceVersion), the InClusterIPReservation POST (through our ReservationClient), the IPAddress POST (claim as
controller owner, pool as owner, ProtectAddress finalizer), the claim's status PATCH (Ready=True/AddressAllocated
and addressRef, guarded by the resourceVersion the finalizer PATCH returned) and one Normal Event, recorded through
our EventRecorder, which writes in the background and combines bursts as the controller's does (`write_all` ends
once every Event is written). `workers` claims are in flight at once, like our controller's --workers. Addresses
are taken in order from each pool's CIDR; nothing is read: the claims' and pools' uids and resourceVersions are
those the caller passes in. No watch, no cache, no scheduling: what is left is the API server's cost of the writes.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterator
from typing import Any

from backends.incluster.reservations import ReservationClient
from ipam_provider.api.capi import FINALIZER_PROTECT_ADDRESS, FINALIZER_RELEASE_ADDRESS, READY, REASON_ALLOCATED
from ipam_provider.api.meta import set_condition
from ipam_provider.backend.contract import PoolRef
from ipam_provider.controller import ControllerSettings
from ipam_provider.events import NORMAL, EventRecorder
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.resources import ADDRESSES, CLAIMS, IPAM_GROUP

Object = dict[str, Any]


class PoolCursor:
    """The next free addresses of one InClusterIPPool whose spec.addresses is one CIDR, lowest first."""

    def __init__(self, pool: Object) -> None:
        self.pool = {"apiVersion": f"{IPAM_GROUP}/v1alpha2", "kind": "InClusterIPPool", **pool}  # LIST items lack them
        self.ref = PoolRef(IPAM_GROUP, self.pool["kind"], pool["metadata"]["namespace"], pool["metadata"]["name"])
        self.prefix = int(pool["spec"]["prefix"])
        self._hosts: Iterator[ipaddress.IPv4Address | ipaddress.IPv6Address] = ipaddress.ip_network(
            pool["spec"]["addresses"][0]
        ).hosts()

    def next_address(self) -> str:
        return str(next(self._hosts))


def address_body(claim: Object, cursor: PoolCursor, address: str) -> Object:
    """The IPAddress our controller writes for `claim` (no cluster label: the benchmark's claims have none)."""
    name, pool = claim["metadata"]["name"], cursor.pool
    owners = [
        {
            "apiVersion": claim["apiVersion"],
            "kind": claim["kind"],
            "name": name,
            "uid": claim["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        },
        {
            "apiVersion": pool["apiVersion"],
            "kind": pool["kind"],
            "name": pool["metadata"]["name"],
            "uid": pool["metadata"]["uid"],
            "controller": False,
            "blockOwnerDeletion": True,
        },
    ]
    return {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {
            "name": name,
            "namespace": claim["metadata"]["namespace"],
            "labels": {},
            "annotations": {},
            "finalizers": [FINALIZER_PROTECT_ADDRESS],
            "ownerReferences": owners,
        },
        "spec": {
            "claimRef": {"name": name},
            "poolRef": {"apiGroup": IPAM_GROUP, "kind": pool["kind"], "name": pool["metadata"]["name"]},
            "address": address,
            "prefix": cursor.prefix,
        },
    }


async def allocate_one(
    kube: KubeClient, reservations: ReservationClient, events: EventRecorder, claim: Object, cursor: PoolCursor
) -> None:
    """The five writes of one allocation, in our controller's order."""
    meta = claim["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    finalizer = {"metadata": {"finalizers": [FINALIZER_RELEASE_ADDRESS], "resourceVersion": meta["resourceVersion"]}}
    patched = await kube.patch(CLAIMS, name, finalizer, namespace)
    patched.setdefault("apiVersion", CLAIMS.api_version)
    patched.setdefault("kind", CLAIMS.kind)
    address = cursor.next_address()
    held = await reservations.create(cursor.ref, address, cursor.prefix, None, namespace, name, meta["uid"])
    if held is None:
        raise RuntimeError(f"{address} of {cursor.ref} is already reserved")
    await kube.create(ADDRESSES, address_body(claim, cursor, address), namespace)
    message = f"{address}/{cursor.prefix} allocated from {cursor.ref}"
    generation = patched["metadata"].get("generation")
    conditions, _ = set_condition(
        [], type=READY, status=True, reason=REASON_ALLOCATED, message=message, generation=generation
    )
    status = {
        "status": {"conditions": [c.wire() for c in conditions], "addressRef": {"name": name}},
        "metadata": {"resourceVersion": patched["metadata"]["resourceVersion"]},
    }
    await kube.patch(CLAIMS, name, status, namespace, subresource="status")
    events.record(patched, NORMAL, REASON_ALLOCATED, message, related=cursor.pool)


async def write_all(kube: KubeClient, claims: list[Object], pools: dict[str, Object], workers: int) -> None:
    """Allocate every claim (as created: uid and resourceVersion set) from its pool, `workers` at a time."""
    cursors = {name: PoolCursor(pool) for name, pool in pools.items()}
    reservations = ReservationClient(kube)
    events = EventRecorder(kube, ControllerSettings().component)
    queue: asyncio.Queue[Object] = asyncio.Queue()
    for claim in claims:
        queue.put_nowait(claim)

    async def worker() -> None:
        while not queue.empty():
            claim = queue.get_nowait()
            await allocate_one(kube, reservations, events, claim, cursors[claim["spec"]["poolRef"]["name"]])

    events.start()
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(workers):
                group.create_task(worker())
        await events.flush()
    finally:
        await events.close()
