"""Reservations: the record that an address of an in-cluster pool is held by one claim.

A reservation is a cluster-scoped `InClusterIPReservation` whose *name* encodes (pool, address). The API
server refuses to create a second object of the same name, so two controller processes, or one with a stale
cache, can never both hold an address: etcd's create-uniqueness decides, as for Service ClusterIPs (KEP-1880).

A pool of a uniqueness domain (see `domains`) names its reservations by (domain, address) instead, so that no two
pools of the domain hold one address. Every reservation carries its pool's label (`list_pool`, `list_claim`); those
of a domain also carry the domain's label, by which `list_index` lists what a domain pool must treat as used.
The client learns each pool's domain from `note_domain`, which the backend calls whenever it reads a pool, before
it makes or reads any of the pool's reservations.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from ipam_provider.backend.contract import PoolRef
from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import IPAM_GROUP, Resource

RESERVATIONS = Resource(IPAM_GROUP, "v1alpha2", "inclusteripreservations", "InClusterIPReservation", False)
LABEL_POOL = "ipam.cluster.x-k8s.io/pool-hash"
LABEL_CLAIM_UID = "ipam.cluster.x-k8s.io/claim-uid"
LABEL_DOMAIN = "ipam.cluster.x-k8s.io/uniqueness-domain"
# On a released reservation: the reuse grace period of its pool when it was released, so that the other pools of
# its uniqueness domain know when it may be deleted.
ANNOTATION_GRACE = "ipam.cluster.x-k8s.io/reuse-grace-period-seconds"


def pool_hash(ref: PoolRef) -> str:
    identity = f"{ref.group}/{ref.kind}/{ref.namespace or ''}/{ref.name}"
    return hashlib.sha256(identity.encode()).hexdigest()[:20]


def age_seconds(timestamp: str) -> float:
    """Seconds since an RFC 3339 timestamp (`creationTimestamp`, `releasedAt`); infinite if it does not parse."""
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return (datetime.datetime.now(datetime.UTC) - then).total_seconds()


def domain_hash(domain: str) -> str:
    return hashlib.sha256(f"uniqueness-domain/{domain}".encode()).hexdigest()[:20]


def _encoded(address: str) -> str:
    ip = ipaddress.ip_address(address)
    return str(ip) if ip.version == 4 else ip.exploded.replace(":", "-")


def reservation_name(ref: PoolRef, address: str, domain: str | None = None) -> str:
    """The name of the reservation of `address` for the pool `ref`, or for every pool of `domain` when given."""
    return f"{domain_hash(domain) if domain else pool_hash(ref)}.{_encoded(address)}"


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
    grace_seconds: int | None = None  # a released reservation's recorded reuse grace period (ANNOTATION_GRACE)
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

    def holder(self) -> str:
        """Who holds it, for messages: its claim and, when known, its pool."""
        return f"claim {self.claim} of {self.pool}" if self.pool is not None else f"claim {self.claim}"


def pool_of(obj: Object) -> PoolRef | None:
    """The pool a reservation object names in its spec; None when it names none."""
    pool = (obj.get("spec") or {}).get("pool") or {}
    if not pool.get("kind") or not pool.get("name"):
        return None
    return PoolRef(str(pool.get("apiGroup") or ""), str(pool["kind"]), pool.get("namespace"), str(pool["name"]))


class ReservationClient:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._domains: dict[PoolRef, str] = {}
        # Told of each reservation this client creates for a pool of a uniqueness domain (see `indexes`).
        self.on_domain_create: Callable[[PoolRef, Reservation], None] = lambda ref, reservation: None

    def note_domain(self, ref: PoolRef, domain: str | None) -> None:
        """Record the uniqueness domain the pool names now (None: none)."""
        if domain:
            self._domains[ref] = domain
        else:
            self._domains.pop(ref, None)

    def domain_of(self, ref: PoolRef) -> str | None:
        return self._domains.get(ref)

    def noted_pools(self, domain: str) -> list[PoolRef]:
        """The pools noted as naming `domain` (by `note_domain`)."""
        return [ref for ref, noted in self._domains.items() if noted == domain]

    async def create(
        self,
        ref: PoolRef,
        address: str,
        prefix: int,
        gateway: str | None,
        claim_ns: str,
        claim_name: str,
        claim_uid: str,
    ) -> Reservation | None:
        """Create the reservation; None when the address is already reserved (by anyone)."""
        spec: Object = {
            "pool": {"apiGroup": ref.group, "kind": ref.kind, "name": ref.name},
            "address": address,
            "prefix": prefix,
            "claim": {"namespace": claim_ns, "name": claim_name, "uid": claim_uid},
        }
        if ref.namespace:
            spec["pool"]["namespace"] = ref.namespace
        if gateway:
            spec["gateway"] = gateway
        domain = self.domain_of(ref)
        labels = {LABEL_POOL: pool_hash(ref), LABEL_CLAIM_UID: claim_uid}
        if domain:
            labels[LABEL_DOMAIN] = domain
        body = {
            "apiVersion": RESERVATIONS.api_version,
            "kind": RESERVATIONS.kind,
            "metadata": {"name": reservation_name(ref, address, domain), "labels": labels},
            "spec": spec,
        }
        try:
            created = Reservation.parse(await self.kube.create(RESERVATIONS, body))
        except ApiError as error:
            if error.already_exists:
                return None
            raise
        if domain:
            self.on_domain_create(ref, created)
        return created

    async def get(self, ref: PoolRef, address: str) -> Reservation | None:
        """The reservation of `address` for the pool (of any pool of its domain, for a domain pool)."""
        obj = await self.kube.get(RESERVATIONS, reservation_name(ref, address, self.domain_of(ref)))
        return Reservation.parse(obj) if obj is not None else None

    async def list_pool(self, ref: PoolRef) -> list[Reservation]:
        """The pool's own reservations."""
        items, _ = await self.kube.list(RESERVATIONS, label_selector=f"{LABEL_POOL}={pool_hash(ref)}")
        return [Reservation.parse(item) for item in items]

    async def list_index(self, ref: PoolRef) -> list[Reservation]:
        """The reservations that hold addresses the pool must not hand out: its own, or, for a domain pool, those
        of every pool of the domain."""
        domain = self.domain_of(ref)
        if not domain:
            return await self.list_pool(ref)
        items, _ = await self.kube.list(RESERVATIONS, label_selector=f"{LABEL_DOMAIN}={domain}")
        return [Reservation.parse(item) for item in items]

    async def list_claim(self, ref: PoolRef, claim_uid: str) -> list[Reservation]:
        selector = f"{LABEL_POOL}={pool_hash(ref)},{LABEL_CLAIM_UID}={claim_uid}"
        items, _ = await self.kube.list(RESERVATIONS, label_selector=selector)
        return [Reservation.parse(item) for item in items]

    async def delete(self, reservation: Reservation) -> bool:
        """Delete exactly this reservation (uid and resourceVersion preconditions); gone already is fine. True when
        this call deleted it; False when it was gone, or changed since it was read (or was re-created for someone
        else): then it is left alone."""
        try:
            return await self.kube.delete(
                RESERVATIONS,
                reservation.name,
                uid=reservation.uid,
                resource_version=reservation.resource_version,
            )
        except ApiError as error:
            if not error.conflict:
                raise
            return False

    async def mark_released(self, reservation: Reservation, at: str, grace_seconds: int | None = None) -> Reservation:
        """Keep the address held, without an owner, until the pool's reuse grace period (`grace_seconds`, recorded
        on the reservation) has passed."""
        annotations = {ANNOTATION_GRACE: str(grace_seconds)} if grace_seconds is not None else None
        return await self._patch_claim(reservation, None, {"releasedAt": at, "claim": {"uid": ""}}, annotations)

    async def reassign(self, reservation: Reservation, claim_uid: str) -> Reservation:
        """Give the reservation to the claim of the same namespace/name with another uid (one made from an
        IPAddress before its claim existed, with a uid that predates a restore, a pin not yet taken, or a released
        one of that claim, which is live again), or back to its pin (`claim_uid` ""). The address stays held
        throughout; the resourceVersion precondition makes a concurrent change fail with a conflict."""
        spec: Object = {"claim": {"uid": claim_uid}}
        if reservation.released_at:
            spec["releasedAt"] = None
        return await self._patch_claim(reservation, claim_uid, spec)

    async def _patch_claim(
        self, reservation: Reservation, uid_label: str | None, spec: Object, annotations: Object | None = None
    ) -> Reservation:
        """Patch the reservation's spec and its claim-uid label (None removes it), and add `annotations`, guarded by
        its resourceVersion."""
        meta: Object = {"resourceVersion": reservation.resource_version, "labels": {LABEL_CLAIM_UID: uid_label}}
        if annotations:
            meta["annotations"] = annotations
        updated = await self.kube.patch(RESERVATIONS, reservation.name, {"metadata": meta, "spec": spec})
        return Reservation.parse(updated)
