"""Reservations for IPAddresses that exist without one.

An IPAddress can name an address of an in-cluster pool although no reservation holds it: it was written by the
Go in-cluster provider before a migration, carried by `clusterctl move` (which does not move reservations), or
restored from a backup. Before this process first allocates from a pool, `reserve_existing` lists the IPAddresses
that name the pool and creates the missing reservations, so that no new claim is given one of their addresses.

Contract:
- The reservation is made for the claim the IPAddress belongs to: the uid of its controller ownerReference of kind
  IPAddressClaim, else the uid of the claim of the IPAddress's `claimRef.name` in its namespace, else no uid
  (nothing of that name exists yet; the claim takes the reservation over when it adopts the IPAddress).
- Reservation creation stays the arbiter: an address reserved meanwhile by anyone (AlreadyExists) is read and
  returned like any other, never overwritten. Several processes may run this at once.
- Addresses that do not parse in the pool's family are skipped: they cannot collide with the pool's addresses.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from backends.incluster.intervals import address_to_int, int_to_address
from backends.incluster.reservations import Reservation, ReservationClient
from ipam_provider.api.pools import names_pool
from ipam_provider.backend.contract import PoolRef
from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import ADDRESSES, CLAIMS

log = structlog.get_logger(__name__)


def controller_claim_uid(address: Object) -> str | None:
    """The uid of the IPAddress's controller ownerReference, when that is an IPAddressClaim."""
    for owner in address["metadata"].get("ownerReferences") or []:
        if owner.get("controller") and owner.get("kind") == CLAIMS.kind and owner.get("uid"):
            return str(owner["uid"])
    return None


def _in_family(value: str, family: int) -> str | None:
    """The canonical text of `value` when it is a plain IP address of `family`, else None."""
    try:
        return int_to_address(address_to_int(value, family), family)
    except ValueError:
        return None


async def reserve_existing(
    kube: KubeClient,
    reservations: ReservationClient,
    ref: PoolRef,
    family: int,
    held: list[Reservation],
    cached: Sequence[Object] | None = None,
) -> list[Reservation]:
    """Make sure every IPAddress naming the pool is held by a reservation; return the reservations created or
    found for them (those in `held`, a fresh list of the pool's reservations, are not repeated). `cached`: the
    pool's IPAddresses from the controller's synced watch cache; without it they are listed from the API server."""
    held_addresses = {_in_family(r.address, family) for r in held}
    items = cached if cached is not None else (await kube.list(ADDRESSES, ref.namespace))[0]
    found: list[Reservation] = []
    for address in items:
        if not names_pool(address, ref):
            continue
        spec, meta = address.get("spec") or {}, address["metadata"]
        value = _in_family(str(spec.get("address", "")), family)
        if value is None or value in held_addresses:
            continue
        namespace = meta.get("namespace", "")
        claim_name = (spec.get("claimRef") or {}).get("name") or meta["name"]
        uid = controller_claim_uid(address)
        if uid is None:
            claim = await kube.get(CLAIMS, claim_name, namespace)
            uid = str(claim["metadata"].get("uid", "")) if claim is not None else ""
        reservation = await reservations.create(
            ref, value, int(spec.get("prefix") or 0), spec.get("gateway") or None, namespace, claim_name, uid
        )
        if reservation is None:  # reserved meanwhile: learn who holds it
            reservation = await reservations.get(ref, value)
        else:
            log.info("reserved the address of an existing IPAddress", pool=str(ref), address=value, claim=claim_name)
        if reservation is not None:
            held_addresses.add(value)
            found.append(reservation)
    return found
