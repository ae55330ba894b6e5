"""Ownership on the grid: what a claim owns, taking over what it held under an earlier uid, releasing it, and turning
WAPI failures into messages for people.

Contract:
- A claim owns exactly the fixed addresses and host records whose CAPI-Claim-UID extensible attribute is the
  claim's uid. `owned` finds them with an attribute search (`*CAPI-Claim-UID=<uid>`, one GET per object type, an
  empty answer when there are none) and checks the attribute again on every object answered.
- `release_owned` deletes what `owned` answers and nothing else. The IPAddress's ref annotation only chooses the
  object type to search; the object it names is deleted only if the search answers it too. This costs one GET and
  one DELETE per release and never deletes an object the claim does not own, even when the annotation was edited
  or the grid re-used a reference for a new object (NIOS references are derived from the object's natural key). A
  search was preferred to a GET by reference: a failing GET costs four requests in infoblox-client and cannot
  tell "gone" from "unavailable"; a search answers [] for "gone". A 404 on DELETE counts as released.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Callable, Mapping, Sequence

import structlog

from backends.infoblox.client import Problem, WapiError
from backends.infoblox.connections import Connection
from backends.infoblox.health import INSTANCE_WIDE, GridHealth
from backends.infoblox.payloads import (
    ALL_TYPES,
    FIXED_V4,
    FIXED_V6,
    HOST,
    RETURN_FIELDS,
    GridObject,
    parse_object,
    type_of_ref,
    types_for_version,
    wapi_extattrs,
)
from backends.infoblox.spec import ANNOTATION_REF, EA_CLAIM_NAME, EA_CLAIM_NAMESPACE, EA_CLAIM_UID, EA_POOL, Pool
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    BackendError,
    ClaimContext,
    PoolNotReadyError,
    PoolRef,
)

log = structlog.get_logger(__name__)


async def owned(connection: Connection, types: Sequence[str], claim_uid: str) -> list[GridObject]:
    """Every object of `types` whose CAPI-Claim-UID is `claim_uid` (one search per type)."""
    found: list[GridObject] = []
    for obj_type in types:
        try:
            answer = await connection.client.search(
                obj_type, RETURN_FIELDS[obj_type], extattrs={EA_CLAIM_UID: claim_uid}
            )
        except WapiError as error:
            if error.problem is Problem.UNKNOWN_EA:  # the attribute is not even defined: nothing carries it
                return []
            raise
        for raw in answer:
            obj = parse_object(obj_type, raw)
            if obj is not None and obj.claim_uid == claim_uid:
                found.append(obj)
    return found


async def release_owned(
    connection: Connection, pool_ref: PoolRef, claim: ClaimContext, allocation: Allocation | None
) -> list[GridObject]:
    """Delete every object the claim owns; answer them. Raises WapiError when the grid fails. The type of the
    IPAddress's ref annotation is searched first; when it finds nothing, every other type of the address's family
    is searched too (the object may have been recorded again as another type since, after the pool's mode
    changed)."""
    ref = allocation.annotations.get(ANNOTATION_REF) if allocation is not None else None
    family = types_for_version(version_of(allocation.address) if allocation is not None else None)
    first: Sequence[str] = (type_of_ref(ref),) if ref and type_of_ref(ref) in ALL_TYPES else family
    objects = await owned(connection, first, claim.uid)
    if not objects and first != family:
        objects = await owned(connection, [t for t in family if t not in first], claim.uid)
    for obj in objects:
        deleted = await connection.client.delete(obj.ref)
        log.info(
            "grid object released",
            claim=str(claim),
            pool=str(pool_ref),
            address=obj.address,
            ref=obj.ref,
            already_gone=not deleted,
        )
    if ref and ref not in {obj.ref for obj in objects}:
        log.info(
            "object named by the IPAddress is not owned by the claim (or is gone); left alone",
            claim=str(claim),
            pool=str(pool_ref),
            ref=ref,
        )
    return objects


class LateCommits:
    """Removes the object a timed-out or lost POST may still create after the claim was served by a second POST.

    `watch` is called when a POST's outcome was unknown, a search found nothing, and the POST was sent again. Twice
    (after `delays`) it searches the claim's objects of `kept`'s type and deletes those other than `kept` (the one
    the claim was given), as long as the claim holds `kept` or has been released (`holds` answers the refs the
    pool's index lists for the claim). Failures are logged; release deletes every owned object anyway.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def watch(
        self,
        connection: Connection,
        claim: ClaimContext,
        kept: GridObject,
        holds: Callable[[], set[str]],
        delays: Sequence[float],
    ) -> None:
        keep_ref = kept.ref

        async def check() -> None:
            for delay in delays:
                await asyncio.sleep(delay)
                held = holds()
                if held and keep_ref not in held:
                    return  # the claim holds something else now: allocation sorts it out
                try:
                    for obj in await owned(connection, (kept.obj_type,), claim.uid):
                        if obj.ref != keep_ref:
                            await connection.client.delete(obj.ref)
                            log.info("late object of a lost request released", claim=str(claim), ref=obj.ref)
                except WapiError as error:
                    log.info("cannot look for a late object", claim=str(claim), detail=error.detail)

        task = asyncio.create_task(check())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def translate(grid: GridHealth, connection: Connection, error: WapiError, what: str) -> BackendError:
    """A BackendError for people; instance-wide failures also go to the instance's condition."""
    if error.problem in INSTANCE_WIDE:
        health = await grid.failed(connection, error)
        return PoolNotReadyError(f"InfobloxInstance {connection.name}: {health.message}")
    if error.problem is Problem.VIEW_NOT_FOUND:
        return PoolNotReadyError(view_missing(error.detail, what))
    if error.problem is Problem.TARGET_NOT_FOUND:
        return PoolNotReadyError(f"{what}: {error.detail}; create it on the grid or fix the pool's spec")
    if error.problem is Problem.UNKNOWN_EA:
        return PoolNotReadyError(f"{error.detail}: define it on the grid or remove it from spec.extensibleAttributes")
    if error.problem is Problem.EA_NOT_ALLOWED:
        return PoolNotReadyError(
            f"{what}: the grid refused an extensible attribute the pool writes: {error.detail}; allow the object "
            "type in the attribute definition's allowed_object_types, or remove the attribute from "
            "spec.extensibleAttributes if it is the pool's own"
        )
    if error.problem in (Problem.UNAVAILABLE, Problem.UNKNOWN_OUTCOME):
        return AllocationFailedError(f"the grid did not answer ({error.detail}); retrying", retry_after=5.0)
    return AllocationFailedError(f"{what}: the grid refused: {error.detail}")


