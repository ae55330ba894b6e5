"""An address a backend hands out although a live IPAddress of the pool names it for another claim (the backend
lost that claim's record). The claim path never writes such an address.

- `holder_of` answers the live cached IPAddress of the claim's pool naming the allocation's address for another
  claim, or None.
- `give_back` releases what the backend just made for this claim, then, when the backend offers the repair
  capability and the holder's claim is cached, restores the address for the holder's claim. It records a Warning
  Event on the pool and answers the error that fails this claim's attempt (retried after `RETRY_SECONDS`, for
  another address).
"""

from __future__ import annotations

import structlog
from pydantic import ValidationError

from ipam_provider.api.capi import IPAddress, IPAddressClaim
from ipam_provider.backend.contract import Allocation, AllocationFailedError
from ipam_provider.backend.repair import RestoreOutcome, repairer_of
from ipam_provider.common import Object, normalized_address
from ipam_provider.reconcile.addresses import allocation_of
from ipam_provider.reconcile.context import ClaimWork, ReconcileContext, claim_context
from ipam_provider.runtime.events import WARNING
from ipam_provider.watch.caches import POOL_ADDRESS

log = structlog.get_logger(__name__)

RETRY_SECONDS = 2.0
REASON_ADDRESS_IN_USE = "AddressStillInUse"


def holder_of(ctx: ReconcileContext, work: ClaimWork, allocation: Allocation) -> Object | None:
    """The live cached IPAddress of the claim's pool naming `allocation.address` for another claim, or None."""
    key = (work.pool_ref, normalized_address(allocation.address))
    for address in ctx.caches.addresses.by_index(POOL_ADDRESS, key):
        meta = address["metadata"]
        claim_name = ((address.get("spec") or {}).get("claimRef") or {}).get("name")
        if meta.get("deletionTimestamp"):
            continue
        if (meta.get("namespace"), claim_name) != (work.namespace, work.name):
            return address
    return None


async def give_back(
    ctx: ReconcileContext, work: ClaimWork, pool: Object, allocation: Allocation, holder: Object
) -> AllocationFailedError:
    """Release this claim's new allocation and restore it for the holder (see the module's contract)."""
    meta = holder["metadata"]
    holder_name = f"{meta.get('namespace')}/{meta.get('name')}"
    async with ctx.backend_turn(work.backend, work.pool_ref):
        await work.backend.release(work.pool_ref, pool, work.context(), allocation)
    outcome = await _restore_for_holder(ctx, work, pool, holder)
    work.log.warning(
        "backend handed out an address a live IPAddress still names; given back",
        address=allocation.address,
        holder=holder_name,
        restored=outcome,
    )
    message = (
        f"{work.pool_ref} handed {allocation.address} to claim {work.namespace}/{work.name}, but IPAddress "
        f"{holder_name} still names it (its record in the backend was lost); it was given back"
        + (" and recorded again for its claim" if outcome == RestoreOutcome.RECORDED else "")
    )
    ctx.recorder.record(pool, WARNING, REASON_ADDRESS_IN_USE, message)
    return AllocationFailedError(
        f"{allocation.address} is still used by IPAddress {holder_name}; asking {work.pool_ref} for another address",
        retry_after=RETRY_SECONDS,
    )


async def _restore_for_holder(ctx: ReconcileContext, work: ClaimWork, pool: Object, holder: Object) -> str:
    """Restore the holder's address for its claim when possible; answers the outcome, or why it was not tried."""
    repairer = repairer_of(work.backend)
    claim_name = ((holder.get("spec") or {}).get("claimRef") or {}).get("name") or ""
    claim_raw = ctx.caches.claims.get(holder["metadata"].get("namespace"), claim_name)
    if repairer is None or claim_raw is None:
        return "not tried"
    try:
        claim = IPAddressClaim.model_validate(claim_raw)
        allocation = allocation_of(IPAddress.model_validate(holder))
    except ValidationError:
        return "not tried"
    async with ctx.backend_turn(work.backend, work.pool_ref):
        answer = await repairer.restore(work.pool_ref, pool, claim_context(claim), allocation)
    return str(answer.outcome)
