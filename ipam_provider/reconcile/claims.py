"""The claim reconciler: IPAddressClaim → backend allocation → IPAddress → claim status, as Cluster API's IPAM
providers do (docs/architecture.md, "The claim reconciler"). Level-triggered: every step is idempotent.

- A deleted claim's IPAddress goes first (read fresh), then the backend releases, then the finalizer: an address is
  never free in the backend while an IPAddress names it. A release the backend cannot make (ReleaseImpossibleError)
  lets the claim go, with a Warning Event saying whether the repair loop or a person releases what is left.
- An address the backend hands out although a live IPAddress of the pool names it for another claim (a lost
  record, docs/repair.md) is never written: it is given back, restored for its holder when possible, and the claim
  retries for another.
- A paused claim, Cluster or pool gets nothing. A claim or IPAddress carrying clusterctl move's `delete-for-move` is
  never released, allocated or re-created; a deleted claim so marked only loses our finalizer (docs/clusterctl.md).
- A fulfilled claim keeps its address whatever its requested-address annotation says (one Warning Event
  `RequestedAddressIgnored` per change); while its pool is missing or being deleted it stays Ready.
"""

from __future__ import annotations

import structlog
from pydantic import ValidationError

from ipam_provider import pool_metrics
from ipam_provider.api.capi import (
    ADDRESSES,
    ANNOTATION_DELETE_FOR_MOVE,
    ANNOTATION_PAUSED,
    CLAIMS,
    FINALIZER_PROTECT_ADDRESS,
    FINALIZER_RELEASE_ADDRESS,
    READY,
    REASON_ALLOCATED,
    REASON_ALLOCATION_FAILED,
    REASON_POOL_NOT_READY,
    IPAddress,
    IPAddressClaim,
    cluster_paused,
    find_condition,
    set_condition,
)
from ipam_provider.backend.contract import (
    REQUESTED_ADDRESS_ANNOTATION,
    Allocation,
    AllocationFailedError,
    BackendError,
    PoolExhaustedError,
    ReleaseImpossibleError,
)
from ipam_provider.backend.repair import RestoreOutcome
from ipam_provider.cache import POOL_ADDRESS, patch_cached
from ipam_provider.common import Object, normalized_address
from ipam_provider.reconcile.addresses import adoption_patch, belongs_to, desired_address
from ipam_provider.reconcile.context import ClaimWork, ReconcileContext, claim_context
from ipam_provider.runtime.events import NORMAL, WARNING
from ipam_provider.runtime.kube.bounds import EVENT_MESSAGE_LENGTH, cut_message
from ipam_provider.runtime.kube.errors import ApiError

log = structlog.get_logger(__name__)

RETRY_NOT_READY = 30.0
RETRY_EXHAUSTED = 60.0
RETRY_FAILED = 15.0
RETRY_LINGERING = 30.0  # a deleted claim whose IPAddress other finalizers keep
RETRY_IN_USE = 2.0  # an address a live IPAddress still names was given back: ask for another
REASON_ADDRESS_IN_USE = "AddressStillInUse"
REASON_REQUESTED_ADDRESS_IGNORED = "RequestedAddressIgnored"
LIVE, GONE, DELETING = "live", "gone", "deleting"
LOGGED_TEXT_LENGTH = EVENT_MESSAGE_LENGTH  # a tenant's text (a 40 KB annotation) is cut in logs as in Events


