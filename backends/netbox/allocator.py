"""Allocating and releasing NetBox IP addresses for claims, with at most one NetBox request per allocation.

Contract (calls for one pool are serialised by the reconciler; the state here is per pool):
- A new claim costs ONE request: `POST …/available-ips/` on the first source with room, carrying the owner tag and
  the claim's UID in the unique custom field. A 409 moves on to the next source (keyed on the status code); a
  source that answered 409 is tried last for `full_skip_seconds` (or until this pool releases an address), so a
  full first source does not cost a request per allocation. Every source full → PoolExhaustedError.
- Nothing is allocated twice for a claim: the UID field is unique, so NetBox refuses a second address for the same
  claim (400). A POST whose outcome is unknown (timeout, lost connection, 5xx) is never re-sent blindly: the claim
  is looked up by UID (`cf_<field>=<uid>`) at once, and the next POST comes only after a retry delay. A 400 is
  also resolved by the lookup (it may be the uniqueness refusal after a crash: the address made before the crash
  is used).
  Should the field lack `unique`, every new claim is looked up before its POST (two requests), and a claim whose
  POST had an unknown outcome is not POSTed again for `uncertain_seconds` (the lost POST may still be carried out
  later; without Unique nothing else would stop a second address).
- The gateway is never handed out: an address NetBox gives us (or the lookup finds for a new claim) that is its
  source's gateway is deleted (it is ours, just made) and the pool reports GatewayNotRecorded; an IPAddress that
  names its source's gateway is refused.
- An already fulfilled claim costs nothing: `existing` whose annotations name a NetBox id and this claim's UID is
  trusted as is. Without them (an adopted IPAddress, a restore that changed UIDs), the claim is made to hold
  exactly `existing`'s address in NetBox: verified by id, found by UID, or recorded anew; it is never taken from
  another claim or from an address we did not create. Re-keying an address to a new claim UID (after a restore
  or clusterctl move) happens only when the address records the same claim namespace/name (custom field
  capi_claim_ref): an annotation copied onto another claim's IPAddress can neither steal nor free an address.
- Every address made, and every address re-keyed, carries this management cluster's identity (`cluster_identity`,
  custom field capi_cluster_identity) when the backend has one: a re-keyed address belongs to the cluster that
  adopted it.
- Release deletes by id after checking both ownership marks for this claim's UID (or for the annotation's UID
  when the address records this claim's namespace/name); without an id, or when the id is gone (404: released, or
  re-recorded under a new id by the repair loop), it deletes what the UID lookup finds with both marks. With
  `sweep` (a UID field without Unique, or an unknown outcome) it also deletes whatever else the UID lookup finds.
  An address without our marks is never deleted.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from backends.netbox import calls, problems, requested
from backends.netbox.client import HTTPError, NetboxClient, OutcomeUnknownError
from backends.netbox.problems import Problem
from backends.netbox.records import (
    address_body,
    allocation_of,
    claim_ref,
    claim_ref_of,
    host_of,
    identity_fields,
    is_ours,
    is_requested,
    requested_description,
    vrf_id_of,
)
from backends.netbox.resolver import Resolved, Source
from backends.netbox.spec import (
    ANNOTATION_CLAIM_UID,
    ANNOTATION_IP_ID,
    CLAIM_REF_FIELD,
    CLAIM_UID_FIELD,
    Pool,
)
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    ClaimContext,
    PoolExhaustedError,
    PoolRef,
    requested_address_held,
    requested_address_outside,
)
from ipam_provider.common import Object, normalized_address

log = structlog.get_logger(__name__)


@dataclass
class PoolState:
    """What the allocator remembers about one pool between calls."""

    full_since: dict[int, float] = field(default_factory=dict)  # source id → when it answered 409
    verified: dict[str, tuple[int, str]] = field(default_factory=dict)  # claim uid → (NetBox id, address)
    uncertain: dict[str, float] = field(default_factory=dict)  # claim uid → when its POST's outcome became unknown


class Allocator:
    def __init__(
        self,
        full_skip_seconds: float = 30.0,
        unknown_retry_seconds: float = 2.0,
        uncertain_seconds: float = 120.0,
        cluster_identity: str = "",
    ) -> None:
        self.cluster_identity = cluster_identity  # "" (unknown): nothing is stamped
        self.full_skip_seconds = full_skip_seconds
        self.unknown_retry_seconds = unknown_retry_seconds
        self.uncertain_seconds = uncertain_seconds
        self._states: dict[PoolRef, PoolState] = {}

    def state(self, ref: PoolRef) -> PoolState:
        return self._states.setdefault(ref, PoolState())

    def trusted(self, ref: PoolRef, claim: ClaimContext, existing: Allocation) -> bool:
        """Whether `existing` is known to be this claim's NetBox address without asking NetBox."""
        annotations = existing.annotations
        if annotations.get(ANNOTATION_CLAIM_UID) == claim.uid and (annotations.get(ANNOTATION_IP_ID) or "").isdigit():
            return True
        held = self.state(ref).verified.get(claim.uid)
        return held is not None and held[1] == normalized_address(existing.address)

    # --- new allocations ------------------------------------------------------------------------------------------

    async def allocate(self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext) -> Allocation:
        state = self.state(pool.ref)
        if claim.uid in state.uncertain or not resolved.ownership.uid_unique:
            held = await self._held_before_asking(client, pool, resolved, claim)
            if held is not None:
                return await self._hand_out(client, pool, state, claim, held)
        body = address_body(pool, resolved, claim, self.cluster_identity)
        full: list[Source] = []
        for source in self._order(state, resolved.sources):
            try:
                created = await client.call(
                    f"allocate from {source.ref}", calls.allocate(source.type, source.id, body), idempotent=False
                )
            except HTTPError as error:
                if error.conflict:
                    state.full_since[source.id] = time.monotonic()
                    full.append(source)
                    continue
                if error.not_found:
                    raise Problem(
                        problems.SOURCE_NOT_FOUND,
                        f"{pool.ref}: {source.ref} no longer exists in NetBox; create it or fix the pool's sources",
                    ) from error
                if error.invalid:  # perhaps NetBox refusing a second address for this claim's UID
                    held = await self._held(client, pool, resolved, claim)
                    if held is not None:
                        return await self._hand_out(client, pool, state, claim, held)
                    raise AllocationFailedError(
                        f"NetBox refused the address for claim {claim}: {error.message}; fix the pool's "
                        "spec.addressFields"
                    ) from error
                raise
            except OutcomeUnknownError as error:
                state.uncertain[claim.uid] = time.monotonic()
                held = await self._held(client, pool, resolved, claim)
                if held is not None:
                    return await self._hand_out(client, pool, state, claim, held)
                if resolved.ownership.uid_unique:
                    state.uncertain.pop(claim.uid, None)
                raise AllocationFailedError(
                    f"{error.message}; NetBox holds no address for claim {claim}, so it is asked again",
                    retry_after=self.unknown_retry_seconds,
                ) from error
            state.full_since.pop(source.id, None)
            return await self._hand_out(client, pool, state, claim, allocation_of(resolved, created, claim.uid, source))
        names = ", ".join(f"{s.ref} ({s.display})" for s in full)
        raise PoolExhaustedError(
            f"{pool.ref}: every NetBox source is full: {names}; free addresses in NetBox or add a source to the pool"
        )

    async def _held_before_asking(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext
    ) -> Allocation | None:
        """For a claim whose last POST had an unknown outcome, or when the UID field is not Unique: the address
        NetBox already holds for it, else None once it may be asked for one (AllocationFailedError while not)."""
        state = self.state(pool.ref)
        held = await self._held(client, pool, resolved, claim)
        if held is not None:
            return held
        since = state.uncertain.get(claim.uid)
        waiting = since is not None and time.monotonic() - since < self.uncertain_seconds
        if waiting and not resolved.ownership.uid_unique:
            raise AllocationFailedError(
                f"the last allocation for claim {claim} had an unknown outcome and NetBox's custom field "
                f"{CLAIM_UID_FIELD} is not Unique, so it is not asked again before the lost request shows "
                f"up or {self.uncertain_seconds:g} s pass; tick Unique on the field in NetBox",
                retry_after=self.unknown_retry_seconds,
            )
        state.uncertain.pop(claim.uid, None)  # with Unique, NetBox itself refuses a second address
        return None

    def _order(self, state: PoolState, sources: Sequence[Source]) -> list[Source]:
        """Sources in spec order, those that recently answered 409 last."""
        now = time.monotonic()
        skipped = {i for i, t in state.full_since.items() if now - t < self.full_skip_seconds}
        return [s for s in sources if s.id not in skipped] + [s for s in sources if s.id in skipped]

    async def _held(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext
    ) -> Allocation | None:
        """The address NetBox holds for the claim (by UID), deleting any duplicate; None if it holds none."""
        found = await self._claim_addresses(client, claim.uid)
        if not found:
            return None
        keep = min(found, key=lambda o: int(o["id"]))
        await self._delete_extra(client, pool.ref, claim, found, keep)
        source = resolved.source_of(host_of(keep))
        checkable = source is not None and vrf_id_of(keep) == source.vrf_id
        if is_requested(keep) and source is not None and checkable:  # its check may never have run (a crash)
            try:
                await requested.keep_if_alone(client, pool, claim, host_of(keep), source, keep)
            except AllocationFailedError as error:
                raise AllocationFailedError(
                    f"NetBox IP address #{keep['id']}, made for claim {claim} at a requested address, shares that "
                    f"address ({error.message}); it was deleted, and an address is asked again",
                    retry_after=self.unknown_retry_seconds,
                ) from error
        log.info(
            "address found by claim UID",
            claim=str(claim),
            pool=str(pool.ref),
            address=str(keep["address"]),
            id=keep["id"],
        )
        return allocation_of(resolved, keep, claim.uid)

    async def _claim_addresses(self, client: NetboxClient, uid: str) -> list[Object]:
        found = await client.call(f"look up claim {uid}", calls.find_claim_addresses(uid))
        return [o for o in found if is_ours(o, uid)]

    async def _delete_extra(
        self, client: NetboxClient, ref: PoolRef, claim: ClaimContext, found: Sequence[Object], keep: Mapping[str, Any]
    ) -> None:
        """Delete the claim's other addresses (duplicates or leftovers; each carries both of our marks)."""
        for other in found:
            if other["id"] != keep["id"] and is_ours(other, claim.uid):
                await client.call(f"delete address #{other['id']}", calls.delete_address(int(other["id"])))
                log.warning(
                    "extra address of claim deleted", claim=str(claim), pool=str(ref), address=str(other["address"])
                )

    async def _hand_out(
        self, client: NetboxClient, pool: Pool, state: PoolState, claim: ClaimContext, allocation: Allocation
    ) -> Allocation:
        """`allocation` for the claim, unless it is its source's gateway: then the NetBox address (ours, made for
        this claim, never handed out) is deleted and the pool is not ready."""
        state.uncertain.pop(claim.uid, None)
        if allocation.gateway is None or normalized_address(allocation.address) != normalized_address(
            allocation.gateway
        ):
            return self._remember(state, claim, allocation)
        address_id = int(allocation.annotations[ANNOTATION_IP_ID])
        await client.call(f"delete address #{address_id}", calls.delete_address(address_id))
        log.warning("netbox gave out the gateway; deleted", claim=str(claim), pool=str(pool.ref), id=address_id)
        raise Problem(
            problems.GATEWAY_NOT_RECORDED,
            f"{pool.ref}: NetBox handed out {allocation.address}, the gateway, for claim {claim}; it was deleted "
            "again. Record the gateway as an IP address in NetBox (IPAM → IP Addresses, in the source's VRF) so "
            "that NetBox never offers it",
        )

    def _remember(self, state: PoolState, claim: ClaimContext, allocation: Allocation) -> Allocation:
        state.verified[claim.uid] = (
            int(allocation.annotations[ANNOTATION_IP_ID]),
            normalized_address(allocation.address),
        )
        return allocation

    # --- an IPAddress that already exists -------------------------------------------------------------------------

    async def hold_existing(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext, existing: Allocation
    ) -> Allocation:
        """Make the claim hold exactly `existing.address` in NetBox (see the module contract)."""
        state = self.state(pool.ref)
        address = normalized_address(existing.address)
        source = resolved.source_of(address)
        if source is not None and source.ref.gateway is not None and normalized_address(source.ref.gateway) == address:
            raise AllocationFailedError(
                f"IPAddress {claim} names {address}, the gateway of {pool.ref}'s source {source.display}; a gateway "
                "is never a machine's address: delete the IPAddress"
            )
        raw_id = existing.annotations.get(ANNOTATION_IP_ID) or ""
        if raw_id.isdigit():
            obj = await client.call(f"GET address #{raw_id}", calls.get_address(int(raw_id)))
            if obj is not None and is_ours(obj) and host_of(obj) == address:
                if (obj.get("custom_fields") or {}).get(CLAIM_UID_FIELD) != claim.uid:
                    await self._rekey(client, pool, claim, obj)
                return self._remember(state, claim, _with_marks(existing, int(raw_id), claim.uid))
        found = await self._claim_addresses(client, claim.uid)
        match = next((o for o in found if host_of(o) == address), None)
        if match is None:
            match = await self._record(client, pool, resolved, claim, address)
        await self._delete_extra(client, pool.ref, claim, found, match)
        return self._remember(state, claim, _with_marks(existing, int(match["id"]), claim.uid))

    async def _rekey(self, client: NetboxClient, pool: Pool, claim: ClaimContext, obj: Mapping[str, Any]) -> None:
        """Give our address `obj` this claim's UID and this management cluster's identity, if it records this
        claim's namespace/name (else refuse)."""
        recorded = claim_ref_of(obj)
        if recorded != claim_ref(claim):
            owner = (obj.get("custom_fields") or {}).get(CLAIM_UID_FIELD)
            held_for = f"claim {recorded}" if recorded else f"a claim whose name is not recorded ({CLAIM_REF_FIELD})"
            raise AllocationFailedError(
                f"the IPAddress of claim {claim} names NetBox IP address #{obj['id']}, which is held for {held_for} "
                f"(UID {owner}); it is not taken over. Delete this IPAddress, or, if that address really belongs to "
                f"this claim (a restore), set its custom field {CLAIM_REF_FIELD} to {claim_ref(claim)!r} in NetBox"
            )
        changes = {"custom_fields": {CLAIM_UID_FIELD: claim.uid, **identity_fields(self.cluster_identity)}}
        await client.call(f"re-key address #{obj['id']}", calls.patch_address(int(obj["id"]), changes))
        log.info("address re-keyed to the claim's new UID", claim=str(claim), pool=str(pool.ref), id=obj["id"])

    async def _record(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext, address: str
    ) -> Object:
        source = resolved.source_of(address)
        if source is None:
            raise AllocationFailedError(
                f"IPAddress {claim} names {address}, which lies in none of {pool.ref}'s NetBox sources; delete the "
                "IPAddress or point the claim at the right pool"
            )
        holders = await client.call(f"look up {address}", calls.find_address(address, source.vrf_id))
        if holders:
            holder = holders[0]
            owner = (holder.get("custom_fields") or {}).get(CLAIM_UID_FIELD)
            whose = f"claim UID {owner}" if is_ours(holder) else "nobody this provider knows"
            raise AllocationFailedError(
                f"address {address} of IPAddress {claim} is already NetBox IP address #{holder['id']} (held for "
                f"{whose}); delete one of them"
            )
        body = {
            **address_body(pool, resolved, claim, self.cluster_identity),
            "address": f"{address}/{source.mask}",
            "vrf": source.vrf_id,
        }
        created: Object = await client.call(
            f"record {address}", calls.create("ipam", "ip_addresses", body), idempotent=False
        )
        log.info("existing address recorded in NetBox", claim=str(claim), pool=str(pool.ref), address=address)
        return created

    # --- release --------------------------------------------------------------------------------------------------

    async def release(
        self, client: NetboxClient, ref: PoolRef, claim: ClaimContext, allocation: Allocation | None, *, sweep: bool
    ) -> None:
        """Delete the claim's NetBox address if it carries our marks (see the module contract)."""
        state = self.state(ref)
        state.verified.pop(claim.uid, None)
        sweep = state.uncertain.pop(claim.uid, None) is not None or sweep
        state.full_since.clear()  # room was made: try the sources in order again
        annotations = allocation.annotations if allocation is not None else {}
        raw_id = annotations.get(ANNOTATION_IP_ID) or ""
        if raw_id.isdigit():
            recorded_uid = annotations.get(ANNOTATION_CLAIM_UID)
            obj = await client.call(f"GET address #{raw_id}", calls.get_address(int(raw_id)))  # None: by UID below
            restored = is_ours(obj or {}, recorded_uid) and claim_ref_of(obj or {}) == claim_ref(claim)
            if obj is not None and (is_ours(obj, claim.uid) or restored):
                await client.call(f"delete address #{raw_id}", calls.delete_address(int(raw_id)))
                log.info("address released", claim=str(claim), pool=str(ref), address=str(obj["address"]))
                if not sweep:
                    return
            elif obj is not None:
                log.warning(
                    "address lacks our ownership marks; not deleted", claim=str(claim), pool=str(ref), id=raw_id
                )
        for obj in await self._claim_addresses(client, claim.uid):
            await client.call(f"delete address #{obj['id']}", calls.delete_address(int(obj["id"])))
            log.info("address released", claim=str(claim), pool=str(ref), address=str(obj["address"]))

    def forget(self, ref: PoolRef) -> None:
        self._states.pop(ref, None)

    async def allocate_requested(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext, address: str
    ) -> Allocation:
        """The claim's requested `address`, held in NetBox (see `requested`'s contract)."""
        source, why = requested.source_for(resolved, address)
        if source is None:
            raise AllocationFailedError(requested_address_outside(address, pool.ref, why))
        if source.type == "prefix":
            populated = await requested.populated_range(client, address, source)
            if populated:
                raise AllocationFailedError(
                    requested_address_outside(address, pool.ref, requested.populated_why(populated, source))
                )
        found = await client.call(f"look up claim {claim}", calls.find_claim_addresses(claim.uid))
        mine = [o for o in found if is_ours(o, claim.uid)]
        here = [o for o in mine if host_of(o) == address and vrf_id_of(o) == source.vrf_id]  # another VRF's: a stray
        kept = min(here, key=lambda o: int(o["id"]), default=None)
        for other in mine:
            if kept is None or other["id"] != kept["id"]:
                await client.call(f"delete address #{other['id']}", calls.delete_address(int(other["id"])))
                log.info(
                    "claim's other address deleted", claim=str(claim), pool=str(pool.ref), address=other["address"]
                )
        if kept is None:
            holders = await requested.holders_at(client, address, source)
            earlier = next((o for o in holders if is_ours(o) and claim_ref_of(o) == claim_ref(claim)), None)
            if earlier is not None:  # this claim's, under its UID before a restore or a move: re-keyed, then checked
                await self._rekey(client, pool, claim, earlier)
                kept = earlier
            elif holders:
                raise AllocationFailedError(requested_address_held(address, pool.ref, requested.describe(holders[0])))
            else:
                kept = await self._create_requested(client, pool, resolved, claim, address, source)
        await requested.keep_if_alone(client, pool, claim, address, source, kept)
        self.state(pool.ref).uncertain.pop(claim.uid, None)
        allocation = allocation_of(resolved, kept, claim.uid, source)
        self.state(pool.ref).verified[claim.uid] = (int(kept["id"]), address)
        log.info("requested address held", claim=str(claim), pool=str(pool.ref), address=address, id=kept["id"])
        return allocation

    async def _create_requested(
        self,
        client: NetboxClient,
        pool: Pool,
        resolved: Resolved,
        claim: ClaimContext,
        address: str,
        source: Source,
    ) -> Object:
        """POST the address for the claim; a refusal or a lost answer is resolved by looking again."""
        body = {
            **address_body(pool, resolved, claim, self.cluster_identity),
            "address": f"{address}/{source.mask}",
            "vrf": source.vrf_id,
        }
        body["description"] = requested_description(str(body["description"]))
        try:
            created: Object = await client.call(
                f"record {address}", calls.create("ipam", "ip_addresses", body), idempotent=False
            )
            return created
        except HTTPError as error:
            if not error.invalid:
                raise
            # NetBox's own duplicate check, or our UID taken
            holders = await requested.holders_at(client, address, source)
            found = requested.ours_among(holders, claim.uid)
            if found is not None:
                return found
            if holders:
                raise AllocationFailedError(
                    requested_address_held(address, pool.ref, requested.describe(holders[0]))
                ) from error
            raise AllocationFailedError(
                f"NetBox refused the requested address {address} for claim {claim}: {error.message}; fix the pool's "
                "spec.addressFields"
            ) from error
        except OutcomeUnknownError as error:
            holders = await requested.holders_at(client, address, source)
            found = requested.ours_among(holders, claim.uid)
            if found is not None:
                return found
            raise AllocationFailedError(
                f"{error.message}; NetBox holds no address for claim {claim}, so it is asked again",
                retry_after=self.unknown_retry_seconds,
            ) from error

    async def record_alone(
        self,
        client: NetboxClient,
        pool: Pool,
        resolved: Resolved,
        claim: ClaimContext,
        address: str,
        source: Source,
    ) -> Object:
        """Create `address` for the claim (as for a requested address) and keep it only if it is alone there (see
        `keep_if_alone`); AllocationFailedError when another object holds it or NetBox refuses it."""
        created = await self._create_requested(client, pool, resolved, claim, address, source)
        await requested.keep_if_alone(client, pool, claim, address, source, created)
        return created


def _with_marks(existing: Allocation, address_id: int, uid: str) -> Allocation:
    annotations = {**existing.annotations, ANNOTATION_IP_ID: str(address_id), ANNOTATION_CLAIM_UID: uid}
    return Allocation(existing.address, existing.prefix, existing.gateway, annotations)
