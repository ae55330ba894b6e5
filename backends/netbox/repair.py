"""The NetBox backend's repair capability (contract: `ipam_provider.backend.repair`; the rules, and their request
costs, in docs/netbox.md "Repair").

Contract:
- A pool's holdings are the NetBox IP addresses inside its sources (in each source's VRF) that carry both ownership
  marks, listed by NetBox's own filters in pages (one `pacer.wait()` before each; cursor pagination where NetBox
  has it, so an address that exists during the whole listing is listed exactly once). One stamped with another
  management cluster's identity is not listed; one without identity is listed, never releasable.
- `release_holding` deletes only a releasable holding that a fresh GET by id shows unchanged: our tag, the listed
  claim UID and name, our identity, the listed address.
- `restore` reads NetBox fresh at the address (never the ledger's trusted shortcut): HELD (ours for the claim,
  alone), RECORDED (nothing there: created like a requested address, kept only if alone at its last listing, and
  listed once more; or ours under the claim's older UID, alone: re-keyed), TAKEN (anything else, named), OUTSIDE
  (no source of the pool could hand it out). It never takes an address from another holder, and deletes only an
  object it just made.
- `outside_pool` answers from the pool's sources as last resolved, plus one GET per VRF of the prefix sources for
  the ip-ranges marked populated.
- Failures become PoolNotReadyError (the loop skips the pool for this pass); tokens never appear in messages.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import structlog

from backends.netbox import calls
from backends.netbox.allocator import Allocator
from backends.netbox.client import NetboxClient
from backends.netbox.ledger import Ledger, claim_ref, claim_ref_of, host_of, is_ours, uid_of
from backends.netbox.reasons import PoolUnusableError, for_claims, shown_to_claims
from backends.netbox.resolver import Resolved, Resolver, Source, offered_by, populated_ranges, populated_why, vrf_id_of
from backends.netbox.spec import CLAIM_UID_FIELD, CLUSTER_IDENTITY_FIELD, OWNER_TAG, Pool
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    BackendError,
    ClaimContext,
    PoolNotReadyError,
    PoolRef,
)
from ipam_provider.backend.repair import Holding, Made, Pacer, Restore, RestoreOutcome, made_by
from ipam_provider.common import Object, normalized_address

log = structlog.get_logger(__name__)

# Not `tags`: the `tag` filter already selects them, and serialising tags triples NetBox's time per page. A
# release checks the tag again on a fresh GET.
HOLDING_FIELDS = "id,address,vrf,custom_fields,created"


class NetboxRepair:
    """The repair capability, composed of the backend's resolver, ledger and allocator."""

    def __init__(self, resolver: Resolver, ledger: Ledger, allocator: Allocator, page_size: int) -> None:
        self.resolver = resolver
        self.ledger = ledger
        self.allocator = allocator
        self.page_size = page_size
        self._resolved_this_pass: set[PoolRef] = set()  # the pools a restore resolved afresh since their listing

    def forget(self, pool_ref: PoolRef) -> None:
        self._resolved_this_pass.discard(pool_ref)

    @contextlib.asynccontextmanager
    async def _netbox(
        self, pool_ref: PoolRef, pool: Object, doing: str, *, for_claim: bool = False
    ) -> AsyncIterator[tuple[Pool, NetboxClient]]:
        """The parsed pool and its client, lent for one operation; failures become PoolNotReadyError. With
        `for_claim` (a claim's Event shows the failure), every BackendError's message leaves out the NetBox URL."""
        client: NetboxClient | None = None
        try:
            parsed = self.resolver.parse(pool_ref, pool)
            async with self.resolver.session(parsed, doing) as client:
                yield parsed, client
        except BackendError as error:
            if for_claim:
                shown_to_claims(error, client)
            raise
        except PoolUnusableError as problem:
            message = for_claims(problem.message, client) if for_claim else problem.message
            raise PoolNotReadyError(message, retry_after=problem.retry_after) from problem

    async def list_holdings(self, pool_ref: PoolRef, pool: Object, pacer: Pacer) -> list[Holding]:
        async with self._netbox(pool_ref, pool, "listing the NetBox addresses of") as (parsed, client):
            self._resolved_this_pass.discard(parsed.ref)
            resolved = await self.resolver.resolve(client, parsed, pacer=pacer)
            found: dict[int, Holding] = {}
            by_vrf: dict[int | None, list[Source]] = {}
            for source in resolved.sources:
                by_vrf.setdefault(source.vrf_id, []).append(source)
            for vrf_id, sources in by_vrf.items():
                filters = {
                    "tag": OWNER_TAG,
                    f"cf_{CLAIM_UID_FIELD}__empty": "false",
                    "parent": [n for s in sources for n in s.networks()],
                    "vrf_id": calls.vrf_filter(vrf_id),
                    "fields": HOLDING_FIELDS,
                }
                async for page in _pages(client, filters, self.page_size, pacer):
                    for obj in page:
                        made = made_by(stamp_of(obj), self.ledger.cluster_identity)
                        holding = holding_of(obj, releasable=made == Made.OURS)
                        inside = any(s.contains(holding.address) for s in sources)
                        if holding.claim_uid and inside and vrf_id_of(obj) == vrf_id and made != Made.OTHER:
                            found[int(obj["id"])] = holding
            return sorted(found.values(), key=lambda h: int(h.handle))

    async def release_holding(self, pool_ref: PoolRef, pool: Object, holding: Holding) -> bool:
        if not holding.releasable or not holding.handle.isdigit() or not holding.claim_uid:
            return False
        address_id = int(holding.handle)
        async with self._netbox(pool_ref, pool, "releasing a leaked NetBox address of") as (parsed, client):
            obj = await client.call(f"GET address #{address_id}", calls.get("ipam", "ip_addresses", address_id))
            unchanged = (
                obj is not None
                and is_ours(obj, holding.claim_uid)
                and (claim_ref_of(obj) or "") == holding.claim
                and host_of(obj) == holding.address
                and made_by(stamp_of(obj), self.ledger.cluster_identity) == Made.OURS
            )
            if not unchanged:
                log.info("holding changed since it was listed; kept", pool=str(parsed.ref), id=address_id)
                return False
            # The claim may be live and hold another address (a suspect leak): only what was kept of this one goes.
            self.ledger.forget_address(parsed.ref, holding.claim_uid, address_id)
            deleted = await self.ledger.delete(client, parsed.ref, address_id, holding.claim_uid)
            if deleted:
                log.info("leaked address released", pool=str(parsed.ref), address=holding.address, id=address_id)
            return deleted

    async def restore(self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, allocation: Allocation) -> Restore:
        address = normalized_address(allocation.address)
        doing = f"restoring {address} of claim {claim} in"
        async with self._netbox(pool_ref, pool, doing, for_claim=True) as (parsed, client):
            # Afresh once per pool and pass (the first restore after the pool's listing), then from the cache.
            resolved = await self.resolver.resolve(client, parsed, fresh=parsed.ref not in self._resolved_this_pass)
            self._resolved_this_pass.add(parsed.ref)
            source, why = await offered_by(client, resolved, address)
            if source is None:
                return Restore(RestoreOutcome.OUTSIDE, why or resolved.nowhere())
            outcome = await self._settle(client, parsed, resolved, claim, address, source)
            kind, detail = outcome.outcome.value, outcome.detail
            log.info("restore", claim=str(claim), pool=str(parsed.ref), address=address, outcome=kind, detail=detail)
            return outcome

    async def _settle(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext, address: str, source: Source
    ) -> Restore:
        """What the objects at the address answer; when there is none (the address is free), `_record`."""
        holders = await self.ledger.holders_at(client, address, source)
        mine = [o for o in holders if is_ours(o, claim.uid)]
        others = [o for o in holders if not is_ours(o, claim.uid)]
        if others:
            earlier = others[0]
            if mine or len(others) > 1 or not is_ours(earlier) or claim_ref_of(earlier) != claim_ref(claim):
                return Restore(RestoreOutcome.TAKEN, holder_of(earlier))
            await self.ledger.rekey(client, pool.ref, claim, earlier)  # this claim's, under an older UID
            self.ledger.hold(pool.ref, claim.uid, int(earlier["id"]), address)
            return Restore(RestoreOutcome.RECORDED, f"NetBox IP address {earlier['id']} re-keyed to the claim's UID")
        if mine:
            self.ledger.hold(pool.ref, claim.uid, int(mine[0]["id"]), address)
            return Restore(RestoreOutcome.HELD, f"NetBox IP address {mine[0]['id']}")
        return await self._record(client, pool, resolved, claim, address, source)

    async def _record(
        self, client: NetboxClient, pool: Pool, resolved: Resolved, claim: ClaimContext, address: str, source: Source
    ) -> Restore:
        try:
            created = await self.allocator.create_requested(client, pool, resolved, claim, address, source)
            await self.allocator.keep_if_alone(client, pool, claim, address, source, created)  # only if alone there
        except AllocationFailedError:
            holders = await self.ledger.holders_at(client, address, source)  # who took it meanwhile?
            taken = [o for o in holders if not is_ours(o, claim.uid)]
            if taken:
                return Restore(RestoreOutcome.TAKEN, holder_of(taken[0]))
            raise
        # Once more: another pool over the same prefix may have been handed the address by `POST available-ips`
        # (which does not check after the fact) since the last listing.
        holders = await self.ledger.holders_at(client, address, source)
        others = [o for o in holders if o["id"] != created["id"] and not is_ours(o, claim.uid)]
        if others:
            await self.ledger.delete(client, pool.ref, int(created["id"]), claim.uid)
            log.info("restored address taken meanwhile; ours deleted", pool=str(pool.ref), address=address)
            return Restore(RestoreOutcome.TAKEN, holder_of(others[0]))
        self.ledger.hold(pool.ref, claim.uid, int(created["id"]), address)
        return Restore(RestoreOutcome.RECORDED, f"NetBox IP address {created['id']}")

    async def outside_pool(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> dict[str, str]:
        result: dict[str, str] = {}
        in_prefixes: dict[str, Source] = {}
        with contextlib.suppress(PoolNotReadyError):  # the pool cannot be checked now: what was found so far
            async with self._netbox(pool_ref, pool, "checking the addresses of") as (parsed, client):
                resolved = await self.resolver.resolve(client, parsed)
                for address in addresses:
                    try:
                        ipaddress.ip_address(address)
                    except ValueError:
                        result[address] = "not an IP address"
                        continue
                    source, why = resolved.offering(normalized_address(address))
                    if source is None:
                        result[address] = why or resolved.nowhere()
                    elif source.ref.type == "prefix":
                        in_prefixes[address] = source
                # Those inside an ip-range marked populated: one GET per VRF of their prefixes.
                ranges = {vrf: await populated_ranges(client, vrf) for vrf in {s.vrf_id for s in in_prefixes.values()}}
                for address, source in in_prefixes.items():
                    result[address] = populated_why(ranges[source.vrf_id], normalized_address(address), source)
        return {address: why for address, why in result.items() if why}


async def _pages(
    client: NetboxClient, filters: Mapping[str, Any], size: int, pacer: Pacer
) -> AsyncIterator[list[Object]]:
    """The IP addresses `filters` selects, page by page (see the module contract), one `pacer.wait()` before
    each request."""
    page: dict[str, int] = {"limit": size, "start": 0}
    while True:
        await pacer.wait()
        answer = await client.call("list our IP addresses", calls.list_page("ipam", "ip_addresses", filters, page))
        results: list[Object] = list(answer.get("results") or [])
        yield results
        if not answer.get("next") or not results:
            return
        if "start" in page and answer.get("count") is None:
            page = {"limit": size, "start": max(int(o["id"]) for o in results) + 1}
        else:  # a NetBox without cursor pagination ignored `start` and answered with a count
            page = {"limit": size, "offset": page.get("offset", 0) + len(results)}


WHY_UNSTAMPED = (
    f"its custom field {CLUSTER_IDENTITY_FIELD} is empty, so it may belong to another management cluster sharing "
    "this NetBox (addresses made before identities were stamped)"
)


def stamp_of(obj: Mapping[str, Any]) -> str:
    """The management cluster identity one of our NetBox IP addresses is stamped with ("": none), for `made_by`."""
    return str((obj.get("custom_fields") or {}).get(CLUSTER_IDENTITY_FIELD) or "")


def holding_of(obj: Mapping[str, Any], *, releasable: bool = True) -> Holding:
    """The Holding for one of our NetBox IP addresses."""
    created = obj.get("created")
    created_at = datetime.fromisoformat(str(created)).timestamp() if created else None
    why = "" if releasable else WHY_UNSTAMPED
    address, claim = host_of(obj), claim_ref_of(obj) or ""
    return Holding(
        address, claim, str(uid_of(obj) or ""), str(obj["id"]), created_at, releasable=releasable, why_kept=why
    )


def holder_of(obj: Mapping[str, Any]) -> str:
    """Who holds a NetBox IP address, for people: "NetBox IP address 12 (claim ns/name)" or "(not ours)"."""
    if not is_ours(obj):
        return f"NetBox IP address {obj['id']} (not ours)"
    recorded = claim_ref_of(obj)
    return f"NetBox IP address {obj['id']} ({f'claim {recorded}' if recorded else f'claim UID {uid_of(obj)}'})"