class ClaimReconciler:
    def __init__(self, context: ReconcileContext) -> None:
        self.ctx = context
        # Claims whose IPAddress clusterctl deleted for a move: (namespace, name) → claim uid. Such a claim gets
        # no new IPAddress; the entry goes when the claim is gone (or replaced by another of its name).
        self._moved_away: dict[tuple[str, str], str] = {}
        self._first_seen = pool_metrics.FirstSeen()  # live claims without an address, for the allocation time
        self._noticed: dict[tuple[str, str], tuple[str, str]] = {}  # claim → (uid, requested address ignored)

    def _work(self, namespace: str, name: str) -> ClaimWork | None:
        """The work object of a cached claim; None when it is gone, does not parse, or names no served pool."""
        raw = self.ctx.caches.claims.get(namespace, name)
        if raw is None:
            return None
        try:
            claim = IPAddressClaim.model_validate(raw)
        except ValidationError as error:
            log.warning("claim does not parse; ignored", claim=f"{namespace}/{name}", error=str(error))
            return None
        found = self.ctx.registry.lookup(claim.spec.pool_ref.api_group, claim.spec.pool_ref.kind)
        if found is None:
            return None
        backend, kind = found
        pool_ref = kind.ref(namespace, claim.spec.pool_ref.name)
        bound = log.bind(claim=f"{namespace}/{name}", pool=str(pool_ref))
        return ClaimWork(raw, claim, backend, kind, pool_ref, self.ctx.caches.pool(pool_ref), bound)

    async def reconcile(self, namespace: str, name: str) -> float | None:
        """Reconcile one claim; returns seconds until it should be looked at again, or None."""
        work = self._work(namespace, name)
        if work is None:
            self._moved_away.pop((namespace, name), None)
            self._first_seen.forget((namespace, name))
            self._noticed.pop((namespace, name), None)
            return None
        if ANNOTATION_DELETE_FOR_MOVE in work.claim.metadata.annotations:
            await self._moving(work)
            return None
        moved_uid = self._moved_away.get((namespace, name))
        if moved_uid is not None:
            if moved_uid == work.claim.metadata.uid:
                work.log.debug("IPAddress deleted by clusterctl move; the claim is not served here any more")
                return None
            del self._moved_away[(namespace, name)]
        cluster_name = work.claim.cluster_name
        cluster_raw = self.ctx.caches.clusters.get(namespace, cluster_name) if cluster_name else None
        if _paused(work, cluster_raw):
            work.log.debug("paused; nothing done")
            return None
        if work.claim.metadata.deleting:
            return await self._release(work)
        if work.claim.status.address_ref is None:
            self._first_seen.seen((namespace, name), work.claim.metadata.uid)
        if cluster_name and cluster_raw is None:
            message = (
                f"Cluster {namespace}/{cluster_name} was not found; waiting for it before allocating, because "
                "whether it is paused cannot be known"
            )
            await self._set_ready(work, False, REASON_ALLOCATION_FAILED, message)
            return None
        confirmed = await self._ensure_finalizer(work)
        pool = work.pool
        if pool is None or pool.get("metadata", {}).get("deletionTimestamp"):
            if await self._keep_fulfilled(work):
                return None
            state = "was not found" if pool is None else "is being deleted"
            message = f"{work.pool_ref} {state}; create it or point the claim's spec.poolRef at another pool"
            await self._set_ready(work, False, REASON_POOL_NOT_READY, message)
            return None
        return await self._allocate(work, confirmed)

    async def _release(self, work: ClaimWork) -> float | None:
        """Release a deleted claim (see the module's contract); seconds until a retry, or None when done."""
        self._first_seen.forget((work.namespace, work.name))
        self._noticed.pop((work.namespace, work.name), None)
        if FINALIZER_RELEASE_ADDRESS not in work.claim.metadata.finalizers:
            return None
        allocation: Allocation | None = None
        address_raw = await self.ctx.kube.get(ADDRESSES, work.name, work.namespace)
        if address_raw is not None and belongs_to(address_raw, work):
            allocation = IPAddress.model_validate(address_raw).allocation()
            holders = await self._delete_address(address_raw)
            if holders:
                work.log.info("IPAddress still held by other finalizers; release waits", finalizers=",".join(holders))
                return RETRY_LINGERING
        try:
            async with self.ctx.backend_turn(work.backend, work.pool_ref):
                await work.backend.release(work.pool_ref, work.pool, work.context(), allocation)
        except ReleaseImpossibleError as error:
            message = f"{error.message}; {_left_to(self.ctx, work)}"
            self.ctx.recorder.record(work.raw, WARNING, error.reason, message, related=work.pool)
        await self._drop_finalizer(work)
        self.ctx.pool_changed(work.pool_ref)
        work.log.info("claim released")
        pool_metrics.RELEASES.labels(*self.ctx.pool_labels(work.pool_ref)).inc()
        return None

    async def _delete_address(self, address_raw: Object) -> list[str]:
        """Let go of the IPAddress and delete it; the finalizers of others that keep it (empty once it is gone)."""
        meta = address_raw["metadata"]
        try:
            await self._let_go(address_raw)
            await self.ctx.kube.delete(ADDRESSES, meta["name"], meta["namespace"], uid=meta.get("uid"))
        except ApiError as error:
            if not error.not_found:
                raise
            return []
        others = [f for f in meta.get("finalizers") or [] if f != FINALIZER_PROTECT_ADDRESS]
        if not others:
            self.ctx.caches.addresses.remove((meta["namespace"], meta["name"]))
        return others

    async def _drop_finalizer(self, work: ClaimWork) -> None:
        """Remove the ReleaseAddress finalizer from the claim (gone already: done)."""
        remaining = [f for f in work.claim.metadata.finalizers if f != FINALIZER_RELEASE_ADDRESS]
        patch = {"metadata": {"finalizers": remaining}}
        try:
            await patch_cached(self.ctx.kube, self.ctx.caches.claims, CLAIMS, work.raw, patch)
        except ApiError as error:
            if not error.not_found:
                raise

    async def _moving(self, work: ClaimWork) -> None:
        """A claim clusterctl is deleting for a move: nothing is released; a deleted one loses our finalizer only."""
        if not work.claim.metadata.deleting or FINALIZER_RELEASE_ADDRESS not in work.claim.metadata.finalizers:
            work.log.debug("being moved by clusterctl; nothing done")
            return
        await self._drop_finalizer(work)
        work.log.info("claim deleted by clusterctl move; its address is kept in the backend for the target")

    async def _ensure_finalizer(self, work: ClaimWork) -> bool:
        """Add the ReleaseAddress finalizer if missing. Returns whether this proved the cached claim current: the
        patch carries the resourceVersion, so a stale or deleted claim fails it."""
        finalizers = work.claim.metadata.finalizers
        if FINALIZER_RELEASE_ADDRESS in finalizers:
            return False
        patch = {"metadata": {"finalizers": [*finalizers, FINALIZER_RELEASE_ADDRESS]}}
        work.refresh(await patch_cached(self.ctx.kube, self.ctx.caches.claims, CLAIMS, work.raw, patch))
        return True

    async def _fresh_state(self, work: ClaimWork) -> str:
        """The claim's state on the API server: LIVE, GONE (or replaced) or DELETING (then cached); read before a
        new allocation, so that a lagging cache never allocates for a claim another replica is releasing."""
        fresh = await self.ctx.kube.get(CLAIMS, work.name, work.namespace)
        if fresh is None or fresh["metadata"].get("uid") != work.claim.metadata.uid:
            return GONE
        if fresh["metadata"].get("deletionTimestamp"):
            self.ctx.caches.claims.upsert(fresh)
            return DELETING
        return LIVE

    async def _allocate(self, work: ClaimWork, confirmed: bool) -> float | None:
        address_raw = self.ctx.caches.addresses.get(work.namespace, work.name)
        existing: Allocation | None = None
        if address_raw is None and not confirmed:
            state = await self._fresh_state(work)
            if state != LIVE:
                return None if state == GONE else 0.0  # a deleting claim: reconcile again, on the release path
        if address_raw is not None:
            if not belongs_to(address_raw, work):
                await self._report_foreign(work, address_raw)
                return RETRY_FAILED
            address = IPAddress.model_validate(address_raw)
            if ANNOTATION_DELETE_FOR_MOVE in address.metadata.annotations:
                if address.metadata.deleting:
                    await self._let_go(address_raw)
                    self._moved_away[(work.namespace, work.name)] = work.claim.metadata.uid
                work.log.info("IPAddress being moved by clusterctl; not re-created, nothing released")
                return None
            if address.metadata.deleting:
                await self._let_go(address_raw)
                return None  # its DELETED event brings the claim back, to re-create it
            existing = address.allocation()
            self._notice_requested(work, existing)
        else:
            try:  # for every backend: a requested address that is no IP address fails the claim
                _ = work.context().requested_address  # parsed here once, and handed to the backend parsed
            except BackendError as error:
                return await self._failed(work, error)
        pool_now = self.ctx.caches.pool(work.pool_ref)  # as of now: a deletion seen meanwhile stops the allocation
        if pool_now is None or pool_now.get("metadata", {}).get("deletionTimestamp"):
            return 0.0  # again at once, on the path of a claim whose pool is gone or going
        # From here on (no await before it) the pool keeps its finalizer until the IPAddress is written.
        with self.ctx.allocating(work.pool_ref):
            try:
                async with self.ctx.backend_turn(work.backend, work.pool_ref):
                    allocation = await work.backend.allocate(work.pool_ref, pool_now, work.context(), existing)
            except BackendError as error:
                return await self._failed(work, error)
            if address_raw is None:
                holder = self._holder_of(work, allocation)
                if holder is not None:  # the backend lost the holder's record and handed its address out again
                    return await self._failed(work, await self._give_back(work, pool_now, allocation, holder))
                if not await self._create_address(work, pool_now, allocation):
                    return 0.0  # look again with the IPAddress that exists
            else:
                await self._adopt(work, pool_now, address_raw, allocation)
        message = f"{allocation.address}/{allocation.prefix} allocated from {work.pool_ref}"
        await self._set_ready(work, True, REASON_ALLOCATED, message, work.name)
        self._first_seen.forget((work.namespace, work.name))
        return None

    def _notice_requested(self, work: ClaimWork, existing: Allocation) -> None:
        """One `RequestedAddressIgnored` Warning per change of a fulfilled claim's annotation naming another address
        than its IPAddress's (or no IP address); forgotten once the annotation matches again."""
        key = (work.namespace, work.name)
        text = (work.claim.metadata.annotations.get(REQUESTED_ADDRESS_ANNOTATION) or "").strip()
        try:
            requested = work.context().requested_address
        except AllocationFailedError:
            requested = None
        current = normalized_address(existing.address)
        if not text or requested == current:
            self._noticed.pop(key, None)
            return
        if self._noticed.get(key) == (work.claim.metadata.uid, text):
            return
        self._noticed[key] = (work.claim.metadata.uid, text)
        message = ignored_message(requested or text, current, requested is not None)
        requested_text = cut_message(text, LOGGED_TEXT_LENGTH)
        work.log.info("requested address ignored: the claim is fulfilled", requested=requested_text, address=current)
        self.ctx.recorder.record(work.raw, WARNING, REASON_REQUESTED_ADDRESS_IGNORED, message, related=work.pool)

    async def _failed(self, work: ClaimWork, error: BackendError) -> float:
        work.log.info("allocation failed", reason=error.reason, message=cut_message(error.message, LOGGED_TEXT_LENGTH))
        labels = self.ctx.pool_labels(work.pool_ref)
        pool_metrics.count_allocation_error(labels, error.reason)
        previous = find_condition(work.claim.status.conditions, READY)
        await self._set_ready(work, False, error.reason, error.message)
        if previous is None or previous.reason != error.reason:  # the pool's waiting claims changed reason
            pool_metrics.record_waiting(labels, self.ctx.waiting_claims(work.pool_ref))
        if self.ctx.caches.pool(work.pool_ref) is None:  # the pool went while this claim waited
            pool_metrics.forget_pool(labels)
        if error.retry_after is not None:
            return error.retry_after
        return RETRY_EXHAUSTED if isinstance(error, PoolExhaustedError) else RETRY_NOT_READY

    def _holder_of(self, work: ClaimWork, allocation: Allocation) -> Object | None:
        """The live cached IPAddress of the claim's pool naming `allocation.address` for another claim, or None."""
        key = (work.pool_ref, normalized_address(allocation.address))
        for address in self.ctx.caches.addresses.by_index(POOL_ADDRESS, key):
            meta = address["metadata"]
            claim_name = ((address.get("spec") or {}).get("claimRef") or {}).get("name")
            if not meta.get("deletionTimestamp") and (meta.get("namespace"), claim_name) != (work.namespace, work.name):
                return address
        return None

    async def _give_back(
        self, work: ClaimWork, pool: Object, allocation: Allocation, holder: Object
    ) -> AllocationFailedError:
        """Release this claim's new allocation, restore it for the holder; the error that fails this attempt."""
        held_by = f"{holder['metadata'].get('namespace')}/{holder['metadata'].get('name')}"
        async with self.ctx.backend_turn(work.backend, work.pool_ref):
            await work.backend.release(work.pool_ref, pool, work.context(), allocation)
        outcome = await self._restore_for_holder(work, pool, holder)
        work.log.warning(
            "backend handed out an address a live IPAddress still names; given back",
            address=allocation.address,
            holder=held_by,
            restored=outcome,
        )
        message = (
            f"{work.pool_ref} handed {allocation.address} to claim {work.namespace}/{work.name}, but IPAddress "
            f"{held_by} still names it (its record in the backend was lost); it was given back"
            + (" and recorded again for its claim" if outcome == RestoreOutcome.RECORDED else "")
        )
        self.ctx.recorder.record(pool, WARNING, REASON_ADDRESS_IN_USE, message)
        holder_namespace = holder["metadata"].get("namespace")
        named = f"IPAddress {held_by}" if holder_namespace == work.namespace else "an IPAddress of another namespace"
        why = f"{allocation.address} is still used by {named}; asking {work.pool_ref} for another address"
        return AllocationFailedError(why, retry_after=RETRY_IN_USE)

    async def _restore_for_holder(self, work: ClaimWork, pool: Object, holder: Object) -> str:
        """Restore the holder's address for its claim when possible; the outcome, or "not tried"."""
        repairer = self.ctx.registry.capabilities(work.backend).repair
        claim_name = ((holder.get("spec") or {}).get("claimRef") or {}).get("name") or ""
        claim_raw = self.ctx.caches.claims.get(holder["metadata"].get("namespace"), claim_name)
        if repairer is None or claim_raw is None:
            return "not tried"
        try:
            claim = IPAddressClaim.model_validate(claim_raw)
            allocation = IPAddress.model_validate(holder).allocation()
        except ValidationError:
            return "not tried"
        async with self.ctx.backend_turn(work.backend, work.pool_ref):
            answer = await repairer.restore(work.pool_ref, pool, claim_context(claim), allocation)
        return str(answer.outcome)

    async def _report_foreign(self, work: ClaimWork, address_raw: Object) -> None:
        """An IPAddress of the claim's name exists for another claim or pool."""
        spec = address_raw.get("spec") or {}
        claim_ref, pool_ref = spec.get("claimRef") or {}, spec.get("poolRef") or {}
        message = (
            f"IPAddress {work.namespace}/{work.name} already exists for claim {claim_ref.get('name')} "
            f"and pool {pool_ref.get('kind')}/{pool_ref.get('name')}; delete it or rename the claim"
        )
        await self._set_ready(work, False, REASON_ALLOCATION_FAILED, message)

    async def _create_address(self, work: ClaimWork, pool: Object, allocation: Allocation) -> bool:
        """Create the claim's IPAddress; False when one of its name appeared meanwhile (now in the cache)."""
        body = desired_address(work, pool, allocation)
        try:
            created = await self.ctx.kube.create(ADDRESSES, body, work.namespace)
        except ApiError as error:
            if not error.already_exists:
                raise
            fresh = await self.ctx.kube.get(ADDRESSES, work.name, work.namespace)
            if fresh is not None:
                self.ctx.caches.addresses.upsert(fresh)
            return False
        self.ctx.caches.addresses.upsert(created)
        work.log.info("address allocated", address=f"{allocation.address}/{allocation.prefix}")
        waited = self._first_seen.fulfilled((work.namespace, work.name), work.claim.metadata.uid)
        pool_metrics.count_allocation(self.ctx.pool_labels(work.pool_ref), waited)
        self.ctx.pool_changed(work.pool_ref)
        return True

    async def _adopt(self, work: ClaimWork, pool: Object, address_raw: Object, allocation: Allocation) -> None:
        patch = adoption_patch(address_raw, work, pool)
        if patch is not None:
            await patch_cached(self.ctx.kube, self.ctx.caches.addresses, ADDRESSES, address_raw, patch)
            work.log.info("existing IPAddress adopted", address=allocation.address)
            self.ctx.pool_changed(work.pool_ref)

    async def _keep_fulfilled(self, work: ClaimWork) -> bool:
        """While its pool is gone or being deleted, a claim whose IPAddress exists stays Ready=True: the address
        is still held. Returns False when there is no such IPAddress (a new allocation must wait for a pool)."""
        address_raw = self.ctx.caches.addresses.get(work.namespace, work.name)
        if address_raw is None:
            return False
        try:
            address = IPAddress.model_validate(address_raw)
        except ValidationError:
            return False
        if address.metadata.deleting or not belongs_to(address_raw, work):
            return False
        message = f"{address.spec.address}/{address.spec.prefix} allocated from {work.pool_ref}"
        await self._set_ready(work, True, REASON_ALLOCATED, message, work.name)
        return True

    async def _let_go(self, address_raw: Object) -> None:
        """Remove our ProtectAddress finalizer from the IPAddress, if it carries it."""
        finalizers = [f for f in address_raw["metadata"].get("finalizers") or [] if f != FINALIZER_PROTECT_ADDRESS]
        if finalizers != (address_raw["metadata"].get("finalizers") or []):
            patch = {"metadata": {"finalizers": finalizers}}
            await patch_cached(self.ctx.kube, self.ctx.caches.addresses, ADDRESSES, address_raw, patch)

    async def _set_ready(
        self, work: ClaimWork, ready: bool, reason: str, message: str, address_name: str | None = None
    ) -> None:
        """Write `status.addressRef` and the Ready condition when they change; record an Event on transitions."""
        status_now = work.claim.status
        generation = work.claim.metadata.generation
        conditions, changed = set_condition(status_now.conditions, READY, ready, reason, message, generation)
        previous = find_condition(status_now.conditions, READY)
        current_ref = status_now.address_ref.name if status_now.address_ref else None
        wanted_ref = address_name if address_name is not None else current_ref
        if not changed and current_ref == wanted_ref:
            return
        status: Object = {"conditions": [c.wire() for c in conditions]}
        if wanted_ref is not None:
            status["addressRef"] = {"name": wanted_ref}
        raw = work.raw
        updated = await self.ctx.write_status(self.ctx.caches.claims, CLAIMS, raw, status)
        if updated is None:
            return  # refused: its own Event says why
        work.refresh(updated)
        if previous is None or previous.status != ("True" if ready else "False") or previous.reason != reason:
            self.ctx.recorder.record(raw, NORMAL if ready else WARNING, reason, message, related=work.pool)


