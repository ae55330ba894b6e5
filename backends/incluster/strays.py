"""Stray reservations of a live in-cluster pool: those whose claim is gone, and a claim's extra ones.

A controller working from a lagging cache can reserve for a claim that another replica has just served or
released; that can never duplicate an address, but it would leak one.

Contract of `sweep_strays`: only the pool's own reservations (by its label) that are live, have a claim uid (pins
not yet taken are not strays, see `pins`, which also frees removed ones), have no IPAddress behind them by the
caller's list, and are older than `grace_seconds` are checked, against fresh reads of their claim and IPAddress;
those whose claim is gone (or has another uid), or whose claim's IPAddress names another address, are deleted
(uid and resourceVersion preconditions) and dropped from the pool's index.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from backends.incluster.indexes import PoolIndexes
from backends.incluster.reservations import Reservation, age_seconds
from ipam_provider.backend.contract import Allocation, PoolRef
from ipam_provider.common import normalized_address
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.resources import ADDRESSES, CLAIMS

log = structlog.get_logger(__name__)


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
