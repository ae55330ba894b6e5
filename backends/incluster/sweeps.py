"""Sweeps of an in-cluster backend's reservations: stray ones of a pool (their claim gone, or a claim's extra ones),
and now and then those of pools that are gone (see `orphans`)."""

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

SWEEP_INTERVAL = 60.0  # at most one sweep for stray reservations per pool and interval
STRAY_GRACE = 60.0  # a reservation younger than this may belong to an allocation in progress
ORPHAN_SWEEP_INTERVAL = 600.0  # at most one sweep for reservations of deleted pools per process and interval


@dataclass
class Sweeps:
    kube: KubeClient
    reservations: ReservationClient
    indexes: PoolIndexes
    kinds: Sequence[PoolKind]
    swept: dict[PoolRef, float] = field(default_factory=dict)
    orphans_swept: float = field(default_factory=time.monotonic)  # the first comes one interval after start

    async def sweep(self, ref: PoolRef, addresses: Sequence[Allocation]) -> None:
        """Delete stray reservations: those whose claim is gone, and a claim's extra ones.

        A controller working from a lagging cache can reserve for a claim that another replica has just
        served or released; that can never duplicate an address, but it would leak one. Only reservations with
        no IPAddress behind them (by the cache) and older than STRAY_GRACE are checked, against fresh reads.
        Reservations without a claim uid (pins not yet taken, see `pins`, which also frees removed ones) are not
        strays.
        """
        now = time.monotonic()
        if now - self.swept.get(ref, 0.0) < SWEEP_INTERVAL:
            return
        self.swept[ref] = now
        backed = {normalized_address(allocation.address) for allocation in addresses}
        for reservation in await self.reservations.list_pool(ref):
            if reservation.released_at or not reservation.claim_uid:
                continue
            if normalized_address(reservation.address) in backed:
                continue
            if age_seconds(reservation.created_at) < STRAY_GRACE:
                continue
            if await self._holds_rightfully(reservation):
                continue
            log.info("stray reservation deleted", pool=str(ref), address=reservation.address, claim=reservation.claim)
            await self.reservations.delete(reservation)
            index = self.indexes.get(ref)  # as it is after the delete
            if index is not None:
                index.drop(reservation)

    async def sweep_orphans(self) -> None:
        """Now and then, from any pool's report: the reservations of pools that are gone (see `orphans`)."""
        now = time.monotonic()
        if now - self.orphans_swept < ORPHAN_SWEEP_INTERVAL:
            return
        self.orphans_swept = now
        await sweep_orphans(self.kube, self.reservations, self.kinds, STRAY_GRACE)

    async def _holds_rightfully(self, reservation: Reservation) -> bool:
        namespace, _, name = reservation.claim.partition("/")
        claim = await self.kube.get(CLAIMS, name, namespace)
        if claim is None or claim["metadata"].get("uid") != reservation.claim_uid:
            return False
        address = await self.kube.get(ADDRESSES, name, namespace)
        if address is None:
            return True  # an allocation in progress: its IPAddress is about to be written
        return normalized_address(str(address.get("spec", {}).get("address", ""))) == normalized_address(
            reservation.address
        )
