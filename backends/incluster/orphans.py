"""Reservations left behind by pools that no longer exist.

A pool deleted through the `skip-validate-delete-webhook` annotation (as `clusterctl move` does), whose claims and
IPAddresses were then removed without their finalizers running, leaves its reservations behind: no claim will ever
release them, and the repair loop's comparison visits live pools only. The loop calls the backend's
`sweep_orphaned` once per pass, which runs `sweep_orphans` at most once every 10 minutes (see `repair`).

Contract:
- `sweep_orphans` lists every reservation once and deletes those whose pool (by its group, kind, namespace and name)
  does not exist, that are older than `grace_seconds`, and that no IPAddress still names: the IPAddress of the
  reservation's claim name, in its namespace, naming the same pool and address. Such an IPAddress keeps its
  reservation, so that a pool re-created under the same name cannot hand its address out again. A released
  reservation is kept until the reuse grace period recorded on it has passed (the other pools of its uniqueness
  domain honour it too).
- A pool the caller knows to exist (`known`, from its synced pool caches) is not read again; every other pool is
  read from the API server before its reservations go. Reservations of pool kinds the caller does not serve are
  left alone. Deletion uses the reservation's uid and
  resourceVersion preconditions, so one changed meanwhile is kept; several processes may sweep at once.
- Nothing can be allocated from a pool that does not exist, so no new holder can appear while this runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence

import structlog

from backends.incluster.reservations import (
    RESERVATIONS,
    Reservation,
    ReservationClient,
    age_seconds,
    pool_of,
)
from ipam_provider.api.pools import names_pool
from ipam_provider.backend.contract import PoolKind, PoolRef
from ipam_provider.common import normalized_address
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import ADDRESSES, Resource

log = structlog.get_logger(__name__)


def pool_resource(kind: PoolKind) -> Resource:
    return Resource(kind.group, kind.version, kind.plural, kind.kind, kind.namespaced)


async def still_named(kube: KubeClient, reservation: Reservation, ref: PoolRef) -> bool:
    """Whether the IPAddress of the reservation's claim name, read now, names the pool `ref` and its address."""
    namespace, _, name = reservation.claim.partition("/")
    if not name:
        return False
    address = await kube.get(ADDRESSES, name, namespace)
    if address is None or not names_pool(address, ref):
        return False
    return normalized_address(str((address.get("spec") or {}).get("address", ""))) == normalized_address(
        reservation.address
    )


def _in_reuse_grace(reservation: Reservation) -> bool:
    """Whether a released reservation's recorded reuse grace period is still running (the other pools of its
    uniqueness domain must not reuse the address before then)."""
    grace = reservation.grace_seconds
    return bool(reservation.released_at) and grace is not None and age_seconds(reservation.released_at or "") < grace


async def sweep_orphans(
    kube: KubeClient,
    reservations: ReservationClient,
    kinds: Sequence[PoolKind],
    grace_seconds: float,
    known: Collection[PoolRef] = (),
) -> int:
    """Delete the reservations of pools that are gone (see the module's contract); answer how many."""
    served = {(kind.group, kind.kind): kind for kind in kinds}
    items, _ = await kube.list(RESERVATIONS)
    by_pool: defaultdict[PoolRef, list[Reservation]] = defaultdict(list)
    for item in items:
        ref = pool_of(item)
        if ref is not None and (ref.group, ref.kind) in served:
            by_pool[ref].append(Reservation.parse(item))
    deleted = 0
    for ref, held in by_pool.items():
        kind = served[(ref.group, ref.kind)]
        if ref in known:
            continue
        if await kube.get(pool_resource(kind), ref.name, ref.namespace if kind.namespaced else None) is not None:
            continue
        for reservation in held:
            if age_seconds(reservation.created_at) < grace_seconds or _in_reuse_grace(reservation):
                continue
            if await still_named(kube, reservation, ref):
                continue
            if not await reservations.delete(reservation):
                continue  # gone or changed since it was listed
            deleted += 1
            log.info("reservation of a deleted pool removed", pool=str(ref), address=reservation.address)
    return deleted