def view_missing(detail: str, what: str) -> str:
    """The message of a 404 on a view (`View <name> not found` or `Network view <name> not found`)."""
    if detail.startswith("Network view"):
        kind, fix = "network view", "spec.networkView or the InfobloxInstance's defaultNetworkView"
    else:
        kind, fix = "DNS view", "spec.hostRecord.dnsView or the InfobloxInstance's defaultDNSView"
    found = f"the grid answered {detail!r}"
    return f"{what}: the pool's {kind} does not exist on the grid ({found}); create it or fix {fix}"


def same(a: str, b: str) -> bool:
    """Whether two address strings name one address."""
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a == b


def version_of(address: str) -> int | None:
    try:
        return ipaddress.ip_address(address).version
    except ValueError:
        return None


async def take_over(
    connection: Connection, pool: Pool, claim: ClaimContext, view: str, address: str, stamp: Mapping[str, str]
) -> GridObject | None:
    """The object of ours at `address` that this claim's namespace and name held from this pool under another
    uid (a `clusterctl move` or a restore gives the claim a new uid), re-keyed to the claim and stamped with
    `stamp` (this management cluster's identity, when the grid defines it; one PUT of its extensible attributes);
    None if there is none. An object recorded for another claim is never taken."""
    fixed = FIXED_V4 if pool.version == 4 else FIXED_V6
    field_name = "ipv4addr" if pool.version == 4 else "ipv6addr"
    found = [
        (fixed, raw)
        for raw in await connection.client.search(
            fixed, RETURN_FIELDS[fixed], {field_name: address, "network_view": view}
        )
    ]
    found += [(HOST, raw) for raw in await connection.client.search(HOST, RETURN_FIELDS[HOST], {field_name: address})]
    for obj_type, raw in found:
        obj = parse_object(obj_type, raw)
        if obj is None or not same(obj.address, address) or not obj.claim_uid or obj.claim_uid == claim.uid:
            continue
        marks = obj.extattrs
        recorded = (marks.get(EA_CLAIM_NAMESPACE), marks.get(EA_CLAIM_NAME), marks.get(EA_POOL))
        if recorded != (claim.namespace, claim.name, pool.label):
            continue
        extattrs = {**marks, **stamp, EA_CLAIM_UID: claim.uid}
        await connection.client.update(obj.ref, {"extattrs": wapi_extattrs(extattrs)})
        log.info(
            "grid object re-keyed to the claim's new UID",
            claim=str(claim),
            pool=str(pool.ref),
            ref=obj.ref,
            previous_uid=obj.claim_uid,
        )
        return GridObject(obj.ref, obj.obj_type, obj.address, extattrs, obj.name, obj.comment)
    return None
