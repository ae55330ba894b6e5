"""Dynamic, requested and adopted allocation of NetBox IP addresses for claims, and their release (the rules, their
reasons and request costs: docs/netbox.md, "Allocation…" and "Requested addresses").

Contract (calls for one pool are serialised by the reconciler); no address is ever handed out twice:
- Dynamic (`allocate`): one `POST …/available-ips/` on the first source with room (409: the next source; that one is
  tried last for `full_skip_seconds`, or until this pool deletes an address; all full: PoolExhaustedError). A POST
  with an unknown outcome is never re-sent blindly: the claim is looked up by UID at once (as after a 400: the
  Unique UID field refusing a second address), and asked again after `unknown_retry_seconds`. Without Unique, every
  new claim is looked up first, and not POSTed again for `uncertain_seconds` after an unknown outcome. An address
  that is its source's gateway is deleted again (ours, just made): GatewayNotRecorded.
- Requested (`allocate_requested`): only an address a source of the pool could hand out (`resolver.offered_by`),
  else `requested_address_outside` with nothing written. The claim's own address there is adopted and its others
  deleted; ours under the claim's older UID is re-keyed; anything else there: `requested_address_held`; else it is
  created. Whatever is made or adopted is kept only if alone at its last listing (`keep_if_alone`).
- Adopted (`hold_existing`): the IPAddress's address, verified by id, found by UID or recorded anew; never taken
  from another claim or from an address we did not create, never a source's gateway.
- Re-keying to a new claim UID happens only for an address recording the same claim namespace/name. Every address
  made or re-keyed carries this management cluster's identity, when known.
- `release` deletes only addresses carrying both marks for this claim: by id (this claim's UID, or the annotation's
  UID on an address recording this claim's namespace/name), else what the UID lookup finds (with `sweep`: all of it,
  even after a deletion by id).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from backends.backoff import CONTENDED_WAIT_SECONDS, race_retry_seconds
from backends.netbox import calls, reasons
from backends.netbox.client import HTTPError, NetboxClient, NetboxError, OutcomeUnknownError
from backends.netbox.ledger import (
    REQUESTED_MARK,
    Ledger,
    allocation_of,
    claim_ref,
    claim_ref_of,
    host_of,
    is_ours,
    uid_of,
)
from backends.netbox.reasons import PoolUnusableError
from backends.netbox.resolver import Resolved, Source, offered_by, vrf_id_of
from backends.netbox.spec import ANNOTATION_CLAIM_UID, ANNOTATION_IP_ID, CLAIM_UID_FIELD, Pool
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


class Allocator:
    """Allocates and releases claims' addresses in NetBox through the `ledger` (see the module contract)."""

    def __init__(
        self, ledger: Ledger, full_skip_seconds: float, unknown_retry_seconds: float, uncertain_seconds: float
    ) -> None:
        self.ledger = ledger
        self.full_skip_seconds = full_skip_seconds
        self.unknown_retry_seconds = unknown_retry_seconds
        self.uncertain_seconds = uncertain_seconds

    async def allocate(self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext) -> Allocation:
        index = self.ledger.index(pool.ref)
        if claim.uid in index.uncertain or not resolved.ownership.uid_unique:
            # The last POST had an unknown outcome, or no Unique UID field: what NetBox holds for the claim first.
            held = await self._held(client, pool, resolved, claim)
            if held is not None:
                return held
            since = index.uncertain.get(claim.uid)
            waiting = since is not None and time.monotonic() - since < self.uncertain_seconds
            if waiting and not resolved.ownership.uid_unique:
                raise AllocationFailedError(
                    f"the last allocation for claim {claim} had an unknown outcome and NetBox's custom field "
                    f"{CLAIM_UID_FIELD} is not Unique, so it is not asked again before the lost request shows "
                    f"up or {self.uncertain_seconds:g} s pass; tick Unique on the field in NetBox",
                    retry_after=self.unknown_retry_seconds,
                )
            index.uncertain.pop(claim.uid, None)  # with Unique, NetBox itself refuses a second address
        body = self.ledger.body(pool, resolved, claim)
        full: list[Source] = []
        for source in self._order(index.exhausted, resolved.sources):
            try:
                what = f"allocate from {source.ref}"
                created = await client.call(what, calls.allocate(source.ref.type, source.id, body), idempotent=False)
            except HTTPError as error:
                if error.status == 404:
                    raise PoolUnusableError(
                        reasons.SOURCE_NOT_FOUND,
                        f"{pool.ref}: {source.ref} no longer exists in NetBox; create it or fix the pool's sources",
                    ) from error
                if error.status != 409:  # 409: the source is full
                    return await self._after_failed_post(client, pool, resolved, claim, error)
                index.exhausted[source.id] = time.monotonic()
                full.append(source)
                continue
            except OutcomeUnknownError as error:
                index.uncertain[claim.uid] = time.monotonic()
                return await self._after_failed_post(client, pool, resolved, claim, error)
            index.exhausted.pop(source.id, None)
            return await self._hand_out(client, pool, claim, allocation_of(resolved, created, claim.uid, source))
        names = ", ".join(f"{s.ref} ({s.display})" for s in full)
        raise PoolExhaustedError(
            f"{pool.ref}: every NetBox source is full: {names}; free addresses in NetBox or add a source to the pool"
        )

    async def _after_failed_post(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext, error: NetboxError
    ) -> Allocation:
        """What an allocating POST that failed other than with 409 leaves: an error answer other than 400 is raised;
        after a 400 (maybe NetBox refusing a second address for this claim's UID) or an unknown outcome, the address
        NetBox holds for the claim (by UID) is handed out, else AllocationFailedError (after an unknown outcome with
        a retry delay; with Unique on the UID field, the claim is no longer uncertain)."""
        if isinstance(error, HTTPError) and not error.invalid:
            raise error
        held = await self._held(client, pool, resolved, claim)
        if held is not None:
            return held
        if isinstance(error, HTTPError):
            raise AllocationFailedError(
                f"NetBox refused the address for claim {claim}: {error.message}; fix the pool's spec.addressFields"
            ) from error
        if resolved.ownership.uid_unique:
            self.ledger.index(pool.ref).uncertain.pop(claim.uid, None)
        raise AllocationFailedError(
            f"{error.message}; NetBox holds no address for claim {claim}, so it is asked again",
            retry_after=self.unknown_retry_seconds,
        ) from error

    def _order(self, exhausted: Mapping[int, float], sources: Sequence[Source]) -> list[Source]:
        """Sources in spec order, those that recently answered 409 last."""
        now = time.monotonic()
        skipped = {i for i, t in exhausted.items() if now - t < self.full_skip_seconds}
        return [s for s in sources if s.id not in skipped] + [s for s in sources if s.id in skipped]

    async def _held(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext
    ) -> Allocation | None:
        """The address NetBox holds for the claim (by UID), deleting any duplicate, handed out; None if it has none."""
        found = await self.ledger.claim_addresses(client, claim.uid)
        if not found:
            return None
        keep = min(found, key=lambda o: int(o["id"]))
        await self._delete_others(client, pool.ref, claim, found, int(keep["id"]))
        source = resolved.source_of(host_of(keep))
        requested = str(keep.get("description") or "").endswith(REQUESTED_MARK)
        if requested and source is not None and vrf_id_of(keep) == source.vrf_id:
            try:  # made at a requested address: its keep-if-alone check may never have run (a crash)
                await self.keep_if_alone(client, pool, claim, host_of(keep), source, keep)
            except AllocationFailedError as error:
                raise AllocationFailedError(
                    f"NetBox IP address #{keep['id']}, made for claim {claim} at a requested address, shares that "
                    f"address ({error.message}); it was deleted, and an address is asked again",
                    retry_after=self.unknown_retry_seconds,
                ) from error
        log.info(
            "address found by claim UID", claim=str(claim), pool=str(pool.ref), address=keep["address"], id=keep["id"]
        )
        return await self._hand_out(client, pool, claim, allocation_of(resolved, keep, claim.uid))

    async def _delete_others(
        self, client: NetboxClient, ref: PoolRef, claim: ClaimContext, found: Sequence[Object], keep: int | None
    ) -> None:
        """Delete the claim's addresses of `found` but the one of id `keep` (duplicates or leftovers, each carrying
        both of our marks)."""
        for other in found:
            if other["id"] != keep and is_ours(other, claim.uid):
                await self.ledger.delete(client, ref, int(other["id"]), claim.uid)
                log.info("claim's other address deleted", claim=str(claim), pool=str(ref), address=other["address"])

    async def _hand_out(
        self, client: NetboxClient, pool: Pool, claim: ClaimContext, allocation: Allocation
    ) -> Allocation:
        """`allocation` for the claim, unless it is its source's gateway: then the NetBox address (ours, made for
        this claim, never handed out) is deleted and the pool is not ready."""
        address_id = int(allocation.annotations[ANNOTATION_IP_ID])
        address = normalized_address(allocation.address)
        if allocation.gateway is None or address != normalized_address(allocation.gateway):
            self.ledger.hold(pool.ref, claim.uid, address_id, address)
            return allocation
        await self.ledger.delete(client, pool.ref, address_id, claim.uid)
        log.warning("netbox gave out the gateway; deleted", claim=str(claim), pool=str(pool.ref), id=address_id)
        raise PoolUnusableError(
            reasons.GATEWAY_NOT_RECORDED,
            f"{pool.ref}: NetBox handed out {allocation.address}, the gateway, for claim {claim}; it was deleted "
            "again. Record the gateway as an IP address in NetBox (IPAM → IP Addresses, in the source's VRF) so "
            "that NetBox never offers it",
        )

    async def hold_existing(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext, existing: Allocation
    ) -> Allocation:
        """Make the claim hold exactly `existing.address` in NetBox (see the module contract)."""
        address = normalized_address(existing.address)
        source = resolved.source_of(address)
        if source is not None and source.ref.gateway is not None and normalized_address(source.ref.gateway) == address:
            raise AllocationFailedError(
                f"IPAddress {claim} names {address}, the gateway of {pool.ref}'s source {source.display}; a gateway "
                "is never a machine's address: delete the IPAddress"
            )
        raw_id = existing.annotations.get(ANNOTATION_IP_ID) or ""
        match = None
        if raw_id.isdigit():
            obj = await client.call(f"GET address #{raw_id}", calls.get("ipam", "ip_addresses", int(raw_id)))
            match = obj if obj is not None and is_ours(obj) and host_of(obj) == address else None
        if match is not None and uid_of(match) != claim.uid:
            await self.ledger.rekey(client, pool.ref, claim, match)
        if match is None:
            found = await self.ledger.claim_addresses(client, claim.uid)
            match = next((o for o in found if host_of(o) == address), None)
            if match is None:
                match = await self._record(client, pool, resolved, claim, address)
            await self._delete_others(client, pool.ref, claim, found, int(match["id"]))
        self.ledger.hold(pool.ref, claim.uid, int(match["id"]), address)
        annotations = {**existing.annotations, ANNOTATION_IP_ID: str(match["id"]), ANNOTATION_CLAIM_UID: claim.uid}
        return Allocation(existing.address, existing.prefix, existing.gateway, annotations)

    async def _record(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext, address: str
    ) -> Object:
        """Create the address of an adopted IPAddress for the claim; AllocationFailedError when it lies in no source
        or NetBox already holds it."""
        source = resolved.source_of(address)
        if source is None:
            raise AllocationFailedError(
                f"IPAddress {claim} names {address}, which lies in none of {pool.ref}'s NetBox sources; delete the "
                "IPAddress or point the claim at the right pool"
            )
        holders = await client.call(f"look up {address}", calls.find_address(address, source.vrf_id))
        if holders:
            whose = f"claim UID {uid_of(holders[0])}" if is_ours(holders[0]) else "nobody this provider knows"
            raise AllocationFailedError(
                f"address {address} of IPAddress {claim} is already NetBox IP address #{holders[0]['id']} (held for "
                f"{whose}); delete one of them"
            )
        created = await self.ledger.create(client, self.ledger.body(pool, resolved, claim), address, source)
        log.info("existing address recorded in NetBox", claim=str(claim), pool=str(pool.ref), address=address)
        return created

    async def release(
        self, client: NetboxClient, ref: PoolRef, claim: ClaimContext, allocation: Allocation | None, *, sweep: bool
    ) -> None:
        """Delete the claim's NetBox address if it carries our marks (see the module contract)."""
        bound = log.bind(claim=str(claim), pool=str(ref))
        index = self.ledger.index(ref)
        index.by_claim.pop(claim.uid, None)
        sweep = index.uncertain.pop(claim.uid, None) is not None or sweep
        index.exhausted.clear()  # room was made: try the sources in order again
        annotations = allocation.annotations if allocation is not None else {}
        raw_id = annotations.get(ANNOTATION_IP_ID) or ""
        if raw_id.isdigit():
            obj = await client.call(f"GET address #{raw_id}", calls.get("ipam", "ip_addresses", int(raw_id)))
            same_claim = obj is not None and claim_ref_of(obj) == claim_ref(claim)  # under the annotation's UID
            restored = same_claim and is_ours(obj or {}, annotations.get(ANNOTATION_CLAIM_UID))
            if obj is not None and (is_ours(obj, claim.uid) or restored):
                await self.ledger.delete(client, ref, int(raw_id), claim.uid)
                bound.info("address released", address=str(obj["address"]))
                if not sweep:
                    return
            elif obj is not None:
                bound.warning("address lacks our ownership marks; not deleted", id=raw_id)
        for obj in await self.ledger.claim_addresses(client, claim.uid):
            await self.ledger.delete(client, ref, int(obj["id"]), claim.uid)
            bound.info("address released", address=str(obj["address"]))

    async def allocate_requested(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext, address: str
    ) -> Allocation:
        """The claim's requested `address`, held in NetBox (see the module contract)."""
        source, why = await offered_by(client, resolved, address)
        if source is None:
            raise AllocationFailedError(requested_address_outside(address, pool.ref, why))
        mine = await self.ledger.claim_addresses(client, claim.uid)
        here = [o for o in mine if host_of(o) == address and vrf_id_of(o) == source.vrf_id]  # another VRF's: a stray
        kept = min(here, key=lambda o: int(o["id"]), default=None)
        await self._delete_others(client, pool.ref, claim, mine, int(kept["id"]) if kept is not None else None)
        if kept is None:
            holders = await self.ledger.holders_at(client, address, source)
            earlier = next((o for o in holders if is_ours(o) and claim_ref_of(o) == claim_ref(claim)), None)
            if earlier is not None:  # this claim's, under its UID before a restore or a move: re-keyed, then checked
                await self.ledger.rekey(client, pool.ref, claim, earlier)
                kept = earlier
            elif holders:
                raise AllocationFailedError(requested_address_held(address, pool.ref, _holder(holders[0])))
            else:
                kept = await self.create_requested(client, pool, resolved, claim, address, source)
        await self.keep_if_alone(client, pool, claim, address, source, kept)
        self.ledger.hold(pool.ref, claim.uid, int(kept["id"]), address)
        log.info("requested address held", claim=str(claim), pool=str(pool.ref), address=address, id=kept["id"])
        return allocation_of(resolved, kept, claim.uid, source)

    async def create_requested(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext, address: str, source: Source
    ) -> Object:
        """POST the address for the claim (as for a requested address); a refusal or a lost answer is resolved by
        looking again. AllocationFailedError when another object holds it or NetBox refuses it."""
        body = self.ledger.body(pool, resolved, claim)
        body["description"] = str(body["description"])[: 200 - len(REQUESTED_MARK)] + REQUESTED_MARK
        try:
            return await self.ledger.create(client, body, address, source)
        except (HTTPError, OutcomeUnknownError) as error:
            if isinstance(error, HTTPError) and not error.invalid:
                raise
            # NetBox's own duplicate check, our UID taken, or a lost answer
            holders = await self.ledger.holders_at(client, address, source)
            found = next((o for o in holders if is_ours(o, claim.uid)), None)
            if found is not None:
                return found
            if isinstance(error, OutcomeUnknownError):
                raise AllocationFailedError(
                    f"{error.message}; NetBox holds no address for claim {claim}, so it is asked again",
                    retry_after=self.unknown_retry_seconds,
                ) from error
            if holders:
                raise AllocationFailedError(requested_address_held(address, pool.ref, _holder(holders[0]))) from error
            raise AllocationFailedError(
                f"NetBox refused the requested address {address} for claim {claim}: {error.message}; fix the pool's "
                "spec.addressFields"
            ) from error

    async def keep_if_alone(
        self, client: NetboxClient, pool: Pool, claim: ClaimContext, address: str, source: Source, kept: Object
    ) -> None:
        """Keep `kept` only if nothing else holds the address at the last listing; else delete it and fail (held).

        When only addresses of this provider's other claims share it (a race), the oldest (lowest id) lists again
        every CONTENDED_WAIT_SECONDS for up to the client's read timeout (long enough for the others' POST replies
        to arrive), while the others give way at once. A claim that gives way to a racer fails with a short random
        retry, so that racers that all gave way do not race again in step. Safety rests on the last listing alone.
        """
        deadline = asyncio.get_running_loop().time() + client.settings.read_timeout
        while True:
            holders = await self.ledger.holders_at(client, address, source)
            if not any(o["id"] == kept["id"] for o in holders):
                raise AllocationFailedError(
                    f"NetBox IP address #{kept['id']} made for claim {claim} at {address} is gone again; it is asked "
                    "again",
                    retry_after=1.0,
                )
            await self._drop_twins(client, pool.ref, claim, kept, holders)
            others = [o for o in holders if o["id"] != kept["id"] and not is_ours(o, claim.uid)]
            if not others:
                return
            race = all(is_ours(o) or uid_of(o) for o in others)  # a listing may show an address before its tags
            oldest = race and int(kept["id"]) < min(int(o["id"]) for o in others)
            if not oldest or asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(CONTENDED_WAIT_SECONDS)
        await self.ledger.delete(client, pool.ref, int(kept["id"]), claim.uid)
        log.info(
            "requested address taken at the same time by another object; ours deleted",
            claim=str(claim),
            pool=str(pool.ref),
            address=address,
            id=kept["id"],
            other=others[0]["id"],
        )
        raise AllocationFailedError(
            requested_address_held(address, pool.ref, _holder(others[0])),
            retry_after=race_retry_seconds() if race else None,
        )

    async def _drop_twins(
        self, client: NetboxClient, ref: PoolRef, claim: ClaimContext, kept: Object, holders: Sequence[Object]
    ) -> None:
        """Another address of this claim beside `kept` (another attempt for the same claim): the younger one goes.
        When that is `kept`, it is deleted and the claim asks again soon (its next attempt adopts the older one)."""
        twins = [int(o["id"]) for o in holders if is_ours(o, claim.uid) and o["id"] != kept["id"]]
        for younger in (twin for twin in twins if twin > int(kept["id"])):
            await self.ledger.delete(client, ref, younger, claim.uid)
        if any(twin < int(kept["id"]) for twin in twins):
            await self.ledger.delete(client, ref, int(kept["id"]), claim.uid)
            raise AllocationFailedError(
                f"claim {claim} holds an older NetBox IP address at {kept['address']}; #{kept['id']} deleted, asking "
                "again",
                retry_after=1.0,
            )


def _holder(obj: Mapping[str, Any]) -> str:
    """Who holds a NetBox IP address, for the claim's message."""
    if not is_ours(obj):
        return f"a NetBox IP address not managed by this provider (id {obj['id']})"
    recorded = claim_ref_of(obj)
    return f"claim {recorded}" if recorded else f"a claim with UID {uid_of(obj)}"
