"""The ledger of the in-cluster pools: their reservations in the API server and this process's index of each pool,
kept in step: a write and the index update it implies are one method of `Ledger`.

An `InClusterIPReservation`'s *name* encodes (pool, address), or (domain, address) for a pool of a uniqueness
domain (see `domains`): the API server's create-uniqueness decides who holds an address. Each carries its pool's
label, a domain's also the domain's. A *release record* (`spec.releasedAt`, claim uid "") holds the address for no
claim until its grace period is over or, under LeastRecentlyReleased, as its place in the reuse order. Every write
but a create is guarded by the resourceVersion (a delete by the uid too). `release`: back to its pin (uid "") when
the spec pre-allocates the address to its claim; else a release record when the pool keeps them; else deleted.

`PoolIndex`, one pool's reservations in memory, is a *hint*. Each allocation takes its candidate with
`take_candidate` (by policy) or `take_specific` (by value), marked pending in the same step, so two allocations of
this process never try one address; `settle` ends the mark. An own release record candidate is taken over; a
domain's other pools' records are held, never candidates.
- An index is built from a fresh list of the pool's reservations (a domain pool's: the domain's) on first use (or
  by `prepare`), on each resync, and when the pool looks exhausted; one build per pool at a time; pending
  candidates move to it. It belongs to one pool object (uid), is never replaced by one of an older spec
  (generation), and keeps its holdings over a new allocatable set or policy.
- Before it serves, the *scan* gives each IPAddress naming the pool (a domain pool: any of the domain) without a
  reservation one, for its claim (its controller ownerReference, else the claim of its claimRef name, else uid ""
  until adopted); an address reserved meanwhile is learned.
- Expired release records are deleted as it is used (not under LeastRecentlyReleased); a reservation made for a
  domain pool is held at once in the indexes of the domain's pools. A prefix pool's integers are child numbers.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ipaddress
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
from sortedcontainers import SortedList

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.intervals import PoolAllocator, address_to_int, address_value, int_to_address
from backends.incluster.policy import AllocationPolicy, AllocationStrategy, Chooser, grace_over
from backends.incluster.spec import ParsedPool, ReleaseTerms
from ipam_provider.api.capi import names_pool
from ipam_provider.backend.contract import Allocation, ClaimContext, PoolRef
from ipam_provider.common import Object, normalized_address
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import ADDRESSES, CLAIMS, IPAM_GROUP, Resource, now_rfc3339

RESERVATIONS = Resource(IPAM_GROUP, "v1alpha2", "inclusteripreservations", "InClusterIPReservation", False)
LABEL_POOL = "ipam.cluster.x-k8s.io/pool-hash"
LABEL_CLAIM_UID = "ipam.cluster.x-k8s.io/claim-uid"
LABEL_DOMAIN = "ipam.cluster.x-k8s.io/uniqueness-domain"
# On a release record: its pool's reuse grace period when it was released, for the other pools of its domain.
ANNOTATION_GRACE = "ipam.cluster.x-k8s.io/reuse-grace-period-seconds"


def pool_hash(ref: PoolRef) -> str:
    identity = f"{ref.group}/{ref.kind}/{ref.namespace or ''}/{ref.name}"
    return hashlib.sha256(identity.encode()).hexdigest()[:20]


def domain_hash(domain: str) -> str:
    return hashlib.sha256(f"uniqueness-domain/{domain}".encode()).hexdigest()[:20]


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


def reservation_name(ref: PoolRef, address: str, domain: str | None = None) -> str:
    """The name of the reservation of `address` for the pool `ref`, or for every pool of `domain` when given."""
    ip = ipaddress.ip_address(address)
    encoded = str(ip) if ip.version == 4 else ip.exploded.replace(":", "-")
    return f"{domain_hash(domain) if domain else pool_hash(ref)}.{encoded}"


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

    def holder(self, seen_from: str) -> str:
        """Who holds it, for a message on a claim of namespace `seen_from`: its claim and, when known, its pool; a
        claim or pool of another namespace (a Global pool's, a shared uniqueness domain's) is not named."""
        if self.claim.partition("/")[0] != seen_from or (
            self.pool is not None
            and self.pool.namespace
            not in (
                None,
                seen_from,
            )
        ):
            return "a claim of another namespace"
        return f"claim {self.claim} of {self.pool}" if self.pool is not None else f"claim {self.claim}"


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


@dataclass
class PoolIndex:
    allocatable: AllocatableSet
    allocator: PoolAllocator
    chooser: Chooser
    policy: AllocationPolicy = field(default_factory=AllocationPolicy)
    by_claim: dict[str, Reservation] = field(default_factory=dict)
    by_address: dict[int, Reservation] = field(default_factory=dict)
    released: dict[int, Reservation] = field(default_factory=dict)  # the release records of by_address
    doubly_held: set[str] = field(default_factory=set)  # claims seen holding more than one reservation
    pending: dict[int, str] = field(default_factory=dict)  # candidates whose write is in flight → their claim uid
    built_at: float = field(default_factory=time.monotonic)
    generation: int = 0  # the pool's metadata.generation the allocatable set was taken from
    scanned: bool = False  # whether the scan (see the module) has run
    reuse_grace_seconds: int = 0  # the pool's addressReuseGracePeriodSeconds (None is 0)
    clock: Callable[[], float] = time.time  # wall-clock seconds, compared with releasedAt
    # The pool label of its own reservations (only they name its claims, only its records are candidates); None: all.
    own_label: str | None = None
    pool_uid: str = ""  # the uid of the pool object the index was built for (a re-created pool is another pool)
    _released_at: dict[int, float] = field(default_factory=dict)  # the own release records' releasedAt (epoch)
    _release_order: Any = field(default_factory=SortedList)  # (releasedAt, value) of `_released_at`, oldest first

    @classmethod
    def build(
        cls,
        allocatable: AllocatableSet,
        reservations: list[Reservation],
        policy: AllocationPolicy = AllocationPolicy(),  # noqa: B008 - frozen, so one shared default is safe
        *,
        pending: dict[int, str] | None = None,
        rng: random.Random | None = None,
        own_label: str | None = None,
    ) -> PoolIndex:
        """An index of `reservations`; `pending` (shared, not copied) are the in-flight candidates it inherits.
        Cost: O(n log n) for n reservations, the allocator and the chooser being built in bulk."""
        valued = [(value, r) for r in reservations if (value := _index_value(allocatable, r.address)) is not None]
        pending = pending if pending is not None else {}
        allocator = PoolAllocator(allocatable.addresses, [*(value for value, _ in valued), *pending])
        index = cls(allocatable, allocator, Chooser(policy, allocator, rng), policy, pending=pending)
        index.own_label = own_label
        for value, reservation in valued:
            index._hold(value, reservation, marked=True)
        return index

    def with_allocatable(self, allocatable: AllocatableSet, policy: AllocationPolicy) -> PoolIndex:
        """The same holdings and pending candidates over a new allocatable set and policy (the spec changed)."""
        held = list(self.by_address.values())
        index = PoolIndex.build(
            allocatable, held, policy, pending=self.pending, rng=self.chooser.rng, own_label=self.own_label
        )
        index.reuse_grace_seconds, index.clock, index.pool_uid = self.reuse_grace_seconds, self.clock, self.pool_uid
        return index

    def value_of(self, address: str) -> int:
        """The index's integer for an address of the pool's family (ValueError for another family or no IP)."""
        return address_to_int(address, self.allocatable.family) >> self.allocatable.host_bits

    def address_of(self, value: int) -> str:
        """The address an integer of the index stands for (for a prefix pool, its child prefix's first address)."""
        return int_to_address(value << self.allocatable.host_bits, self.allocatable.family)

    def owns(self, reservation: Reservation) -> bool:
        """Whether the reservation is the pool's own (not another pool's of its uniqueness domain)."""
        return self.own_label is None or reservation.pool_label == self.own_label

    def set_policy(self, policy: AllocationPolicy) -> None:
        """Choose by `policy` from now on, over the same holdings: O(r) for r runs of used addresses and records."""
        self.policy = policy
        self.chooser = Chooser(policy, self.allocator, self.chooser.rng)
        for value, released_at in self._released_at.items():
            if value not in self.pending:
                self.chooser.record(value, released_at)

    def take_candidate(self, claim_uid: str) -> int | None:
        """The next address under the policy (never a pinned one, the band last), now marked pending for
        `claim_uid`; None if nothing is eligible. Choosing and marking happen in one step (no await), so concurrent
        allocations get distinct candidates. A release record chosen stays in `released`: take it over."""
        value = self.chooser.choose(self.allocator, self.clock(), self.reuse_grace_seconds)
        if value is not None:
            self._mark_pending(value, claim_uid)
        return value

    def take_specific(self, value: int, claim_uid: str) -> bool:
        """Mark `value` pending for `claim_uid` and return True if it is allocatable, not pending, and held by no
        reservation but an own release record whose grace period is over (then in `released`: take it over); else
        False. The policy does not apply: pinned and band addresses may be taken this way."""
        if value not in self.allocatable.addresses or value in self.pending:
            return False
        if value in self.by_address:
            released_at = self._released_at.get(value)
            if released_at is None or not grace_over(released_at, self.clock(), self.reuse_grace_seconds):
                return False
        elif self.allocator.is_used(value):
            return False
        self._mark_pending(value, claim_uid)
        return True

    def _mark_pending(self, value: int, claim_uid: str) -> None:
        self._use(value)
        self.chooser.unrecord(value)
        self.pending[value] = claim_uid

    def settle(self, value: int) -> None:
        """The write for the pending candidate `value` has answered: unmark it, and free it unless a reservation for
        it is now known (`hold` it first when the answer named one)."""
        self.pending.pop(value, None)
        if value not in self.by_address:
            self._free(value)
        elif value in self._released_at:
            self.chooser.record(value, self._released_at[value])

    def hold(self, reservation: Reservation) -> None:
        value = _index_value(self.allocatable, reservation.address)
        if value is not None:
            self._hold(value, reservation)

    def _hold(self, value: int, reservation: Reservation, marked: bool = False) -> None:
        """Record `reservation` as the holder of `value`; `marked`: the allocator and chooser count it already."""
        self.by_address[value] = reservation
        self._forget_release(value)
        self.chooser.unrecord(value)
        if reservation.released_at is None:
            self.released.pop(value, None)
        else:
            self.released[value] = reservation
            if self.owns(reservation):  # another pool's record of the domain is held, never taken over from here
                self._note_release(value, reservation.released_epoch)
                if value not in self.pending:
                    self.chooser.record(value, self._released_at[value])
        if reservation.claim_uid and self.owns(reservation):
            known = self.by_claim.get(reservation.claim_uid)
            if known is not None and known.name != reservation.name:
                self.doubly_held.add(reservation.claim_uid)
            self.by_claim[reservation.claim_uid] = reservation
        if not marked:
            self._use(value)

    def _note_release(self, value: int, released_at: float) -> None:
        self._released_at[value] = released_at
        self._release_order.add((released_at, value))

    def _forget_release(self, value: int) -> None:
        if (released_at := self._released_at.pop(value, None)) is not None:
            self._release_order.discard((released_at, value))

    def drop(self, reservation: Reservation) -> None:
        value = _index_value(self.allocatable, reservation.address)
        if value is None:
            return
        known = self.by_address.get(value, reservation)
        if known.name == reservation.name and known.uid == reservation.uid:
            self.by_address.pop(value, None)
            self.released.pop(value, None)
            self._forget_release(value)
            self.chooser.unrecord(value)
            if value not in self.pending:
                self._free(value)
        if self.by_claim.get(reservation.claim_uid) == reservation:
            del self.by_claim[reservation.claim_uid]

    def held_alone(self, claim_uid: str, value: int) -> None:
        """The claim holds `value` and no other address of the pool now (its other reservations are deleted)."""
        self.doubly_held.discard(claim_uid)
        held = self.by_address.get(value)
        if held is not None and self.owns(held):
            self.by_claim[claim_uid] = held

    def _use(self, value: int) -> None:
        if self.allocator.mark_used(value):
            self.chooser.used(value)

    def _free(self, value: int) -> None:
        if self.allocator.mark_free(value):
            self.chooser.freed(value)

    def in_grace(self) -> tuple[frozenset[int], float | None]:
        """The pool's own release records not reusable yet (in the allocatable set, their reuse grace period not
        over), and the seconds until the first of them is; (empty, None) when there is none. O(k + log n) for k
        records released within the grace period of n."""
        if self.reuse_grace_seconds <= 0:
            return frozenset(), None
        now, grace, order = self.clock(), self.reuse_grace_seconds, self._release_order
        left = {
            value: released_at + grace - now
            for released_at, value in order.islice(order.bisect_right((now - grace, math.inf)))
            if value in self.allocatable.addresses and not grace_over(released_at, now, grace)
        }
        return frozenset(left), min(left.values(), default=None)

    def expired_releases(self, grace_seconds: int) -> list[Reservation]:
        """Release records to delete, their reuse grace period being over: the pool's own by `grace_seconds` (none
        under LeastRecentlyReleased, whose records are the reuse order); another pool's of the domain by the grace
        period recorded on it (never when none is recorded, see `domains`)."""
        keep_own = self.policy.strategy is AllocationStrategy.LEAST_RECENTLY_RELEASED
        now = self.clock()
        expired = []
        for value, record in self.released.items():
            if value in self.pending:
                continue
            if value in self._released_at:
                if not keep_own and grace_over(self._released_at[value], now, grace_seconds):
                    expired.append(record)
            elif record.grace_seconds is not None and grace_over(record.released_epoch, now, record.grace_seconds):
                expired.append(record)
        return expired


def _index_value(allocatable: AllocatableSet, address: str) -> int | None:
    """`PoolIndex.value_of(address)`; None for another family (which cannot collide with the pool's addresses)."""
    value = address_value(address, allocatable.family)
    return None if value is None else value >> allocatable.host_bits


log = structlog.get_logger(__name__)
RESYNC_SECONDS = 600.0
Parsed = TypeVar("Parsed", bound=ParsedPool)


# What a pool's index is built over: the allocatable set and policy of the pool object (uid) at a generation.
IndexBasis = tuple[AllocatableSet, AllocationPolicy, int, str]


class Ledger:
    def __init__(
        self,
        kube: KubeClient,
        cached_addresses: Callable[[PoolRef], Sequence[Object] | None],
        domain_pools: Callable[[str], Awaitable[Sequence[PoolRef]]],
    ) -> None:
        self.reservations = ReservationClient(kube)
        self.cached_addresses = cached_addresses
        self.domain_pools = domain_pools  # the pools naming a uniqueness domain (see `domains.domain_pools`)
        self._indexes: dict[PoolRef, PoolIndex] = {}
        self._building: dict[PoolRef, asyncio.Lock] = {}  # one index build (or scan) per pool at a time
        self._reclaiming: set[PoolRef] = set()  # pools whose expired releases are being deleted now
        self.reservations.on_domain_create = self._share

    def _share(self, ref: PoolRef, domain: str, reservation: Reservation) -> None:
        """Hold a reservation made for a pool of `domain` in the indexes of the domain's other pools."""
        for other, index in list(self._indexes.items()):
            if other != ref and self.reservations.domain_of(other) == domain:
                index.hold(reservation)

    def noted(self, pool: Parsed) -> Parsed:
        """`pool`, its uniqueness domain noted: a pool's reservations are named by it (see `reservation_name`)."""
        self.reservations.note_domain(pool.ref, pool.domain)
        return pool

    def get(self, ref: PoolRef) -> PoolIndex | None:
        return self._indexes.get(ref)

    def clear(self) -> None:
        self._indexes.clear()

    def forget(self, ref: PoolRef) -> None:
        """The pool is gone (its watch showed it deleted): drop its index, its noted domain, and its build lock
        unless a build holds it now (the backend forgets the pool again when that build's operation ends)."""
        self._indexes.pop(ref, None)
        self.reservations.forget(ref)
        lock = self._building.get(ref)
        if lock is not None and not lock.locked():
            del self._building[ref]

    def current(self, ref: PoolRef, index: PoolIndex) -> PoolIndex:
        """The pool's index now, if built for the same pool object from the same or a newer spec than `index`;
        else `index`."""
        current = self._indexes.get(ref)
        if current is None or current.pool_uid != index.pool_uid or current.generation < index.generation:
            return index
        return current

    async def index(self, pool: ParsedPool) -> PoolIndex:
        """The pool's index for a caller that read `pool`. A caller that read an older spec than the index's gets
        the index as it is. Release records whose reuse grace period is over are deleted first (all when the pool
        has no grace period), except under LeastRecentlyReleased."""
        ref, allocatable, index = pool.ref, pool.allocatable, self._indexes.get(pool.ref)
        if index is not None and index.pool_uid == pool.uid and pool.generation < index.generation:
            return index
        if (
            index is None
            or index.pool_uid != pool.uid
            or (index.allocatable.family, index.allocatable.host_bits) != (allocatable.family, allocatable.host_bits)
            or time.monotonic() - index.built_at > RESYNC_SECONDS
        ):
            index = await self._rebuild(ref, (allocatable, pool.policy, pool.generation, pool.uid), index, scan=True)
        elif index.allocator.allocatable != allocatable.addresses or index.policy != pool.policy:
            scanned = index.scanned
            if index.allocator.allocatable == allocatable.addresses:
                index.set_policy(pool.policy)
            else:
                index = self._indexes[ref] = index.with_allocatable(allocatable, pool.policy)
            index.generation, index.scanned = pool.generation, scanned
        index.reuse_grace_seconds = pool.reuse_grace_seconds or 0
        if not index.scanned:
            await self._scan_into(ref, index)
        if index.released:
            await self._reclaim_expired(ref, index, pool.reuse_grace_seconds or 0)
        return self.current(ref, index)

    async def prepare(self, pool: ParsedPool) -> None:
        """Build the pool's index from its reservations only (no scan), unless it has one."""
        known = self._indexes.get(pool.ref)
        if known is None or known.pool_uid != pool.uid:
            basis = (pool.allocatable, pool.policy, pool.generation, pool.uid)
            await self._rebuild(pool.ref, basis, known, scan=False)

    async def refresh(self, ref: PoolRef, index: PoolIndex) -> PoolIndex:
        """The pool's index rebuilt like `index`, which looks exhausted (others may have released addresses)."""
        basis = (index.allocatable, index.policy, index.generation, index.pool_uid)
        return await self._rebuild(ref, basis, index, scan=False)

    async def _rebuild(self, ref: PoolRef, basis: IndexBasis, replacing: PoolIndex | None, scan: bool) -> PoolIndex:
        """Build the pool's index from a fresh list of its reservations, unless another allocation replaced
        `replacing` with one of the same or a newer spec meanwhile. With `scan`, the scan comes first."""
        allocatable, policy, generation, uid = basis
        async with self._building.setdefault(ref, asyncio.Lock()):
            current = self._indexes.get(ref)
            newer = current is not None and current.pool_uid == uid and current.generation >= generation
            if current is not None and current is not replacing and newer:
                return current
            reservations = await self._reservations_of(ref, allocatable.family, scan=scan)
            shape = (allocatable.family, allocatable.host_bits)
            inherits = (
                replacing is not None and (replacing.allocatable.family, replacing.allocatable.host_bits) == shape
            )
            pending = replacing.pending if replacing is not None and inherits else None
            index = PoolIndex.build(allocatable, reservations, policy, pending=pending, own_label=pool_hash(ref))
            if replacing is not None:
                index.reuse_grace_seconds, index.clock = replacing.reuse_grace_seconds, replacing.clock
            index.generation, index.pool_uid = generation, uid
            index.scanned = scan or (replacing is not None and replacing.pool_uid == uid and replacing.scanned)
            self._indexes[ref] = index
            return index

    async def _reservations_of(self, ref: PoolRef, family: int, *, scan: bool) -> list[Reservation]:
        """A fresh list of the pool's reservations (a domain pool's: the domain's), plus those the scan made."""
        started = time.monotonic()
        reservations = await self.reservations.list_index(ref)
        listed = time.monotonic()
        found = await self._scan_domain(ref, family, reservations) if scan else []
        log.info(
            "pool index built",
            pool=str(ref),
            reservations=len(reservations) + len(found),
            reserved_for_existing=len(found),
            list_seconds=round(listed - started, 3),
            scan_seconds=round(time.monotonic() - listed, 3),
        )
        return reservations + found

    async def _scan_into(self, ref: PoolRef, index: PoolIndex) -> None:
        """The scan into `index` (once, one caller at a time)."""
        async with self._building.setdefault(ref, asyncio.Lock()):
            if index.scanned:
                return
            for reservation in await self._scan_domain(ref, index.allocatable.family, list(index.by_address.values())):
                index.hold(reservation)
            index.scanned = True

    async def _scan_domain(self, ref: PoolRef, family: int, held: list[Reservation]) -> list[Reservation]:
        """The reservations made or found for the IPAddresses of the pool and, for a domain pool, of every other pool
        of the domain, beyond `held` (what the index has)."""
        refs = [ref]
        domain = self.reservations.domain_of(ref)
        if domain:
            refs += sorted({*await self.domain_pools(domain), *self.reservations.noted_pools(domain)} - {ref})
        found: list[Reservation] = []
        for pool in refs:
            if pool != ref:
                self.reservations.note_domain(pool, domain)  # its reservations are named by the domain
            found += await self._scan_pool(pool, family, held + found)
        return found

    async def _scan_pool(self, ref: PoolRef, family: int, held: list[Reservation]) -> list[Reservation]:
        """A reservation for each IPAddress naming the pool whose address (of `family`) `held` does not hold."""
        held_values = {address_value(reservation.address, family) for reservation in held}
        cached = self.cached_addresses(ref)
        kube = self.reservations.kube
        found: list[Reservation] = []
        for address in cached if cached is not None else (await kube.list(ADDRESSES, ref.namespace))[0]:
            spec = address.get("spec") or {}
            value = address_value(str(spec.get("address", "")), family)
            if not names_pool(address, ref) or value is None or value in held_values:
                continue
            text = int_to_address(value, family)
            claim = await self._claim_of(address)
            made = await self.reservations.create(
                ref, Allocation(text, int(spec.get("prefix") or 0), spec.get("gateway") or None), claim
            )
            if made is not None:
                log.info("reserved the address of an existing IPAddress", pool=str(ref), address=text, claim=claim.name)
            reservation = made or await self.reservations.get(ref, text)  # reserved meanwhile: who holds it
            if reservation is not None:
                held_values.add(value)
                found.append(reservation)
        return found

    async def _claim_of(self, address: Object) -> ClaimContext:
        """The claim an IPAddress belongs to: its controller ownerReference's uid when that is a claim, else the uid
        of the claim of its claimRef name, else "" (none of that name exists yet)."""
        spec, meta = address.get("spec") or {}, address["metadata"]
        namespace, name = meta.get("namespace", ""), (spec.get("claimRef") or {}).get("name") or meta["name"]
        for owner in meta.get("ownerReferences") or []:
            if owner.get("controller") and owner.get("kind") == CLAIMS.kind and owner.get("uid"):
                return ClaimContext(namespace, name, str(owner["uid"]))
        claim = await self.reservations.kube.get(CLAIMS, name, namespace)
        return ClaimContext(namespace, name, str(claim["metadata"].get("uid", "")) if claim is not None else "")

    async def _reclaim_expired(self, ref: PoolRef, index: PoolIndex, grace_seconds: int) -> None:
        """Delete the pool's expired release records; one caller at a time per pool, the others do not wait."""
        if ref in self._reclaiming:
            return
        self._reclaiming.add(ref)
        try:
            for reservation in index.expired_releases(grace_seconds):
                await self.delete(ref, index, reservation)
        finally:
            self._reclaiming.discard(ref)

    async def reserve(
        self, ref: PoolRef, index: PoolIndex, held: Allocation, claim: ClaimContext
    ) -> Reservation | None:
        """Reserve the address `held` names, pending in `index`, for the claim: take over its release record when
        the index has one, else create its reservation; then settle it. The reservation made, else the one found in
        its place, else None (none holds the address now)."""
        value = index.value_of(held.address)
        record = index.released.get(value)
        learned: Reservation | None = None
        try:
            if record is not None:
                made = await self.reservations.take_over(record, held, claim)
            else:
                made = await self.reservations.create(ref, held, claim)
            learned = made if made is not None else await self.reservations.get(ref, held.address)
        finally:
            current = self.current(ref, index)
            if learned is not None:
                current.hold(learned)
            elif record is not None:
                current.drop(record)
            current.settle(value)
        return learned

    async def read(self, ref: PoolRef, index: PoolIndex, address: str) -> Reservation | None:
        """The reservation of `address` as the API server has it now, learned by `index` in place of what it knew."""
        known = index.by_address.get(index.value_of(address))
        fresh = await self.reservations.get(ref, address)
        stale = known if known is not None and (fresh is None or fresh.uid != known.uid) else None
        self.learn(ref, fresh, replacing=stale, index=index)
        return fresh

    async def reassign(
        self, ref: PoolRef, index: PoolIndex | None, reservation: Reservation, claim_uid: str
    ) -> Reservation | None:
        """`ReservationClient.reassign`, learned by `index`; None when the reservation changed or went meanwhile."""
        reassigned = await unless_changed(self.reservations.reassign(reservation, claim_uid))
        if reassigned is not None:
            self.learn(ref, reassigned, replacing=reservation, index=index)
        return reassigned

    async def give(
        self, ref: PoolRef, index: PoolIndex | None, found: Reservation, claim: ClaimContext, held: Allocation
    ) -> Reservation | None:
        """Give the pool's own `found` to the claim, learned by `index`: a release record is taken over (see
        `ReservationClient.take_over`), a live reservation reassigned. None when it changed or went meanwhile, or
        was a record of another prefix or gateway than `held`'s (then deleted)."""
        if not found.released_at:
            return await self.reassign(ref, index, found, claim.uid)
        taken = await self.reservations.take_over(found, held, claim)
        self.learn(ref, taken, replacing=found, index=index)
        return taken

    async def delete(self, ref: PoolRef, index: PoolIndex | None, reservation: Reservation) -> bool:
        """`ReservationClient.delete`, learned by `index` (the pool's, when None)."""
        deleted = await self.reservations.delete(reservation)
        self.learn(ref, None, replacing=reservation, index=index)
        return deleted

    def learn(
        self,
        ref: PoolRef,
        reservation: Reservation | None,
        replacing: Reservation | None = None,
        index: PoolIndex | None = None,
    ) -> None:
        """Put a reservation read or written now (None: none) in `index` as it is now (the pool's, when None) in
        place of `replacing`, which is gone or changed."""
        current = self.current(ref, index) if index is not None else self._indexes.get(ref)
        if current is not None:
            if replacing is not None:
                current.drop(replacing)
            if reservation is not None:
                current.hold(reservation)

    async def release(self, ref: PoolRef, terms: ReleaseTerms, reservation: Reservation) -> bool:
        """Release one reservation of the pool by `terms` (see the module). True when this call released it; False
        when a delete found it gone or changed. A patch of a reservation that changed or went since it was read
        raises ApiError (conflict, not found)."""
        if terms.pre is not None and terms.pre.pins(reservation.address, reservation.claim):
            changed: Reservation | None = await self.reservations.reassign(reservation, "")
        elif terms.keep_record:
            changed = await self.reservations.mark_released(reservation, now_rfc3339(), terms.recorded_grace)
        elif not await self.reservations.delete(reservation):
            return False  # changed meanwhile: its watch tells
        else:
            changed = None
        self.learn(ref, changed, replacing=reservation)
        return True

    async def release_claim(self, ref: PoolRef, terms: ReleaseTerms, claim_uid: str) -> None:
        """Release the claim's reservations of the pool."""
        for reservation in await self.reservations.list_claim(ref, claim_uid):
            await self.release(ref, terms, reservation)
