"""Release records: how a released address is remembered, in the API server, and reused.

A release marks the claim's reservation released (`spec.releasedAt`, the claim's uid cleared) instead of deleting
it when the pool has a reuse grace period or uses the LeastRecentlyReleased strategy. Such a reservation is the
address's *release record*:

- With a grace period and another strategy, the record holds the address until the period is over; then it is
  deleted (`PoolIndex.expired_releases`) and the address is free again.
- Under LeastRecentlyReleased the record is never deleted for expiry: it is the address's place in the reuse order.
  Every index orders the records by `releasedAt` (then address), so the order comes from the API server and
  survives a restart and a change of leader. A dynamic allocation takes addresses that never had a reservation
  first; then the record released longest ago whose grace period (if any) is over, which it *takes over*: a merge
  patch guarded by the record's resourceVersion that gives it to the new claim and clears `releasedAt`. Two
  processes taking over the same record cannot both succeed: the API server accepts the first patch and answers
  409 Conflict to the other, which learns the current state and takes its next candidate — as create-uniqueness
  decides for addresses without a record. The reservation CRD's CEL rule allows exactly this change of a released
  reservation (same pool, address, prefix and gateway; any claim); a record whose pool changed its prefix or
  gateway since is deleted instead, and the address reserved anew.
- In a uniqueness domain a pool takes over only its own records (see `PoolIndex.owns`). Under LeastRecentlyReleased
  a release records no grace period on the record, so the domain's other pools never delete it (see `domains`).

A requested or pre-allocated address with an expired record of the pool's own is taken over the same way
(`PoolIndex.take_specific` accepts it; see `requested`, `pins`).
"""

from __future__ import annotations

import datetime

from backends.incluster.policy import AllocationStrategy
from backends.incluster.reservations import LABEL_CLAIM_UID, RESERVATIONS, Reservation, ReservationClient
from ipam_provider.backend.contract import PoolRef
from ipam_provider.common import Object
from ipam_provider.runtime.kube.errors import ApiError


def released_epoch(reservation: Reservation) -> float:
    """The record's `releasedAt` in epoch seconds; minus infinity (the oldest) when it does not parse."""
    try:
        moment = datetime.datetime.fromisoformat((reservation.released_at or "").replace("Z", "+00:00"))
    except ValueError:
        return float("-inf")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def keeps_release_records(strategy: AllocationStrategy, grace_seconds: int | None) -> bool:
    """Whether a release marks the reservation released (keeps a record) rather than deleting it."""
    return bool(grace_seconds) or strategy is AllocationStrategy.LEAST_RECENTLY_RELEASED


async def take_over(
    reservations: ReservationClient,
    record: Reservation,
    prefix: int,
    gateway: str | None,
    claim_namespace: str,
    claim_name: str,
    claim_uid: str,
) -> Reservation | None:
    """Give the release record `record` to the claim (a live reservation again). None when the record changed or
    went since it was read (someone else took it, or released it anew), or when it had another prefix or gateway
    than the pool's now (which a reservation never changes): then it is deleted, guarded by its resourceVersion, and
    the address is free to reserve anew. The caller reads the current state."""
    if record.prefix != prefix or (record.gateway or None) != (gateway or None):
        await reservations.delete(record)
        return None
    spec: Object = {
        "releasedAt": None,
        "claim": {"namespace": claim_namespace, "name": claim_name, "uid": claim_uid},
    }
    meta = {"resourceVersion": record.resource_version, "labels": {LABEL_CLAIM_UID: claim_uid}}
    try:
        updated = await reservations.kube.patch(RESERVATIONS, record.name, {"metadata": meta, "spec": spec})
    except ApiError as error:
        if error.conflict or error.not_found:
            return None
        raise
    return Reservation.parse(updated)


async def reserve_or_take_over(
    reservations: ReservationClient,
    ref: PoolRef,
    record: Reservation | None,
    address: str,
    prefix: int,
    gateway: str | None,
    claim: tuple[str, str, str],
) -> Reservation | None:
    """Reserve `address` for `claim` (namespace, name, uid): take over `record`, its release record, when given,
    else create the reservation. The reservation made, else the one found in the address's place, else None (no
    reservation holds the address now)."""
    if record is not None:
        made = await take_over(reservations, record, prefix, gateway, *claim)
    else:
        made = await reservations.create(ref, address, prefix, gateway, *claim)
    return made if made is not None else await reservations.get(ref, address)
