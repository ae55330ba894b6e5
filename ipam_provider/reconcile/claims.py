"""The claim reconciler: IPAddressClaim → backend allocation → IPAddress → claim status.

Contract (level-triggered; every step is idempotent and the reconcile may be repeated at any point):
- Claims whose poolRef names no registered backend are ignored.
- A paused claim, Cluster or pool gets no allocation and no release.
- A live claim gets the ReleaseAddress finalizer, an address from its backend, an IPAddress of its own name
  (claim as controller owner, pool as owner, ProtectAddress finalizer, cluster label), `status.addressRef`
  and `Ready=True/AddressAllocated`. Failures give `Ready=False` with PoolNotReady, PoolExhausted or
  AllocationFailed and a message that says what to do; every transition also records an Event. While the
  pool is missing or being deleted only claims without an IPAddress get PoolNotReady: a fulfilled claim stays
  Ready=True/AddressAllocated (its address is still held).
- A deleted claim: its IPAddress is let go and deleted first, then the backend releases, then the claim's
  finalizer is removed. The address is therefore never free in the backend while an IPAddress still names it.
- An IPAddress deleted while its claim lives is re-created with identical values (the backend holds the
  address for the claim's uid); a pre-existing IPAddress for the claim is adopted, its spec untouched.
"""

from __future__ import annotations

import structlog
from pydantic import ValidationError

from ipam_provider import metrics
from ipam_provider.api.capi import (
    ANNOTATION_PAUSED,
    FINALIZER_PROTECT_ADDRESS,
    FINALIZER_RELEASE_ADDRESS,
    READY,
    REASON_ALLOCATED,
    REASON_ALLOCATION_FAILED,
    REASON_POOL_NOT_READY,
    Cluster,
    IPAddress,
    IPAddressClaim,
)
from ipam_provider.api.meta import find_condition, set_condition
from ipam_provider.backend.contract import (
    Allocation,
    Backend,
    BackendError,
    ClaimContext,
    PoolExhaustedError,
    PoolKind,
    PoolRef,
)
from ipam_provider.kube.errors import ApiError
from ipam_provider.kube.resources import ADDRESSES, CLAIMS
from ipam_provider.reconcile.addresses import adoption_patch, allocation_of, belongs_to, desired_address
from ipam_provider.reconcile.context import Object, ReconcileContext, patch_cached, shard_for
from ipam_provider.reconcile.events import NORMAL, WARNING
from ipam_provider.reconcile.release import release_claim

log = structlog.get_logger(__name__)

RETRY_NOT_READY = 30.0
RETRY_EXHAUSTED = 60.0
RETRY_FAILED = 15.0


def pool_ref_of(claim: IPAddressClaim, kind: PoolKind) -> PoolRef:
    namespace = claim.metadata.namespace if kind.namespaced else None
    return PoolRef(kind.group, kind.kind, namespace, claim.spec.pool_ref.name)


def claim_context(claim: IPAddressClaim) -> ClaimContext:
    return ClaimContext(
        namespace=claim.metadata.namespace or "",
        name=claim.metadata.name,
        uid=claim.metadata.uid,
        cluster_name=claim.cluster_name,
        labels=dict(claim.metadata.labels),
        annotations=dict(claim.metadata.annotations),
        owner_references=[ref.wire() for ref in claim.metadata.owner_references],
    )


