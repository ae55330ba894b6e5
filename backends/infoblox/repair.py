"""The Infoblox backend's repair capability (`ipam_provider.backend.repair.Repairable`), read from the grid itself.

Contract:
- `list_holdings`: the fixed addresses and host records of all three types in the pool's network view whose
  CAPI-Pool names the pool and that carry CAPI-Claim-UID (not the gateway reservation), one paged search per type
  with `pacer.wait()` before every page; any failure raises BackendError, never a partial list. An object stamped
  with another management cluster's CAPI-Cluster-Identity is not listed; one without any is not `releasable`.
- `release_holding` deletes only a `releasable` holding that a fresh search on its CAPI-Claim-UID still answers
  unchanged (`_ref`, address, CAPI-Pool, uid, our stamp); anything else, or a 404 on the DELETE, answers False.
- `restore` searches the address afresh, never trusting the pool index: the claim's object -> HELD; an address the
  pool cannot hand out -> OUTSIDE; ours under an earlier uid -> re-keyed, RECORDED; any other object -> TAKEN;
  nothing -> posted literally and kept only if alone at its check -> RECORDED (else deleted, TAKEN).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import structlog

from backends.infoblox.allocator import Allocator
from backends.infoblox.client import Failure, WapiError
from backends.infoblox.ledger import (
    ALL_TYPES,
    RETURN_FIELDS,
    WHY_UNSTAMPED,
    Allocating,
    GridObject,
    Ledger,
    canonical,
    parse_object,
    same,
    type_of_ref,
)
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import ANNOTATION_HOSTNAME, EA_CLAIM_NAME, EA_CLAIM_NAMESPACE, EA_POOL
from ipam_provider.backend.contract import Allocation, AllocationFailedError, BackendError, ClaimContext, PoolRef
from ipam_provider.backend.repair import Holding, Made, Pacer, Restore, RestoreOutcome
from ipam_provider.common import Object

log = structlog.get_logger(__name__)


class GridRepair:
    """The repair capability, composed from the ledger (listing, releasing) and the allocator (restoring)."""

    def __init__(self, ledger: Ledger, allocator: Allocator, settings: InfobloxSettings) -> None:
        self._ledger = ledger
        self._allocator = allocator
        self._page_size = settings.repair_page_size

    async def list_holdings(self, pool_ref: PoolRef, pool: Object, pacer: Pacer) -> Sequence[Holding]:
        parsed, connection = await self._ledger.pool_connection(pool_ref, pool)
        holdings: list[Holding] = []
        others = 0  # objects of another management cluster sharing the grid: never ours to judge
        query, eas, page = {"network_view": connection.network_view(parsed)}, {EA_POOL: parsed.label}, self._page_size
        for obj_type in ALL_TYPES:
            try:
                answer = await connection.client.search(
                    obj_type, RETURN_FIELDS[obj_type], query, eas, page_size=page, before_page=pacer.wait
                )
            except WapiError as error:
                if error.failure is Failure.UNKNOWN_EA:  # the attribute is not even defined: nothing carries it
                    return []
                raise await self._ledger.grid.translate(connection, error, f"listing {pool_ref}") from error
            for obj in (parse_object(obj_type, raw) for raw in answer):
                if obj is None or not obj.claim_uid or obj.extattrs.get(EA_POOL) != parsed.label:
                    continue
                made = self._ledger.stamp.judge(obj)
                if made is Made.OTHER:
                    others += 1
                else:
                    holdings.append(holding_of(obj, releasable=made is Made.OURS))
        log.debug("holdings listed", pool=str(pool_ref), holdings=len(holdings), other_clusters=others)
        return holdings

    async def release_holding(self, pool_ref: PoolRef, pool: Object, holding: Holding) -> bool:
        obj_type = type_of_ref(holding.handle)
        if not holding.releasable or not holding.claim_uid or obj_type not in ALL_TYPES:
            return False
        parsed, connection = await self._ledger.pool_connection(pool_ref, pool)
        bound = log.bind(pool=str(pool_ref), ref=holding.handle)
        try:
            found = await self._ledger.owned(connection, (obj_type,), holding.claim_uid)
            if not any(as_listed(o, holding, parsed.label) and self._ledger.stamp.judge(o) is Made.OURS for o in found):
                bound.info("holding changed or gone; left alone")
                return False
            deleted = await self._ledger.release_leak(connection, pool_ref, holding.claim_uid, holding.handle)
        except WapiError as error:
            raise await self._ledger.grid.translate(connection, error, f"release in {pool_ref}") from error
        bound.info(
            "leaked grid object released", address=holding.address, claim=holding.claim, already_gone=not deleted
        )
        return deleted

    async def restore(self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, allocation: Allocation) -> Restore:
        parsed, connection = await self._ledger.pool_connection(pool_ref, pool)
        address = canonical(allocation.address)
        outside = parsed.why_outside(address) if address is not None else "not an IP address"
        if address is None or ipaddress.ip_address(address).version != parsed.version:
            return Restore(RestoreOutcome.OUTSIDE, outside or f"not an IPv{parsed.version} address")
        try:
            found = await self._ledger.holders(connection, parsed, address)
            if held_by(found, claim) is not None or outside is not None:
                return held_by(found, claim) or Restore(RestoreOutcome.OUTSIDE, str(outside))
            if found and not any(o.earlier_self(parsed, claim) for o in found):
                return taken(found[0])
            job = Allocating(parsed, connection, await self._ledger.index(parsed, connection), claim)
            return await self._record(job, address, found, allocation.annotations.get(ANNOTATION_HOSTNAME))
        except WapiError as error:
            raise await self._ledger.grid.translate(connection, error, f"address {address} in {pool_ref}") from error

    async def _record(self, job: Allocating, address: str, found: list[GridObject], hostname: str | None) -> Restore:
        """The claim's object at `address`: ours under an earlier uid among `found` re-keyed, else (nothing held it at
        the last search) posted; then checked alone."""
        try:
            kept = await self._allocator.take_over_or_post(job, address, found, hostname)
        except WapiError as error:
            if found or error.failure is not Failure.CONFLICT:  # only a POST's Conflict says who won
                raise
            return await self._after_losing(job, address, error.detail)
        if kept is None:
            return taken(found[0])
        if not same(kept.address, address):  # a host record of the claim's name, made earlier at another address
            return Restore(RestoreOutcome.TAKEN, f"claim {job.claim}'s host record {kept.ref} holds {kept.address}")
        try:
            await self._allocator.keep_alone(job, address, kept)
        except AllocationFailedError as error:  # `kept` shared the address and was deleted
            return await self._after_losing(job, address, error.message)
        job.log.info("allocation restored on the grid", address=address, ref=kept.ref)
        did = "re-keyed to the claim" if found else "recorded again"
        return Restore(RestoreOutcome.RECORDED, f"{kept.obj_type} {kept.ref} {did}")

    async def _after_losing(self, job: Allocating, address: str, why: str) -> Restore:
        """The claim's object could not be kept at `address`: who holds it now (HELD or TAKEN), searched again. The
        index forgets the claim, so that its own path searches the grid."""
        self._ledger.indexes.get(job.pool.ref, job.index).by_claim.pop(job.claim.uid, None)
        found = await self._ledger.holders(job.connection, job.pool, address)
        if found:
            return held_by(found, job.claim) or taken(found[0])
        raise BackendError(f"address {address} of claim {job.claim} could not be recorded again: {why}; trying again")


def held_by(found: Sequence[GridObject], claim: ClaimContext) -> Restore | None:
    mine = next((o for o in found if o.claim_uid == claim.uid), None)
    return Restore(RestoreOutcome.HELD, f"{mine.obj_type} {mine.ref}") if mine is not None else None


def taken(holder: GridObject) -> Restore:
    detail = holder.describe()
    return Restore(RestoreOutcome.TAKEN, f"{detail} ({holder.obj_type} {holder.ref})" if holder.claim_uid else detail)


def holding_of(obj: GridObject, *, releasable: bool = True) -> Holding:
    namespace, name = obj.extattrs.get(EA_CLAIM_NAMESPACE) or "", obj.extattrs.get(EA_CLAIM_NAME) or ""
    claim = f"{namespace}/{name}" if namespace and name else ""
    address = canonical(obj.address) or obj.address
    why = "" if releasable else WHY_UNSTAMPED
    return Holding(address, claim, obj.claim_uid or "", obj.ref, releasable=releasable, why_kept=why)


def as_listed(obj: GridObject, holding: Holding, label: str) -> bool:
    """Whether `obj` is still exactly the listed holding."""
    return (
        obj.ref == holding.handle
        and obj.claim_uid == holding.claim_uid
        and obj.extattrs.get(EA_POOL) == label
        and same(obj.address, holding.address)
    )
