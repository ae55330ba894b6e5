"""Releasing a deleted claim: IPAddress first, then the backend, then the claim's finalizer.

The IPAddress is read fresh from the API server, not from the cache, so that a lagging watch cannot leave an
IPAddress behind once the claim is gone. While another finalizer keeps the deleted IPAddress in existence, the
backend is not asked to release: the address stays held until no IPAddress names it. A backend that cannot
release (ReleaseImpossibleError) gets a Warning Event and the claim is let go: what the backend still holds for it
is left to the repair loop (`ipam_provider/repair`), which releases it once the backend can be used again, as it
does for a claim deleted without this finalizer. The Event says so only when the loop can: the backend has the
repair capability, the loop releases (on, not report-only), and the pool still exists or the backend sweeps the
holdings of gone pools (`sweep_orphaned`); otherwise it says to release the address in the backend by hand. Any
other failure keeps the finalizer and is retried.
"""

from __future__ import annotations

from ipam_provider.api.capi import FINALIZER_PROTECT_ADDRESS, FINALIZER_RELEASE_ADDRESS, IPAddress
from ipam_provider.backend.contract import Allocation, ReleaseImpossibleError
from ipam_provider.backend.repair import orphan_sweeper_of, repairer_of
from ipam_provider.common import Object
from ipam_provider.reconcile.addresses import allocation_of, belongs_to
from ipam_provider.reconcile.context import ClaimWork, ReconcileContext
from ipam_provider.runtime.events import WARNING
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import ADDRESSES, CLAIMS

RETRY_LINGERING = 30.0
LEFT_TO_REPAIR = "the repair loop releases the address once the pool's backend can be reached again"
LEFT_WITHOUT_REPAIR = (
    "the repair loop would release it once the pool's backend can be reached again, but it does not release "
    "(--repair-interval=0 or --repair-report-only): release the address in the backend by hand"
)
NOT_REPAIRABLE = "this backend has no repair loop to release it: release the address in the backend by hand"
POOL_GONE = (
    "the pool is gone and the repair loop does not look for this backend's holdings of gone pools: release the "
    "address in the backend by hand"
)


async def release_claim(ctx: ReconcileContext, work: ClaimWork) -> float | None:
    """Release the claim; returns seconds until it should be looked at again (its IPAddress still exists), or
    None once the claim's finalizer is gone."""
    allocation: Allocation | None = None
    address_raw = await ctx.kube.get(ADDRESSES, work.name, work.namespace)
    if address_raw is not None and belongs_to(address_raw, work):
        allocation = allocation_of(IPAddress.model_validate(address_raw))
        holders = await _delete_address(ctx, address_raw)
        if holders:
            work.log.info("IPAddress still held by other finalizers; release waits", finalizers=",".join(holders))
            return RETRY_LINGERING
    try:
        async with ctx.backend_turn(work.backend, work.pool_ref):
            await work.backend.release(work.pool_ref, work.pool, work.context(), allocation)
    except ReleaseImpossibleError as error:
        message = f"{error.message}; {_left_to(ctx, work)}"
        ctx.recorder.record(work.raw, WARNING, error.reason, message, related=work.pool)
    finalizers = [f for f in work.claim.metadata.finalizers if f != FINALIZER_RELEASE_ADDRESS]
    try:
        await ctx.patch_cached(ctx.caches.claims, CLAIMS, work.raw, {"metadata": {"finalizers": finalizers}})
    except ApiError as error:
        if not error.not_found:
            raise
    ctx.pool_changed(work.pool_ref)
    return None


def _left_to(ctx: ReconcileContext, work: ClaimWork) -> str:
    """Who releases what the backend could not (see the module's contract), for the Warning Event."""
    if repairer_of(work.backend) is None:
        return NOT_REPAIRABLE
    if work.pool is None and orphan_sweeper_of(work.backend) is None:
        return POOL_GONE
    return LEFT_TO_REPAIR if ctx.repair_releases else LEFT_WITHOUT_REPAIR


async def _delete_address(ctx: ReconcileContext, address_raw: Object) -> list[str]:
    """Remove our finalizer from the IPAddress and delete it. Returns the finalizers of others that keep it in
    existence (empty once it is gone)."""
    meta = address_raw["metadata"]
    finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER_PROTECT_ADDRESS]
    try:
        if finalizers != (meta.get("finalizers") or []):
            address_raw = await ctx.patch_cached(
                ctx.caches.addresses, ADDRESSES, address_raw, {"metadata": {"finalizers": finalizers}}
            )
        await ctx.kube.delete(ADDRESSES, meta["name"], meta["namespace"], uid=meta.get("uid"))
    except ApiError as error:
        if not error.not_found:
            raise
        return []
    if finalizers:
        return finalizers
    ctx.caches.addresses.remove((meta["namespace"], meta["name"]))
    return []
