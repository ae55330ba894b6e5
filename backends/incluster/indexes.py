"""The in-memory indexes of the in-cluster pools this process allocates from (see `pool_index`): when each is built,
rebuilt, scanned for IPAddresses without a reservation, and which one a caller may use.

- A pool's index is built from a fresh list of its reservations (a domain pool's: its domain's, see `domains`) on
  its first use (or ahead of it, by `prepare`, while the controller's caches sync), again on each resync, and when
  the pool looks exhausted; one build per pool at a time, the others wait for it and use its result. Pending
  candidates move to the new index.
- Release records whose reuse grace period is over are deleted as the index is used, except under
  LeastRecentlyReleased (see `released`, `domains`).
- A reservation this process makes for a pool of a uniqueness domain is held at once in the indexes of the domain's
  other pools.
- Before an index serves its first allocation, IPAddresses naming the pool without a reservation get one (the
  scan, from the controller's synced cache when it can answer, else from a LIST); for a pool of a uniqueness
  domain, those naming any pool of the domain (`domain_pools`, and those this process knows), since the index
  serves the whole domain's addresses.
- An index belongs to one pool object (its uid): a pool deleted and re-created under the same name gets a new
  index. Within one pool object, an index is never replaced by one built from an older spec (generation): a
  caller that read the pool before a spec change uses the newer index. A spec change of the allocatable set or
  of the allocation policy (strategy, static band, pre-allocations) gives the pool a new index over the same
  holdings; a change of the policy alone re-chooses over the same index.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import structlog

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.existing import reserve_existing
from backends.incluster.intervals import IntervalSet
from backends.incluster.policy import AllocationPolicy
from backends.incluster.pool_index import PoolIndex
from backends.incluster.reservations import Reservation, ReservationClient, pool_hash
from ipam_provider.backend.contract import PoolRef
from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import KubeClient

log = structlog.get_logger(__name__)
RESYNC_SECONDS = 600.0


class PoolIndexes:
    def __init__(
        self,
        kube: KubeClient,
        reservations: ReservationClient,
        cached_addresses: Callable[[PoolRef], Sequence[Object] | None],
        domain_pools: Callable[[str], Awaitable[Sequence[PoolRef]]] | None = None,
    ) -> None:
        self.kube = kube
        self.reservations = reservations
        self.cached_addresses = cached_addresses
        self.domain_pools = domain_pools  # the pools naming a uniqueness domain (see `domains.domain_pools`)
        self._indexes: dict[PoolRef, PoolIndex] = {}
        self._building: dict[PoolRef, asyncio.Lock] = {}  # one index build per pool at a time
        self._reclaiming: set[PoolRef] = set()  # pools whose expired releases are being deleted now
        reservations.on_domain_create = self._share

    def _share(self, ref: PoolRef, reservation: Reservation) -> None:
        """A reservation this process made for a pool of a uniqueness domain is used for the domain's other pools
        whose indexes it keeps, at once (a hint: without it they would learn it when their own create collides)."""
        domain = self.reservations.domain_of(ref)
        for other, index in list(self._indexes.items()):
            if other != ref and self.reservations.domain_of(other) == domain:
                index.hold(reservation)

    async def index(
        self,
        ref: PoolRef,
        allocatable: AllocatableSet,
        generation: int,
        reuse_grace_seconds: int | None,
        policy: AllocationPolicy = AllocationPolicy(),  # noqa: B008 - frozen, so one shared default is safe
        uid: str = "",
    ) -> PoolIndex:
        """The pool's index for a caller that read the pool object `uid` at `generation`. A caller that read an
        older spec than the index's gets the index as it is: it never replaces one built from a newer spec.
        `policy`: the pool's allocation policy (its `pinned` are the addresses `spec.preAllocations` pins). Release
        records whose reuse grace period is over are deleted first (all of them when the pool has no grace period,
        or no longer has one), except under LeastRecentlyReleased."""
        key = (allocatable.addresses, allocatable.family, allocatable.host_bits, policy)
        index = self._indexes.get(ref)
        if index is not None and index.pool_uid == uid and generation < index.generation:
            return index
        if (
            index is None
            or index.pool_uid != uid
            or (index.family, index.host_bits) != (allocatable.family, allocatable.host_bits)
            or time.monotonic() - index.built_at > RESYNC_SECONDS
        ):
            index = await self.rebuild(
                ref,
                allocatable.addresses,
                allocatable.family,
                key,
                generation,
                scan=True,
                replacing=index,
                host_bits=allocatable.host_bits,
                uid=uid,
                policy=policy,
            )
        elif index.spec_key != key:
            scanned = index.scanned
            if index.allocator.allocatable == allocatable.addresses:  # the policy alone changed
                index.set_policy(policy)
                index.spec_key = key
            else:
                index = self._indexes[ref] = index.with_allocatable(allocatable.addresses, key, policy)
            index.generation, index.scanned = generation, scanned
        index.reuse_grace_seconds = reuse_grace_seconds or 0
        if not index.scanned:
            await self._scan(ref, index)
        if index.released:
            await self._reclaim_expired(ref, index, reuse_grace_seconds or 0)
        return self.current(ref, index)

    async def prepare(
        self,
        ref: PoolRef,
        allocatable: AllocatableSet,
        generation: int,
        policy: AllocationPolicy = AllocationPolicy(),  # noqa: B008 - frozen, so one shared default is safe
        uid: str = "",
    ) -> None:
        """Build the pool's index from its reservations only, unless it has one (see `scanned`)."""
        known = self._indexes.get(ref)
        if known is not None and known.pool_uid == uid:
            return
        key = (allocatable.addresses, allocatable.family, allocatable.host_bits, policy)
        await self.rebuild(
            ref,
            allocatable.addresses,
            allocatable.family,
            key,
            generation,
            scan=False,
            replacing=known,
            host_bits=allocatable.host_bits,
            uid=uid,
            policy=policy,
        )

    async def _scan(self, ref: PoolRef, index: PoolIndex) -> None:
        """Give IPAddresses naming the pool without a reservation one, into `index` (once, one caller at a time)."""
        async with self._building.setdefault(ref, asyncio.Lock()):
            if index.scanned:
                return
            for reservation in await self._reserve_existing(ref, index.family, list(index.by_address.values())):
                index.hold(reservation)
            index.scanned = True

    async def _reserve_existing(self, ref: PoolRef, family: int, held: list[Reservation]) -> list[Reservation]:
        """`reserve_existing` for the pool and, for a pool of a uniqueness domain, for every other pool of the
        domain: the addresses of all of them are the index's concern. `held`: the reservations the index has."""
        refs = [ref]
        domain = self.reservations.domain_of(ref)
        if domain:
            listed = await self.domain_pools(domain) if self.domain_pools is not None else []
            refs += sorted({*listed, *self.reservations.noted_pools(domain)} - {ref})
        found: list[Reservation] = []
        for pool in refs:
            if pool != ref:
                self.reservations.note_domain(pool, domain)  # its reservations are named by the domain
            found += await reserve_existing(
                self.kube, self.reservations, pool, family, held + found, self.cached_addresses(pool)
            )
        return found

    def get(self, ref: PoolRef) -> PoolIndex | None:
        return self._indexes.get(ref)

    def clear(self) -> None:
        self._indexes.clear()

    def current(self, ref: PoolRef, index: PoolIndex) -> PoolIndex:
        """The pool's index now, if it was built for the same pool object from the same or a newer spec than
        `index`; else `index`."""
        current = self._indexes.get(ref)
        if current is None or current.pool_uid != index.pool_uid or current.generation < index.generation:
            return index
        return current

    async def rebuild(
        self,
        ref: PoolRef,
        addresses: IntervalSet,
        family: int,
        key: object,
        generation: int,
        *,
        scan: bool,
        replacing: PoolIndex | None,
        host_bits: int | None = None,
        uid: str | None = None,
        policy: AllocationPolicy | None = None,
    ) -> PoolIndex:
        """Build the pool's index from a fresh list of its reservations, unless another allocation replaced
        `replacing` (the index the caller found wanting) with one of the same or a newer spec while this one waited
        for its turn. With `scan` (the first use of the pool in this process, and each resync) IPAddresses naming
        the pool without a reservation get one first. In-flight candidates stay pending in the new index.
        `host_bits` (prefix pools, see `PoolIndex.host_bits`), `uid` (the pool object's) and `policy` (the pool's
        allocation policy) default to those of `replacing`, else 0, "" and the default policy."""
        host_bits, uid, policy = _inherited(replacing, host_bits, uid, policy)
        async with self._building.setdefault(ref, asyncio.Lock()):
            current = self._indexes.get(ref)
            if (
                current is not None
                and current is not replacing
                and current.pool_uid == uid
                and current.generation >= generation
            ):
                return current
            reservations = await self._reservations_of(ref, family, scan=scan)
            same_values = replacing is not None and (replacing.family, replacing.host_bits) == (family, host_bits)
            pending = replacing.pending if replacing is not None and same_values else None
            index = PoolIndex.build(
                addresses, family, reservations, key, pending, policy, host_bits=host_bits, own_label=pool_hash(ref)
            )
            if replacing is not None:
                index.reuse_grace_seconds, index.clock = replacing.reuse_grace_seconds, replacing.clock
            index.generation, index.pool_uid = generation, uid
            index.scanned = scan or (replacing is not None and replacing.pool_uid == uid and replacing.scanned)
            self._indexes[ref] = index
            return index

    async def _reservations_of(self, ref: PoolRef, family: int, *, scan: bool) -> list[Reservation]:
        """A fresh list of the pool's reservations (a domain pool's: the whole domain's), with those made now for
        IPAddresses naming the pool without one when `scan`."""
        started = time.monotonic()
        reservations = await self.reservations.list_index(ref)
        listed = time.monotonic()
        found = 0
        if scan:
            existing = await self._reserve_existing(ref, family, reservations)
            found, reservations = len(existing), reservations + existing
        log.info(
            "pool index built",
            pool=str(ref),
            reservations=len(reservations),
            reserved_for_existing=found,
            list_seconds=round(listed - started, 3),
            scan_seconds=round(time.monotonic() - listed, 3),
        )
        return reservations

    async def _reclaim_expired(self, ref: PoolRef, index: PoolIndex, grace_seconds: int) -> None:
        """Delete the pool's release records whose grace period is over; one caller at a time per pool, the
        others go on without waiting."""
        if ref in self._reclaiming:
            return
        self._reclaiming.add(ref)
        try:
            for reservation in index.expired_releases(grace_seconds):
                await self.reservations.delete(reservation)
                self.current(ref, index).drop(reservation)
        finally:
            self._reclaiming.discard(ref)


def _inherited(
    replacing: PoolIndex | None, host_bits: int | None, uid: str | None, policy: AllocationPolicy | None
) -> tuple[int, str, AllocationPolicy]:
    """`host_bits`, `uid` and `policy` where given, else those of the index being replaced, else 0, "" and the
    default policy."""
    if replacing is not None:
        host_bits = replacing.host_bits if host_bits is None else host_bits
        uid = replacing.pool_uid if uid is None else uid
        policy = replacing.policy if policy is None else policy
    return host_bits or 0, uid or "", policy or AllocationPolicy()
