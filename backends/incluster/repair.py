"""The repair capability of the in-cluster backends (contract: `ipam_provider.backend.repair`). A pool's holdings
are its own reservations (by pool label), read fresh from the API server, never an index.

- `list_holdings`, `list_pools_holdings`: paged (PAGE_SIZE, `pacer.wait()` before each page); a release record and
  a pin not yet taken hold for no claim (uid ""), so they are never leaks.
- `restore`, from a fresh read: none -> created (Recorded); the claim's (Held); an own one under the claim's
  namespace/name with another uid, a pin of the claim, or an own release record -> taken over (Recorded); another
  domain pool's release record -> deleted once its recorded grace period is over and restored, else
  AllocationFailedError until then; any other -> Taken. It frees nothing.
- `sweep_orphaned`: deletes the reservations of pools that no longer exist, older than `grace_seconds`, that no
  IPAddress still names, past their recorded grace period; kinds not served are left alone. At most once per
  `orphan_sweep_every` seconds (a call in between answers 0); a failed sweep is retried at the next call.
API server failures surface as PoolNotReadyError: the loop skips the pool for this pass.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

import structlog

from backends.incluster.ledger import Ledger
from backends.incluster.naming import LABEL_POOL, RESERVATIONS, pool_hash
from backends.incluster.reservations import Reservation, ReservationClient, age_seconds, epoch, pool_of, unless_changed
from backends.incluster.spec import ParsedPool, ReleaseTerms
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    ClaimContext,
    PoolKind,
    PoolNotReadyError,
    PoolRef,
)
from ipam_provider.backend.live_pools import LivePools
from ipam_provider.backend.repair import Holding, Pacer, Restore, RestoreOutcome
from ipam_provider.common import Object, normalized_address
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.errors import ApiError

log = structlog.get_logger(__name__)

PAGE_SIZE = 500  # reservations per page of `list_holdings`
ORPHAN_SWEEP_EVERY = 600.0  # seconds between two sweeps of the reservations of deleted pools
RESTORE_ATTEMPTS = 5  # the address's reservation changed this many times under one restore: the next pass retries


@contextlib.contextmanager
def _api_server_errors(what: str) -> Iterator[None]:
    """API server failures as PoolNotReadyError; `what`: the reservations concerned, for people."""
    try:
        yield
    except ApiError as error:
        raise PoolNotReadyError(
            f"{what} cannot be read or written now ({error.status} {error.reason}); retried on the next repair pass"
        ) from error
    except OSError as error:
        raise PoolNotReadyError(f"the API server cannot be reached now for {what}: {error}") from error


def holding_of(reservation: Reservation) -> Holding:
    """The reservation as a holding (see the module)."""
    return Holding(
        address=normalized_address(reservation.address),
        claim=reservation.claim if reservation.claim != "/" else "",
        claim_uid="" if reservation.released_at else reservation.claim_uid,
        handle=reservation.name,
        created_at=epoch(reservation.created_at),
    )


def holder_text(reservation: Reservation, seen_from: str | None) -> str:
    """Who holds the reservation's address, for people (Restore's detail) of namespace `seen_from` (None: a
    cluster-scoped pool's, the operator's): a pool or claim of another namespace (in a shared uniqueness domain) is
    not named (docs/incluster.md)."""
    visible = reservation.pool is not None and reservation.pool.namespace in (None, seen_from)
    pool = f"pool {reservation.pool}" if visible else "a pool of another namespace or an unknown pool"
    if reservation.released_at:
        return f"a release record of {pool} (reuse grace period or LeastRecentlyReleased)"
    claim_namespace = reservation.claim.partition("/")[0] if "/" in reservation.claim else seen_from
    if seen_from is not None and not (visible and claim_namespace == seen_from):
        return "a claim of another namespace, in a pool of the same uniqueness domain"
    if not reservation.claim_uid:
        return f"the pin of claim {reservation.claim} in {pool} (spec.preAllocations)"
    return f"claim {reservation.claim} in {pool}"


class Repair:
    """The repair capability (see the module) over the ledger; `parse` reads a pool of the backend's `kinds`. Each
    call of a pool runs as an operation of it in `pools`."""

    orphan_sweep_every: float = ORPHAN_SWEEP_EVERY
    orphan_sweep_clock: Callable[[], float] = time.monotonic

    def __init__(
        self,
        ledger: Ledger,
        parse: Callable[[PoolRef, Object], ParsedPool],
        kinds: Sequence[PoolKind],
        cached_pools: Callable[[PoolKind], Sequence[Object] | None],
        pools: LivePools,
    ) -> None:
        self.ledger = ledger
        self.pools = pools
        self.parse = parse
        self.kinds = kinds
        self.cached_pools = cached_pools  # the controller's pool caches (None: not synced)
        self._orphans_swept_at: float | None = None  # when the last sweep completed
        # Per pool, what the last `outside_pool` finding none outside was asked: uid, resourceVersion, addresses.
        self.all_inside: dict[PoolRef, tuple[str, str, tuple[str, ...]]] = {}

    async def list_holdings(self, pool_ref: PoolRef, pool: Object, pacer: Pacer) -> list[Holding]:
        """The pool's own reservations, read page by page from the API server."""
        found = await self.list_pools_holdings([(pool_ref, pool)], pacer, f"{LABEL_POOL}={pool_hash(pool_ref)}")
        return found[pool_ref]

    async def list_pools_holdings(
        self, pools: Sequence[tuple[PoolRef, Object]], pacer: Pacer, selector: str = LABEL_POOL
    ) -> dict[PoolRef, list[Holding]]:
        """The pools' own reservations, from one paged LIST of the reservations with a pool label, split by it."""
        wanted = {pool_hash(ref): ref for ref, _ in pools}
        found: dict[PoolRef, list[Holding]] = {ref: [] for ref, _ in pools}
        what = f"the reservations of {pools[0][0]}" if len(pools) == 1 else "the reservations"
        with contextlib.ExitStack() as operations, _api_server_errors(what):
            for pool_ref, _ in pools:
                operations.enter_context(self.pools.operation(pool_ref))
            async for items, _ in self.ledger.reservations.kube.list_pages(
                RESERVATIONS, label_selector=selector, limit=PAGE_SIZE, before_page=pacer.wait
            ):
                for item in items:
                    ref = wanted.get(((item.get("metadata") or {}).get("labels") or {}).get(LABEL_POOL, ""))
                    if ref is not None:
                        found[ref].append(holding_of(Reservation.parse(item)))
        return found

    async def release_holding(self, pool_ref: PoolRef, pool: Object, holding: Holding) -> bool:
        """Release the listed reservation as a claim's release would; one that changed, went, or holds for no claim is
        left alone (False)."""
        with self.pools.operation(pool_ref), _api_server_errors(f"the reservations of {pool_ref}"):
            found = await self.ledger.reservations.kube.get(RESERVATIONS, holding.handle)
            reservation = Reservation.parse(found) if found is not None else None
            if reservation is None or not _still_as_listed(pool_ref, reservation, holding):
                return False
            released = await unless_changed(self.ledger.release(pool_ref, ReleaseTerms.of(pool_ref, pool), reservation))
        if released:
            log.info("leaked reservation released", pool=str(pool_ref), address=holding.address, claim=holding.claim)
        return bool(released)

    async def restore(self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, allocation: Allocation) -> Restore:
        """Make the claim hold the address its IPAddress names (see the module)."""
        with self.pools.operation(pool_ref):
            address = normalized_address(allocation.address)
            why = self.ledger.noted(self.parse(pool_ref, pool)).why_not(address)
            if why is not None:
                return Restore(RestoreOutcome.OUTSIDE, f"{address} is not an address {pool_ref} hands out: {why}")
            held = Allocation(address, allocation.prefix, allocation.gateway)
            with _api_server_errors(f"the reservations of {pool_ref}"):
                for _ in range(RESTORE_ATTEMPTS):
                    answer = await self._restore_once(pool_ref, claim, held)
                    if answer is not None:
                        return answer
            raise AllocationFailedError(
                f"the reservation of {address} in {pool_ref} kept changing while IPAddress {claim} was restored; "
                "retried on the next repair pass"
            )

    async def _restore_once(self, ref: PoolRef, claim: ClaimContext, held: Allocation) -> Restore | None:
        """One look at the address's reservation and one write; None when it changed meanwhile (look again)."""
        found = await self.ledger.reservations.get(ref, held.address)
        if found is None:
            made = await self.ledger.reservations.create(ref, held, claim)
            if made is None:
                return None  # reserved meanwhile by someone: look at who holds it
            self.ledger.learn(ref, made)
            log.info("reservation restored", pool=str(ref), address=held.address, claim=str(claim))
            return Restore(RestoreOutcome.RECORDED, f"reservation {made.name} created for claim {claim}")
        own = found.pool_label == pool_hash(ref)
        if own and found.claim_uid == claim.uid and not found.released_at:
            return Restore(RestoreOutcome.HELD)
        if not own and found.released_at:
            return await self._other_pools_record(found, claim, held.address)
        if not own or not (found.released_at or found.claim == str(claim)):
            return Restore(RestoreOutcome.TAKEN, holder_text(found, ref.namespace))
        taken = await self.ledger.give(ref, None, found, claim, held)
        if taken is None:
            return None
        log.info("reservation taken over for its IPAddress", pool=str(ref), address=held.address, claim=str(claim))
        return Restore(RestoreOutcome.RECORDED, f"reservation {taken.name} taken over for claim {claim}")

    async def _other_pools_record(self, found: Reservation, claim: ClaimContext, address: str) -> Restore | None:
        """Delete another domain pool's release record past its grace period (None: look again); else raise."""
        grace = found.grace_seconds
        if grace is not None and age_seconds(found.released_at or "") >= grace:
            await self.ledger.reservations.delete(found)
            return None
        if grace is None:
            until = f"{found.pool} reuses it (LeastRecentlyReleased: its records do not expire)"
        else:
            end = datetime.datetime.fromtimestamp(found.released_epoch + grace, datetime.UTC)
            until = end.strftime("%Y-%m-%dT%H:%M:%SZ")
        raise AllocationFailedError(
            f"{address} of IPAddress {claim} is in the reuse grace period of pool {found.pool} until {until} (a "
            "release record, no claim holds it); it is recorded again on a later repair pass"
        )

    async def outside_pool(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> Mapping[str, str]:
        """The addresses the pool would not hand out now, each with why; {} for an invalid pool (its condition says
        why). When the pool's object (its resourceVersion) and `addresses` are as at the last call that found none
        outside, it is {} again without parsing the pool."""
        with self.pools.operation(pool_ref):
            meta = pool["metadata"]
            asked = (str(meta.get("uid")), str(meta.get("resourceVersion") or ""), tuple(addresses))
            if asked[1] and self.all_inside.get(pool_ref) == asked:
                return {}
            try:
                parsed = self.ledger.noted(self.parse(pool_ref, pool))
            except PoolNotReadyError:
                return {}
            outside = {address: why for address in addresses if (why := parsed.why_not(normalized_address(address)))}
            if outside:
                self.all_inside.pop(pool_ref, None)
            else:
                self.all_inside[pool_ref] = asked
            return outside

    async def sweep_orphaned(self, grace_seconds: float) -> int:
        """Delete the reservations of this backend's pools that are gone (see the module); answer how many."""
        now = self.orphan_sweep_clock()
        if self._orphans_swept_at is not None and now - self._orphans_swept_at < self.orphan_sweep_every:
            return 0
        known: set[PoolRef] = set()
        for kind in self.kinds:
            for pool in self.cached_pools(kind) or ():
                meta = pool["metadata"]
                known.add(kind.ref(meta.get("namespace") if kind.namespaced else None, meta["name"]))
        with _api_server_errors("the reservations of deleted pools"):
            swept = await sweep_orphans(self.ledger.reservations, self.kinds, grace_seconds, known)
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


async def sweep_orphans(
    reservations: ReservationClient, kinds: Sequence[PoolKind], grace_seconds: float, known: Collection[PoolRef] = ()
) -> int:
    """Delete the reservations of the pools of `kinds` that are gone, but those of `known` pools (see the module);
    answer how many. Deletion is guarded by uid and resourceVersion: several processes may sweep at once."""
    served = {(kind.group, kind.kind): kind for kind in kinds}
    items, _ = await reservations.kube.list(RESERVATIONS)
    by_pool: defaultdict[PoolRef, list[Reservation]] = defaultdict(list)
    for item in items:
        ref = pool_of(item)
        if ref is not None and (ref.group, ref.kind) in served and ref not in known:
            by_pool[ref].append(Reservation.parse(item))
    deleted = 0
    for ref, held in by_pool.items():
        kind = served[(ref.group, ref.kind)]
        namespace = ref.namespace if kind.namespaced else None
        if await reservations.kube.get(pool_resource(kind), ref.name, namespace) is not None:
            continue
        for reservation in held:
            if age_seconds(reservation.created_at) < grace_seconds or _in_reuse_grace(reservation):
                continue
            if await reservations.still_named(reservation, ref) or not await reservations.delete(reservation):
                continue  # named by an IPAddress; or gone or changed since it was listed
            deleted += 1
            log.info("reservation of a deleted pool removed", pool=str(ref), address=reservation.address)
    return deleted


def _in_reuse_grace(reservation: Reservation) -> bool:
    """Whether a release record's recorded reuse grace period is still running."""
    grace = reservation.grace_seconds
    return bool(reservation.released_at) and grace is not None and age_seconds(reservation.released_at or "") < grace