def ignored_message(requested: str, current: str, valid: bool) -> str:
    """The `RequestedAddressIgnored` message: the address asked for, the one the claim keeps, and what to do."""
    asked = f"asks for {requested}" if valid else f"is {requested!r}, which is not an IP address"
    return (
        f"annotation {REQUESTED_ADDRESS_ANNOTATION} {asked}, but the claim already has {current}; its IPAddress is "
        "immutable, so nothing changes: delete and recreate the claim to get another address"
    )


def _left_to(ctx: ReconcileContext, work: ClaimWork) -> str:
    """Who releases what the backend could not, for the Warning Event."""
    manual = "release the address in the backend by hand"
    capabilities = ctx.registry.capabilities(work.backend)
    if capabilities.repair is None:
        return f"this backend has no repair loop to release it: {manual}"
    if work.pool is None and capabilities.sweep_orphaned is None:
        return f"the pool is gone and the repair loop does not look for this backend's holdings of gone pools: {manual}"
    if ctx.repair_releases:
        return "the repair loop releases the address once the pool's backend can be reached again"
    return (
        "the repair loop would release it once the pool's backend can be reached again, but it does not release "
        f"(--repair-interval=0 or --repair-report-only): {manual}"
    )


def _paused(work: ClaimWork, cluster_raw: Object | None) -> bool:
    pool_annotations = (work.pool or {}).get("metadata", {}).get("annotations") or {}
    claim_paused = ANNOTATION_PAUSED in work.claim.metadata.annotations
    return claim_paused or cluster_paused(cluster_raw) or ANNOTATION_PAUSED in pool_annotations
