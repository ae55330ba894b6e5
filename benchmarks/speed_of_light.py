"""The speed-of-light baseline of `benchmarks/incluster_throughput.py`: our controller's writes with nothing else.

For each claim, in this order, the same requests with the same bodies as our controller's allocation of a new
claim on an InClusterIPPool: the ReleaseAddress finalizer (merge PATCH of the claim, guarded by its
resourceVersion), the InClusterIPReservation POST (through the in-cluster backend's ReservationClient), the
IPAddress POST (the body from `ipam_provider.reconcile.addresses.desired_address`), the claim's status PATCH
(Ready=True/AddressAllocated and addressRef, guarded by the resourceVersion the finalizer PATCH returned) and one
Normal Event, recorded through our EventRecorder, which writes in the background and combines bursts as the
controller's does (`write_all` ends once every Event is written). Addresses are taken in order from each pool's
CIDR; nothing is read: the claims' and pools' uids and resourceVersions are those the caller passes in. No watch,
no cache, no scheduling: what is left is the API server's cost of the writes.

For the pools scenario (`benchmarks/pools.py`) it also makes our controller's writes for a pool and for a release,
with the bodies the controller sends: the pool's ProtectPool finalizer (merge PATCH guarded by the version its
create returned), its status (`ipAddresses` counts, Ready=True/PoolReady, AddressesOverlap=False and
SpecConsistent=True), and once it is deleted the finalizer removed; for a deleted claim, the IPAddress's
ProtectAddress finalizer removed (guarded by its version), the IPAddress deleted (uid precondition), the
reservation deleted (uid and resourceVersion preconditions) and the claim's ReleaseAddress finalizer removed. The
pool status and the finalizer removals of deleted objects are not guarded: the limit would have to read to know
their versions.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
from backends.incluster.domains import overlap_condition
from backends.incluster.reservations import Reservation
from backends.incluster.spec import consistency_condition
from ipam_provider.api.capi import (
    ADDRESSES,
    CLAIMS,
    FINALIZER_PROTECT_POOL,
    FINALIZER_RELEASE_ADDRESS,
    READY,
    REASON_ALLOCATED,
    Condition,
    IPAddressClaim,
    set_condition,
)
from ipam_provider.backend.contract import (
    STATUS_COUNTS_FIELD,
    AddressCounts,
    Allocation,
    BackendContext,
    ClaimContext,
    ReportCondition,
)
from ipam_provider.controller import ControllerSettings
from ipam_provider.reconcile.addresses import desired_address
from ipam_provider.reconcile.context import ClaimWork, pool_resource
from ipam_provider.runtime.events import NORMAL, EventRecorder
from ipam_provider.runtime.kube.client import KubeClient

Object = dict[str, Any]
log = structlog.get_logger(__name__)
POOL_RESOURCE = pool_resource(IN_CLUSTER_POOL)


class PoolCursor:
    """The next free addresses of one InClusterIPPool whose spec.addresses is one CIDR, lowest first."""

    def __init__(self, pool: Object) -> None:
        self.pool = {"apiVersion": IN_CLUSTER_POOL.api_version, "kind": IN_CLUSTER_POOL.kind, **pool}
        self.ref = IN_CLUSTER_POOL.ref(pool["metadata"]["namespace"], pool["metadata"]["name"])
        self.prefix = int(pool["spec"]["prefix"])
        self._hosts: Iterator[ipaddress.IPv4Address | ipaddress.IPv6Address] = ipaddress.ip_network(
            pool["spec"]["addresses"][0]
        ).hosts()
        self.total = ipaddress.ip_network(pool["spec"]["addresses"][0]).num_addresses - 2  # no network, broadcast

    def next_address(self) -> str:
        return str(next(self._hosts))


@dataclass(frozen=True)
class Written:
    """What one allocation wrote: the claim as its status PATCH returned it, the reservation and the IPAddress."""

    claim: Object
    reservation: Reservation
    address: Object


class LimitWriter:
    """Makes our controller's five writes for one claim at a time (`allocate`), from the pools it was given (or
    `add_pool`s); for the pools scenario also its writes for a release and for a pool."""

    def __init__(self, kube: KubeClient, pools: dict[str, Object]) -> None:
        self.kube = kube
        self.backend = InClusterBackend(BackendContext(kube))
        self.events = EventRecorder(kube, ControllerSettings().component)
        self.cursors = {name: PoolCursor(pool) for name, pool in pools.items()}

    def work(self, claim: Object, cursor: PoolCursor) -> ClaimWork:
        """The controller's work object for a claim as the API server returned it."""
        parsed = IPAddressClaim.model_validate(claim)
        return ClaimWork(claim, parsed, self.backend, IN_CLUSTER_POOL, cursor.ref, cursor.pool, log)

    def add_pool(self, pool: Object) -> None:
        """Serve claims of `pool` (as created) too."""
        self.cursors[pool["metadata"]["name"]] = PoolCursor(pool)

    async def allocate(self, claim: Object) -> Written:
        """The five writes of one allocation, in our controller's order; `claim` as created (uid and
        resourceVersion set)."""
        meta = claim["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        cursor = self.cursors[claim["spec"]["poolRef"]["name"]]
        work = self.work(claim, cursor)
        finalizer = {
            "metadata": {"finalizers": [FINALIZER_RELEASE_ADDRESS], "resourceVersion": meta["resourceVersion"]}
        }
        patched = await self.kube.patch(CLAIMS, name, finalizer, namespace)
        patched.setdefault("apiVersion", CLAIMS.api_version)
        patched.setdefault("kind", CLAIMS.kind)
        address = cursor.next_address()
        held = await self.backend.ledger.reservations.create(
            cursor.ref, Allocation(address, cursor.prefix, None), ClaimContext(namespace, name, meta["uid"])
        )
        if held is None:
            raise RuntimeError(f"{address} of {cursor.ref} is already reserved")
        allocation = Allocation(held.address, held.prefix, held.gateway)
        address_object = await self.kube.create(ADDRESSES, desired_address(work, cursor.pool, allocation), namespace)
        message = f"{allocation.address}/{allocation.prefix} allocated from {cursor.ref}"
        generation = patched["metadata"].get("generation")
        conditions, _ = set_condition(
            [], type=READY, status=True, reason=REASON_ALLOCATED, message=message, generation=generation
        )
        status = {
            "status": {"conditions": [c.wire() for c in conditions], "addressRef": {"name": name}},
            "metadata": {"resourceVersion": patched["metadata"]["resourceVersion"]},
        }
        written = await self.kube.patch(CLAIMS, name, status, namespace, subresource="status")
        self.events.record(patched, NORMAL, REASON_ALLOCATED, message, related=cursor.pool)
        return Written(written, held, address_object)

    async def release(self, written: Written) -> None:
        """Our controller's writes for a deleted claim: the IPAddress's finalizer, the IPAddress, the reservation,
        the claim's finalizer."""
        meta = written.address["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        unprotect = {"metadata": {"finalizers": [], "resourceVersion": meta["resourceVersion"]}}
        patched = await self.kube.patch(ADDRESSES, name, unprotect, namespace)
        await self.kube.delete(ADDRESSES, name, namespace, uid=patched["metadata"]["uid"])
        await self.backend.ledger.reservations.delete(written.reservation)
        claim = written.claim["metadata"]
        await self.kube.patch(CLAIMS, claim["name"], {"metadata": {"finalizers": []}}, claim["namespace"])

    async def protect_pool(self, pool: Object) -> None:
        """The ProtectPool finalizer on `pool` (as created)."""
        meta = pool["metadata"]
        patch = {"metadata": {"finalizers": [FINALIZER_PROTECT_POOL], "resourceVersion": meta["resourceVersion"]}}
        await self.kube.patch(POOL_RESOURCE, meta["name"], patch, meta["namespace"])

    async def report_pool(self, name: str, used: int) -> None:
        """The pool's status once `used` of its addresses are handed out: counts, Ready=True and the conditions of a
        pool that overlaps none and whose spec is consistent, as our controller writes them."""
        cursor = self.cursors[name]
        counts = AddressCounts(total=cursor.total, used=used, free=cursor.total - used, out_of_range=0)
        ready = ReportCondition(READY, True, "PoolReady", f"{counts.free} of {counts.total} addresses free")
        generation = cursor.pool["metadata"].get("generation")
        conditions: list[Condition] = []
        for one in (ready, overlap_condition([], None, None), consistency_condition([])):
            conditions, _ = set_condition(
                conditions,
                type=one.type,
                status=one.status,
                reason=one.reason,
                message=one.message,
                generation=generation,
            )
        status = {"status": {STATUS_COUNTS_FIELD: counts.wire(), "conditions": [c.wire() for c in conditions]}}
        namespace = cursor.pool["metadata"]["namespace"]
        await self.kube.patch(POOL_RESOURCE, name, status, namespace, subresource="status")

    async def let_pool_go(self, name: str, namespace: str) -> None:
        """The ProtectPool finalizer removed from the deleted pool."""
        await self.kube.patch(POOL_RESOURCE, name, {"metadata": {"finalizers": []}}, namespace)


async def write_all(
    kube: KubeClient, claims: asyncio.Queue[Object | None], pools: dict[str, Object], workers: int
) -> None:
    """Allocate every claim put on `claims` (as created: uid and resourceVersion set) from its pool, `workers` at a
    time, each as soon as it arrives; a None per worker ends the run, once every Event is written."""
    writer = LimitWriter(kube, pools)

    async def worker() -> None:
        while (claim := await claims.get()) is not None:
            await writer.allocate(claim)

    writer.events.start()
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(workers):
                group.create_task(worker())
        await writer.events.flush()
    finally:
        await writer.events.close()
