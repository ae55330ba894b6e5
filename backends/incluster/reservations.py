"""`InClusterIPReservation`s as read (`Reservation`) and the API calls on them (`ReservationClient`).

A *release record* (`spec.releasedAt`, claim uid "") holds the address for no claim until its grace period is over
or, under LeastRecentlyReleased, as its place in the reuse order. Every write but a create is guarded by the
resourceVersion (a delete by the uid too).
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from backends.incluster.naming import (
    ANNOTATION_GRACE,
    LABEL_CLAIM_UID,
    LABEL_DOMAIN,
    LABEL_POOL,
    RESERVATIONS,
    pool_hash,
    reservation_name,
)
from ipam_provider.api.capi import ADDRESSES, names_pool
from ipam_provider.backend.contract import Allocation, ClaimContext, PoolRef
from ipam_provider.common import Object, normalized_address
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError


def epoch(timestamp: str) -> float | None:
    """An RFC 3339 timestamp in epoch seconds (UTC when it names no zone); None when it does not parse."""
    try:
        moment = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)).timestamp()


def age_seconds(timestamp: str) -> float:
    """Seconds since an RFC 3339 timestamp (`creationTimestamp`, `releasedAt`); infinite if it does not parse."""
    then = epoch(timestamp)
    return float("inf") if then is None else datetime.datetime.now(datetime.UTC).timestamp() - then


@dataclass(frozen=True)
class Reservation:
    name: str
    address: str
    prefix: int
    gateway: str | None
    claim_uid: str
    claim: str
    released_at: str | None
    resource_version: str
    uid: str
    created_at: str = ""
    pool_label: str = ""  # the pool hash of the pool holding it (see `pool_hash`)
    grace_seconds: int | None = None  # a release record's recorded reuse grace period (ANNOTATION_GRACE)
    pool: PoolRef | None = None  # the pool holding it, from its spec (see `pool_of`)

    @classmethod
    def parse(cls, obj: Object) -> Reservation:
        spec, meta = obj.get("spec", {}), obj["metadata"]
        claim = spec.get("claim", {})
        grace = (meta.get("annotations") or {}).get(ANNOTATION_GRACE, "")
        return cls(
            name=meta["name"],
            address=spec["address"],
            prefix=int(spec.get("prefix", 0)),
            gateway=spec.get("gateway"),
            claim_uid=claim.get("uid", ""),
            claim=f"{claim.get('namespace', '')}/{claim.get('name', '')}",
            released_at=spec.get("releasedAt"),
            resource_version=meta.get("resourceVersion", ""),
            uid=meta.get("uid", ""),
            created_at=meta.get("creationTimestamp", ""),
            pool_label=(meta.get("labels") or {}).get(LABEL_POOL, ""),
            grace_seconds=int(grace) if grace.isdigit() else None,
            pool=pool_of(obj),
        )

    @property
    def released_epoch(self) -> float:
        """`releasedAt` in epoch seconds; minus infinity (the oldest) when it does not parse."""
        released = epoch(self.released_at or "")
        return float("-inf") if released is None else released


def pool_of(obj: Object) -> PoolRef | None:
    """The pool a reservation object names in its spec; None when it names none."""
    pool = (obj.get("spec") or {}).get("pool") or {}
    if not pool.get("kind") or not pool.get("name"):
        return None
    return PoolRef(str(pool.get("apiGroup") or ""), str(pool["kind"]), pool.get("namespace"), str(pool["name"]))


def _claim_ref(claim: ClaimContext) -> Object:
    return {"namespace": claim.namespace, "name": claim.name, "uid": claim.uid}


Answer = TypeVar("Answer")


async def unless_changed(write: Awaitable[Answer]) -> Answer | None:
    """The answer of a guarded `write`; None when its object changed or went since it was read (conflict, not
    found)."""
    try:
        return await write
    except ApiError as error:
        if error.conflict or error.not_found:
            return None
        raise


class ReservationClient:
    """The API calls on reservations; the index of a pool is kept in step by the `ledger`, never here."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._domains: dict[PoolRef, str] = {}
        # Told of each reservation this client creates for a pool of a uniqueness domain (`Ledger._share`).
        self.on_domain_create: Callable[[PoolRef, str, Reservation], None] = lambda ref, domain, reservation: None

    def note_domain(self, ref: PoolRef, domain: str | None) -> None:
        """Record the uniqueness domain the pool names now (None: none)."""
        if domain:
            self._domains[ref] = domain
        else:
            self._domains.pop(ref, None)

    def domain_of(self, ref: PoolRef) -> str | None:
        return self._domains.get(ref)

    def forget(self, ref: PoolRef) -> None:
        """The pool is gone: its noted domain goes too."""
        self._domains.pop(ref, None)

    def noted_pools(self, domain: str) -> list[PoolRef]:
        """The pools noted as naming `domain` (by `note_domain`)."""
        return [ref for ref, noted in self._domains.items() if noted == domain]

    async def create(self, ref: PoolRef, held: Allocation, claim: ClaimContext) -> Reservation | None:
        """Create the reservation of `held` for `claim`; None when the address is already reserved (by anyone)."""
        pool = {"apiGroup": ref.group, "kind": ref.kind, "name": ref.name}
        pool |= {"namespace": ref.namespace} if ref.namespace else {}
        spec: Object = {"pool": pool, "address": held.address, "prefix": held.prefix, "claim": _claim_ref(claim)}
        if held.gateway:
            spec["gateway"] = held.gateway
        domain = self.domain_of(ref)
        labels = {LABEL_POOL: pool_hash(ref), LABEL_CLAIM_UID: claim.uid} | ({LABEL_DOMAIN: domain} if domain else {})
        metadata = {"name": reservation_name(ref, held.address, domain), "labels": labels}
        body = {"apiVersion": RESERVATIONS.api_version, "kind": RESERVATIONS.kind, "metadata": metadata, "spec": spec}
        try:
            created = Reservation.parse(await self.kube.create(RESERVATIONS, body))
        except ApiError as error:
            if error.already_exists:
                return None
            raise
        if domain:
            self.on_domain_create(ref, domain, created)
        return created

    async def get(self, ref: PoolRef, address: str) -> Reservation | None:
        """The reservation of `address` for the pool (of any pool of its domain, for a domain pool)."""
        obj = await self.kube.get(RESERVATIONS, reservation_name(ref, address, self.domain_of(ref)))
        return Reservation.parse(obj) if obj is not None else None

    async def _list(self, selector: str) -> list[Reservation]:
        items, _ = await self.kube.list(RESERVATIONS, label_selector=selector)
        return [Reservation.parse(item) for item in items]

    async def list_pool(self, ref: PoolRef) -> list[Reservation]:
        """The pool's own reservations."""
        return await self._list(f"{LABEL_POOL}={pool_hash(ref)}")

    async def list_index(self, ref: PoolRef) -> list[Reservation]:
        """The reservations holding addresses the pool must not hand out: its own, or a domain pool's domain's."""
        domain = self.domain_of(ref)
        return await self._list(f"{LABEL_DOMAIN}={domain}") if domain else await self.list_pool(ref)

    async def list_claim(self, ref: PoolRef, claim_uid: str) -> list[Reservation]:
        return await self._list(f"{LABEL_POOL}={pool_hash(ref)},{LABEL_CLAIM_UID}={claim_uid}")

    async def delete(self, reservation: Reservation) -> bool:
        """Delete exactly this reservation; False when it was gone or changed since it was read (left alone)."""
        try:
            return await self.kube.delete(
                RESERVATIONS, reservation.name, uid=reservation.uid, resource_version=reservation.resource_version
            )
        except ApiError as error:
            if not error.conflict:
                raise
            return False

    async def mark_released(self, reservation: Reservation, at: str, grace_seconds: int | None = None) -> Reservation:
        """Make the reservation a release record, recording the pool's reuse grace period `grace_seconds`."""
        annotations = {ANNOTATION_GRACE: str(grace_seconds)} if grace_seconds is not None else None
        return await self._patch_claim(reservation, None, {"releasedAt": at, "claim": {"uid": ""}}, annotations)

    async def reassign(self, reservation: Reservation, claim_uid: str) -> Reservation:
        """Give the reservation to the claim of the same namespace/name with another uid, or back to its pin
        (`claim_uid` ""); the address stays held throughout. A concurrent change raises ApiError (conflict)."""
        spec: Object = {"claim": {"uid": claim_uid}} | ({"releasedAt": None} if reservation.released_at else {})
        return await self._patch_claim(reservation, claim_uid, spec)

    async def take_over(self, record: Reservation, held: Allocation, claim: ClaimContext) -> Reservation | None:
        """Give the release record `record` to `claim`. None when it changed or went since it was read, or when its
        prefix or gateway are not `held`'s (which a reservation never changes): then it is deleted, and the address
        is free to reserve anew. The caller reads the current state."""
        if record.prefix != held.prefix or (record.gateway or None) != (held.gateway or None):
            await self.delete(record)
            return None
        return await unless_changed(
            self._patch_claim(record, claim.uid, {"releasedAt": None, "claim": _claim_ref(claim)})
        )

    async def _patch_claim(
        self, reservation: Reservation, uid_label: str | None, spec: Object, annotations: Object | None = None
    ) -> Reservation:
        """Patch the spec, the claim-uid label (None removes it) and `annotations`, guarded by resourceVersion."""
        meta: Object = {"resourceVersion": reservation.resource_version, "labels": {LABEL_CLAIM_UID: uid_label}}
        if annotations:
            meta["annotations"] = annotations
        updated = await self.kube.patch(RESERVATIONS, reservation.name, {"metadata": meta, "spec": spec})
        return Reservation.parse(updated)

    async def still_named(self, reservation: Reservation, ref: PoolRef) -> bool:
        """Whether the IPAddress of the reservation's claim name, read now, names the pool `ref` and its address."""
        namespace, _, name = reservation.claim.partition("/")
        address = await self.kube.get(ADDRESSES, name, namespace) if name else None
        if address is None or not names_pool(address, ref):
            return False
        named = str((address.get("spec") or {}).get("address", ""))
        return normalized_address(named) == normalized_address(reservation.address)