class ClaimReconciler:
    def __init__(self, context: ReconcileContext) -> None:
        self.ctx = context

    def shard_of(self, namespace: str, name: str) -> str:
        """The queue shard of a claim: its pool, so that claims of one pool are handled one at a time."""
        raw = self.ctx.caches.claims.get(namespace, name)
        if raw is None:
            return ""
        pool = raw.get("spec", {}).get("poolRef", {})
        found = self.ctx.registry.lookup(pool.get("apiGroup", ""), pool.get("kind", ""))
        if found is None:
            return ""
        try:
            claim = IPAddressClaim.model_validate(raw)
        except ValidationError:
            return ""  # reconcile() logs why the claim is ignored
        return shard_for(pool_ref_of(claim, found[1]))

    async def reconcile(self, namespace: str, name: str) -> float | None:
        """Reconcile one claim; returns seconds until it should be looked at again, or None."""
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
        pool_ref = pool_ref_of(claim, kind)
        pool = self.ctx.caches.pool(pool_ref)
        bound = log.bind(claim=f"{namespace}/{name}", pool=str(pool_ref))
        cluster_name = claim.cluster_name
        cluster_raw = self.ctx.caches.clusters.get(namespace, cluster_name) if cluster_name else None
        if _paused(claim, cluster_raw, pool):
            bound.debug("paused; nothing done")
            return None
        if claim.metadata.deleting:
            if FINALIZER_RELEASE_ADDRESS in claim.metadata.finalizers:
                await release_claim(self.ctx, raw, claim, backend, kind, pool_ref, pool, claim_context(claim))
                bound.info("claim released")
                metrics.RELEASES.labels(kind.kind).inc()
            return None
        if cluster_name and cluster_raw is None:
            message = (
                f"Cluster {namespace}/{cluster_name} was not found; waiting for it before allocating, because "
                "whether it is paused cannot be known"
            )
            await self._set_ready(raw, claim, False, REASON_ALLOCATION_FAILED, message, None)
            return None
        confirmed = False  # whether this reconcile has proven the cached claim current against the API server
        if FINALIZER_RELEASE_ADDRESS not in claim.metadata.finalizers:
            confirmed = True  # the patch carries the resourceVersion: a stale or deleted claim fails it
            raw = await patch_cached(
                self.ctx,
                self.ctx.caches.claims,
                CLAIMS,
                raw,
                {"metadata": {"finalizers": [*claim.metadata.finalizers, FINALIZER_RELEASE_ADDRESS]}},
            )
            claim = IPAddressClaim.model_validate(raw)
        if pool is None or pool.get("metadata", {}).get("deletionTimestamp"):
            if await self._keep_fulfilled(raw, claim, kind, pool_ref):
                return None
            state = "was not found" if pool is None else "is being deleted"
            message = f"{pool_ref} {state}; create it or point the claim at another pool"
            await self._set_ready(raw, claim, False, REASON_POOL_NOT_READY, message, None)
            return None
        return await self._allocate(raw, claim, backend, kind, pool_ref, pool, bound, confirmed)

    async def _allocate(
        self,
        raw: Object,
        claim: IPAddressClaim,
        backend: Backend,
        kind: PoolKind,
        pool_ref: PoolRef,
        pool: Object,
        bound: structlog.typing.FilteringBoundLogger,
        confirmed: bool,
    ) -> float | None:
        namespace, name = claim.metadata.namespace or "", claim.metadata.name
        address_raw = self.ctx.caches.addresses.get(namespace, name)
        existing: Allocation | None = None
        if address_raw is None and not confirmed:
            # A new allocation: confirm from the API server, not the cache, that the claim still wants one, so
            # that a lagging cache never allocates for a claim another replica is releasing.
            fresh = await self.ctx.kube.get(CLAIMS, name, namespace)
            if fresh is None or fresh["metadata"].get("uid") != claim.metadata.uid:
                return None
            if fresh["metadata"].get("deletionTimestamp"):
                self.ctx.caches.claims.upsert(fresh)
                return 0.0  # reconcile again, on the release path
        if address_raw is not None:
            address = IPAddress.model_validate(address_raw)
            if not belongs_to(address, claim, kind):
                message = (
                    f"IPAddress {namespace}/{name} already exists for claim {address.spec.claim_ref.name} "
                    f"and pool {address.spec.pool_ref.kind}/{address.spec.pool_ref.name}; delete it or rename "
                    "the claim"
                )
                await self._set_ready(raw, claim, False, REASON_ALLOCATION_FAILED, message, None)
                return RETRY_FAILED
            if address.metadata.deleting:
                await self._let_go(address_raw)
                return None  # its DELETED event brings the claim back, to re-create it
            existing = allocation_of(address)
        try:
            allocation = await backend.allocate(pool_ref, pool, claim_context(claim), existing)
        except BackendError as error:
            bound.info("allocation failed", reason=error.reason, message=error.message)
            metrics.ALLOCATION_FAILURES.labels(kind.kind, error.reason).inc()
            await self._set_ready(raw, claim, False, error.reason, error.message, None)
            if error.retry_after is not None:
                return error.retry_after
            return RETRY_EXHAUSTED if isinstance(error, PoolExhaustedError) else RETRY_NOT_READY
        if address_raw is None:
            body = desired_address(claim, kind, pool, allocation)
            try:
                created = await self.ctx.kube.create(ADDRESSES, body, namespace)
            except ApiError as error:
                if not error.already_exists:
                    raise
                fresh = await self.ctx.kube.get(ADDRESSES, name, namespace)
                if fresh is not None:
                    self.ctx.caches.addresses.upsert(fresh)
                return 0.0  # look again with the IPAddress that exists
            self.ctx.caches.addresses.upsert(created)
            bound.info("address allocated", address=f"{allocation.address}/{allocation.prefix}")
            metrics.ALLOCATIONS.labels(kind.kind).inc()
            self.ctx.pool_changed(pool_ref)
        else:
            patch = adoption_patch(address_raw, claim, kind, pool)
            if patch is not None:
                await patch_cached(self.ctx, self.ctx.caches.addresses, ADDRESSES, address_raw, patch)
                bound.info("existing IPAddress adopted", address=allocation.address)
                self.ctx.pool_changed(pool_ref)
        message = f"{allocation.address}/{allocation.prefix} allocated from {pool_ref}"
        await self._set_ready(raw, claim, True, REASON_ALLOCATED, message, name)
        return None

    async def _keep_fulfilled(self, raw: Object, claim: IPAddressClaim, kind: PoolKind, pool_ref: PoolRef) -> bool:
        """While its pool is gone or being deleted, a claim whose IPAddress exists stays Ready=True: the address
        is still held. Returns False when there is no such IPAddress (a new allocation must wait for a pool)."""
        namespace, name = claim.metadata.namespace or "", claim.metadata.name
        address_raw = self.ctx.caches.addresses.get(namespace, name)
        if address_raw is None:
            return False
        try:
            address = IPAddress.model_validate(address_raw)
        except ValidationError:
            return False
        if address.metadata.deleting or not belongs_to(address, claim, kind):
            return False
        message = f"{address.spec.address}/{address.spec.prefix} allocated from {pool_ref}"
        await self._set_ready(raw, claim, True, REASON_ALLOCATED, message, name)
        return True

    async def _let_go(self, address_raw: Object) -> None:
        """Remove our finalizer from an IPAddress someone deleted, so that it can be re-created afresh."""
        finalizers = [f for f in address_raw["metadata"].get("finalizers") or [] if f != FINALIZER_PROTECT_ADDRESS]
        if finalizers != (address_raw["metadata"].get("finalizers") or []):
            await patch_cached(
                self.ctx,
                self.ctx.caches.addresses,
                ADDRESSES,
                address_raw,
                {"metadata": {"finalizers": finalizers}},
            )

    async def _set_ready(
        self,
        raw: Object,
        claim: IPAddressClaim,
        ready: bool,
        reason: str,
        message: str,
        address_name: str | None,
    ) -> None:
        """Write `status.addressRef` and the Ready condition when they change; record an Event on transitions."""
        conditions, changed = set_condition(
            claim.status.conditions,
            type=READY,
            status=ready,
            reason=reason,
            message=message,
            generation=claim.metadata.generation,
        )
        previous = find_condition(claim.status.conditions, READY)
        current_ref = claim.status.address_ref.name if claim.status.address_ref else None
        wanted_ref = address_name if address_name is not None else current_ref
        if not changed and current_ref == wanted_ref:
            return
        status: Object = {"conditions": [c.wire() for c in conditions]}
        if wanted_ref is not None:
            status["addressRef"] = {"name": wanted_ref}
        await patch_cached(self.ctx, self.ctx.caches.claims, CLAIMS, raw, {"status": status}, subresource="status")
        if previous is None or previous.status != ("True" if ready else "False") or previous.reason != reason:
            await self.ctx.recorder.record(raw, NORMAL if ready else WARNING, reason, message)


def _paused(claim: IPAddressClaim, cluster_raw: Object | None, pool: Object | None) -> bool:
    if ANNOTATION_PAUSED in claim.metadata.annotations:
        return True
    if cluster_raw is not None:
        try:
            if Cluster.model_validate(cluster_raw).paused:
                return True
        except ValidationError:
            pass
    return pool is not None and ANNOTATION_PAUSED in (pool.get("metadata", {}).get("annotations") or {})
