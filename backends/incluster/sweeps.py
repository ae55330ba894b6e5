"""Sweeps of an in-cluster backend's reservations: stray ones of a live pool, and now and then those of pools that
are gone (see `orphans`).

A controller working from a lagging cache can reserve for a claim that another replica has just served or
released; that can never duplicate an address, but it would leak one.

Contract of `sweep_strays`: only the pool's own reservations (by its label) that are live, have a claim uid (pins
not yet taken are not strays, see `pins`, which also frees removed ones), have no IPAddress behind them by the
caller's list, and are older than `grace_seconds` are checked, against fresh reads of their claim and IPAddress;
those whose claim is gone (or has another uid), or whose claim's IPAddress names another address, are deleted
(uid and resourceVersion preconditions) and dropped from the pool's index.

`Sweeps` runs the stray sweep at most once per SWEEP_INTERVAL and pool object (a pool re-created under the same
name is swept at once), and the orphan sweep at most once per ORPHAN_SWEEP_INTERVAL and process.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from backends.incluster.indexes import PoolIndexes
from backends.incluster.orphans import sweep_orphans
from backends.incluster.reservations import Reservation, ReservationClient, age_seconds
from ipam_provider.backend.contract import Allocation, PoolKind, PoolRef
from ipam_provider.common import normalized_address
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.resources import ADDRESSES, CLAIMS

log = structlog.get_logger(__name__)

SWEEP_INTERVAL = 60.0  # at most one sweep for stray reservations per pool object and interval
STRAY_GRACE = 60.0  # a reservation younger than this may belong to an allocation in progress
ORPHAN_SWEEP_INTERVAL = 600.0  # at most one sweep for reservations of deleted pools per process and interval


@dataclass
class Sweeps:
    kube: KubeClient
    reservations: ReservationClient
    indexes: PoolIndexes
    kinds: Sequence[PoolKind]
    swept: dict[tuple[PoolRef, str], float] = field(default_factory=dict)  # by pool and pool object (uid)
    orphans_swept: float = field(default_factory=time.monotonic)  # the first comes one interval after start

    async def sweep(self, ref: PoolRef, addresses: Sequence[Allocation], uid: str = "") -> None:
        """At most once per SWEEP_INTERVAL and pool object (`uid`): delete the pool's stray reservations
        (`sweep_strays`); `addresses`: its IPAddresses' allocations."""
        now = time.monotonic()
        if now - self.swept.get((ref, uid), 0.0) < SWEEP_INTERVAL:
            return
        self.swept = {key: at for key, at in self.swept.items() if key[0] != ref}  # an older object's is over
        self.swept[(ref, uid)] = now
        await sweep_strays(self.indexes, ref, addresses, STRAY_GRACE)

    async def sweep_orphans(self) -> None:
        """Now and then, from any pool's report: the reservations of pools that are gone (see `orphans`)."""
        now = time.monotonic()
        if now - self.orphans_swept < ORPHAN_SWEEP_INTERVAL:
            return
        self.orphans_swept = now
        await sweep_orphans(self.kube, self.reservations, self.kinds, STRAY_GRACE)


async def sweep_strays(
    indexes: PoolIndexes, ref: PoolRef, addresses: Sequence[Allocation], grace_seconds: float
) -> None:
    """Delete the pool's stray reservations (see the module's contract); `addresses`: its IPAddresses' allocations."""
    backed = {normalized_address(allocation.address) for allocation in addresses}
    for reservation in await indexes.reservations.list_pool(ref):
        if reservation.released_at or not reservation.claim_uid:
            continue
        if normalized_address(reservation.address) in backed:
            continue
        if age_seconds(reservation.created_at) < grace_seconds:
            continue
        if await _holds_rightfully(indexes.kube, reservation):
            continue
        log.info("stray reservation deleted", pool=str(ref), address=reservation.address, claim=reservation.claim)
        await indexes.reservations.delete(reservation)
        index = indexes.get(ref)  # as it is after the delete
        if index is not None:
            index.drop(reservation)


async def _holds_rightfully(kube: KubeClient, reservation: Reservation) -> bool:
    namespace, _, name = reservation.claim.partition("/")
    claim = await kube.get(CLAIMS, name, namespace)
    if claim is None or claim["metadata"].get("uid") != reservation.claim_uid:
        return False
    address = await kube.get(ADDRESSES, name, namespace)
    if address is None:
        return True  # an allocation in progress: its IPAddress is about to be written
    return normalized_address(str(address.get("spec", {}).get("address", ""))) == normalized_address(
        reservation.address
    )
