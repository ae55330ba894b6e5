"""The repair capability of the in-cluster backends (address and prefix pools), for the core's repair loop (see
`ipam_provider.backend.repair` for the contract every backend shares).

A pool's holdings are its own reservations (by its pool label, see `reservations`): in a uniqueness domain, never
those of the domain's other pools, although they share one name space (see `domains`). Everything here is read
fresh from the API server, never from a pool's index, which is a hint only (see `pool_index`).

- `list_holdings` lists them page by page (PAGE_SIZE, one `pacer.wait()` before each page);
  `list_pools_holdings` lists every reservation with a pool label that way once, for all the pass's pools. A
  release record and a pin not yet taken (see `released`, `pins`) are listed with claim uid "": they hold the
  address for no claim, so they are never leaks; the pool's index deletes release records whose reuse grace
  period is over, and `pins` frees removed pins.
- `release_holding` releases exactly the listed reservation the way a claim's release does (`release`): back to its
  pin while the spec pre-allocates the address to its claim, a release record when the pool keeps them (a reuse
  grace period, or LeastRecentlyReleased), else deleted; every write is guarded by its resourceVersion (a delete by
  its uid too). A reservation that changed, went, or holds for no claim is left alone (False).
- `restore` makes the claim hold the address its IPAddress names, as adoption does (`adoption.hold_existing`), but
  from a fresh read of the address's reservation: none -> created for the claim (Recorded); the claim's own
  (Held); the pool's own reservation under the claim's namespace/name with another uid, a pin of the claim, or a
  release record of the pool -> taken over, guarded by its resourceVersion (Recorded); a release record of another
  pool of the uniqueness domain (no claim holds the address) -> deleted once its recorded reuse grace period is
  over, then restored as above; while it runs (or under LeastRecentlyReleased, whose records only their pool
  reuses), AllocationFailedError naming the pool and the end of the period: the loop reports that restore as
  failed (a `RepairRestoreFailed` Warning, not a duplicate) and tries again on its next pass; any other -> Taken,
  naming the holder. It never frees anything: a second reservation of the claim is a leak for the loop to release.
- `outside_pool` names the addresses the pool would not hand out now, with why (the report's outOfRange).
- `sweep_orphaned` removes the reservations of pools that are gone (see `orphans`). It lists every reservation, so
  it runs at most once per `orphan_sweep_every` seconds (10 minutes) per process, the first time at the loop's
  first call; a call in between answers 0 at once. A sweep that failed is tried again at the next call.
API server failures surface as PoolNotReadyError, so that the loop skips the pool for this pass.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import structlog

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.indexes import PoolIndexes
from backends.incluster.orphans import sweep_orphans
from backends.incluster.pool_spec import InClusterPoolSpec
from backends.incluster.release import ReleaseTerms, release_reservation
from backends.incluster.released import released_epoch, take_over
from backends.incluster.reservations import (
    LABEL_POOL,
    RESERVATIONS,
    Reservation,
    ReservationClient,
    age_seconds,
    pool_hash,
)
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    ClaimContext,
    PoolKind,
    PoolNotReadyError,
    PoolRef,
)
from ipam_provider.backend.repair import Holding, Pacer, Restore, RestoreOutcome
from ipam_provider.common import Object, normalized_address
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError

log = structlog.get_logger(__name__)

PAGE_SIZE = 500  # reservations per page of `list_holdings`
ORPHAN_SWEEP_EVERY = 600.0  # seconds between two sweeps of the reservations of deleted pools
RESTORE_ATTEMPTS = 5  # the address's reservation changed this many times under one restore: the next pass retries


@contextlib.contextmanager
def _api_server_errors(what: str) -> Iterator[None]:
    """API server failures as PoolNotReadyError (the loop skips the pool, or the sweep, for this pass); `what`:
    the reservations concerned, for people."""
    try:
        yield
    except ApiError as error:
        raise PoolNotReadyError(
            f"{what} cannot be read or written now ({error.status} {error.reason}); retried on the next repair pass"
        ) from error
    except OSError as error:
        raise PoolNotReadyError(f"the API server cannot be reached now for {what}: {error}") from error


def _epoch(timestamp: str) -> float | None:
    try:
        moment = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)).timestamp()


def holding_of(reservation: Reservation) -> Holding:
    """The reservation as a holding: a release record holds for no claim (uid ""), nor does a pin not yet taken."""
    return Holding(
        address=normalized_address(reservation.address),
        claim=reservation.claim if reservation.claim != "/" else "",
        claim_uid="" if reservation.released_at else reservation.claim_uid,
        handle=reservation.name,
        created_at=_epoch(reservation.created_at),
    )


def holder_text(reservation: Reservation) -> str:
    """Who holds the reservation's address, for people (Restore's detail)."""
    pool = f"pool {reservation.pool}" if reservation.pool is not None else "an unknown pool"
    if reservation.released_at:
        return f"a release record of {pool} (reuse grace period or LeastRecentlyReleased)"
    if not reservation.claim_uid:
        return f"the pin of claim {reservation.claim} in {pool} (spec.preAllocations)"
    return f"claim {reservation.claim} in {pool}"


class ReservationRepair:
    """The repair capability (see the module's contract), mixed into `InClusterBackend` and so into the prefix
    backend; the hooks below are the backend's."""

    kube: KubeClient
    reservations: ReservationClient
    indexes: PoolIndexes
    cached_pools: Callable[[PoolKind], Sequence[Object] | None]  # the controller's pool caches (None: not synced)
    orphan_sweep_every: float = ORPHAN_SWEEP_EVERY
    orphan_sweep_clock: Callable[[], float] = time.monotonic
    _orphans_swept_at: float | None = None  # when the last sweep of deleted pools' reservations completed
    # Per pool, what the last `outside_pool` call that found none outside was asked: uid, resourceVersion, addresses.
    all_inside: dict[PoolRef, tuple[str, str, tuple[str, ...]]]

    @property
    def kinds(self) -> Sequence[PoolKind]:
        raise NotImplementedError

    def _parse(self, ref: PoolRef, pool: Object) -> tuple[InClusterPoolSpec, AllocatableSet]:
        """The pool's spec and allocatable set; PoolNotReadyError when it is invalid."""
        raise NotImplementedError

    def _why_not(self, spec: InClusterPoolSpec, allocatable: AllocatableSet, address: str) -> str | None:
        """Why the pool cannot hand out `address`, or None when it can."""
        raise NotImplementedError

    async def list_holdings(self, pool_ref: PoolRef, pool: Object, pacer: Pacer) -> list[Holding]:
        """The pool's own reservations, read page by page from the API server."""
        selector = f"{LABEL_POOL}={pool_hash(pool_ref)}"
        holdings: list[Holding] = []
        with _api_server_errors(f"the reservations of {pool_ref}"):
            async for items, _ in self.kube.list_pages(
                RESERVATIONS, label_selector=selector, limit=PAGE_SIZE, before_page=pacer.wait
            ):
                holdings += (holding_of(Reservation.parse(item)) for item in items)
        return holdings

    async def list_pools_holdings(
        self, pools: Sequence[tuple[PoolRef, Object]], pacer: Pacer
    ) -> dict[PoolRef, list[Holding]]:
        """The pools' own reservations, from one paged LIST of every reservation with a pool label, split by it."""
        wanted = {pool_hash(ref): ref for ref, _ in pools}
        found: dict[PoolRef, list[Holding]] = {ref: [] for ref, _ in pools}
        with _api_server_errors("the reservations"):
            async for items, _ in self.kube.list_pages(
                RESERVATIONS, label_selector=LABEL_POOL, limit=PAGE_SIZE, before_page=pacer.wait
            ):
                for item in items:
                    ref = wanted.get(((item.get("metadata") or {}).get("labels") or {}).get(LABEL_POOL, ""))
                    if ref is not None:
                        found[ref].append(holding_of(Reservation.parse(item)))
        return found

    async def release_holding(self, pool_ref: PoolRef, pool: Object, holding: Holding) -> bool:
        """Release the listed reservation as a claim's release would; False when it changed or went."""
        with _api_server_errors(f"the reservations of {pool_ref}"):
            found = await self.kube.get(RESERVATIONS, holding.handle)
            if found is None:
                return False
            reservation = Reservation.parse(found)
            if not _still_as_listed(pool_ref, reservation, holding):
                return False
            try:
                released = await release_reservation(
                    self.reservations, self.indexes, pool_ref, ReleaseTerms.of(pool_ref, pool), reservation
                )
            except ApiError as error:
                if error.conflict or error.not_found:
                    return False
                raise
        if released:
            log.info("leaked reservation released", pool=str(pool_ref), address=holding.address, claim=holding.claim)
        return released

    async def restore(self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, allocation: Allocation) -> Restore:
        """Make the claim hold the address its IPAddress names (see the module's contract)."""
        spec, allocatable = self._parse(pool_ref, pool)
        address = normalized_address(allocation.address)
        why = self._why_not(spec, allocatable, address)
        if why is not None:
            return Restore(RestoreOutcome.OUTSIDE, f"{address} is not an address {pool_ref} hands out: {why}")
        with _api_server_errors(f"the reservations of {pool_ref}"):
            for _ in range(RESTORE_ATTEMPTS):
                answer = await self._restore_once(pool_ref, claim, allocation, address)
                if answer is not None:
                    return answer
        raise AllocationFailedError(
            f"the reservation of {address} in {pool_ref} kept changing while IPAddress {claim} was restored; "
            "retried on the next repair pass"
        )

    async def _restore_once(
        self, ref: PoolRef, claim: ClaimContext, allocation: Allocation, address: str
    ) -> Restore | None:
        """One look at the address's reservation and one write; None when it changed meanwhile (look again)."""
        found = await self.reservations.get(ref, address)
        if found is None:
            made = await self.reservations.create(
                ref, address, allocation.prefix, allocation.gateway, claim.namespace, claim.name, claim.uid
            )
            if made is None:
                return None  # reserved meanwhile by someone: look at who holds it
            self._learn(ref, None, made)
            log.info("reservation restored", pool=str(ref), address=address, claim=str(claim))
            return Restore(RestoreOutcome.RECORDED, f"reservation {made.name} created for claim {claim}")
        own = found.pool_label == pool_hash(ref)
        if own and found.claim_uid == claim.uid and not found.released_at:
            return Restore(RestoreOutcome.HELD)
        if not own and found.released_at:
            return await self._other_pools_record(found, claim, address)
        if not own or not (found.released_at or found.claim == str(claim)):
            return Restore(RestoreOutcome.TAKEN, holder_text(found))
        taken = await self._take(found, claim, allocation)
        if taken is None:
            return None
        self._learn(ref, found, taken)
        log.info("reservation taken over for its IPAddress", pool=str(ref), address=address, claim=str(claim))
        return Restore(RestoreOutcome.RECORDED, f"reservation {taken.name} taken over for claim {claim}")

    async def _other_pools_record(self, found: Reservation, claim: ClaimContext, address: str) -> Restore | None:
        """A release record of another pool of the domain holds the address for no claim: not a duplicate. Past its
        recorded reuse grace period any pool of the domain deletes it (then None: look again); else the restore
        waits for a later pass (AllocationFailedError)."""
        grace = found.grace_seconds
        if grace is not None and age_seconds(found.released_at or "") >= grace:
            await self.reservations.delete(found)
            return None
        if grace is None:
            until = f"{found.pool} reuses it (LeastRecentlyReleased: its records do not expire)"
        else:
            end = datetime.datetime.fromtimestamp(released_epoch(found) + grace, datetime.UTC)
            until = end.strftime("%Y-%m-%dT%H:%M:%SZ")
        raise AllocationFailedError(
            f"{address} of IPAddress {claim} is in the reuse grace period of pool {found.pool} until {until} (a "
            "release record, no claim holds it); it is recorded again on a later repair pass"
        )

    async def _take(self, found: Reservation, claim: ClaimContext, allocation: Allocation) -> Reservation | None:
        """Give the pool's own `found` (a release record, or held under the claim's namespace/name) to the claim,
        guarded by its resourceVersion; None when it changed or went meanwhile."""
        if found.released_at:
            return await take_over(
                self.reservations, found, allocation.prefix, allocation.gateway, claim.namespace, claim.name, claim.uid
            )
        try:
            return await self.reservations.reassign(found, claim.uid)
        except ApiError as error:
            if error.conflict or error.not_found:
                return None
            raise

    def _learn(self, ref: PoolRef, replaced: Reservation | None, reservation: Reservation) -> None:
        index = self.indexes.get(ref)
        if index is not None:
            if replaced is not None:
                index.drop(replaced)
            index.hold(reservation)

    async def outside_pool(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> Mapping[str, str]:
        """The addresses the pool would not hand out now, each with why; {} for an invalid pool (its condition
        says why). The answer depends on the pool's object and `addresses` alone: when both are as at the last
        call that found none outside (the same resourceVersion), it is {} again without parsing the pool."""
        meta = pool["metadata"]
        asked = (str(meta.get("uid")), str(meta.get("resourceVersion") or ""), tuple(addresses))
        if asked[1] and self.all_inside.get(pool_ref) == asked:
            return {}
        try:
            spec, allocatable = self._parse(pool_ref, pool)
        except PoolNotReadyError:
            return {}
        outside: dict[str, str] = {}
        for address in addresses:
            why = self._why_not(spec, allocatable, normalized_address(address))
            if why is not None:
                outside[address] = why
        if outside:
            self.all_inside.pop(pool_ref, None)
        else:
            self.all_inside[pool_ref] = asked
        return outside

    async def sweep_orphaned(self, grace_seconds: float) -> int:
        """Remove the reservations of this backend's pools that are gone (see `orphans`); answer how many. The
        pools in the controller's caches exist: only the others are read from the API server. At most once per
        `orphan_sweep_every` seconds (see the module's contract)."""
        now = self.orphan_sweep_clock()
        if self._orphans_swept_at is not None and now - self._orphans_swept_at < self.orphan_sweep_every:
            return 0
        known: set[PoolRef] = set()
        for kind in self.kinds:
            for pool in self.cached_pools(kind) or ():
                meta = pool["metadata"]
                known.add(kind.ref(meta.get("namespace") if kind.namespaced else None, meta["name"]))
        with _api_server_errors("the reservations of deleted pools"):
            swept = await sweep_orphans(self.kube, self.reservations, self.kinds, grace_seconds, known)
        self._orphans_swept_at = now
        return swept


def _still_as_listed(ref: PoolRef, reservation: Reservation, holding: Holding) -> bool:
    """Whether the reservation read now is the pool's own, held for the holding's claim uid (not released)."""
    return (
        bool(holding.claim_uid)
        and reservation.pool_label == pool_hash(ref)
        and reservation.claim_uid == holding.claim_uid
        and not reservation.released_at
    )
