"""A claim that asks for one address (the requested-address annotation): that address, recorded in NetBox.

Contract (`Allocator.allocate_requested` follows it with the helpers here; only for a claim without an IPAddress: a
fulfilled claim keeps its address whatever it asks for):
- The address must be one NetBox could hand out from one of the pool's sources: inside a prefix or ip-range of the
  pool, not the source's gateway, not a prefix's network (or IPv4 broadcast) address, not in an ip-range marked
  populated (a range source itself, or a range inside a prefix source: one more GET). Otherwise the claim fails
  with `requested_address_outside` and nothing is written.
- The claim's own addresses are looked up by UID first (one GET): one at the requested address in the source's VRF
  (made by an earlier attempt that crashed or lost its answer) is adopted; any other (also one at that address in
  another VRF) is deleted (it was never handed out: no IPAddress names the claim).
- An address of ours there that records this claim's namespace/name under another UID (a restore or a
  `clusterctl move` gave the claim a new UID) is re-keyed to the claim and then checked like one made here.
- Anything else at that address in the source's VRF (another claim's address, or one made by hand) makes the claim
  fail with `requested_address_held`, naming the holder. Else the address is created with `POST ip-addresses`.
- NetBox does not stop two clients from creating one address at the same time, so every address made or adopted
  here is checked after the fact: the address is listed again in the VRF, and the object is kept only if it is
  alone there at its last listing; else it is deleted and the claim fails with `requested_address_held`. Two kept
  objects are impossible: the one listed last would have seen the other, committed before its POST answered and
  never deleted. Commit order need not follow id order, so ids decide only who waits: when nothing but addresses
  of this provider's other claims share the address, the oldest (lowest id) lists again for up to the client's
  read timeout while the others give way at once, so a race between claims has a winner, whichever processes they
  run in. A claim that gave way to a racer asks again after a short random delay (1-3 s), never in step.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from backends.backoff import CONTENDED_WAIT_SECONDS, race_retry_seconds
from backends.netbox import calls
from backends.netbox.client import NetboxClient
from backends.netbox.records import claim_ref_of, host_of, is_ours
from backends.netbox.resolver import Resolved, Source
from backends.netbox.spec import CLAIM_UID_FIELD, Pool
from ipam_provider.backend.contract import (
    AllocationFailedError,
    ClaimContext,
    requested_address_held,
)
from ipam_provider.common import Object

log = structlog.get_logger(__name__)


def source_for(resolved: Resolved, address: str) -> tuple[Source | None, str]:
    """The first source of the pool that could hand out `address`, or None and why none can."""
    why = ""
    for source in resolved.sources:
        if not source.contains(address):
            continue
        gateway = source.ref.gateway
        if gateway is not None and ipaddress.ip_address(gateway) == ipaddress.ip_address(address):
            why = why or f"the gateway of {source.display}"
        elif source.total == 0:
            why = why or f"NetBox hands out no address of {source.display} (it is marked populated)"
        elif not source.offers(address):
            why = why or f"a reserved address of {source.display} (its network address, or its IPv4 broadcast address)"
        else:
            return source, ""
    return None, why


def describe(holder: Mapping[str, Any]) -> str:
    """Who holds a NetBox IP address, for the claim's message."""
    if is_ours(holder):
        recorded = claim_ref_of(holder)
        if recorded:
            return f"claim {recorded}"
        return f"a claim with UID {(holder.get('custom_fields') or {}).get(CLAIM_UID_FIELD)}"
    return f"a NetBox IP address not managed by this provider (id {holder['id']})"


async def populated_range(client: NetboxClient, address: str, source: Source) -> str | None:
    """The ip-range marked populated that holds `address` in the source's VRF ("start-end"), if any: NetBox's
    available-ips of a prefix skips those addresses, so they are not the pool's to hand out. One GET."""
    return range_holding(await populated_ranges(client, source.vrf_id), address)


async def populated_ranges(client: NetboxClient, vrf_id: int | None) -> list[Object]:
    """The ip-ranges marked populated in the VRF (None: the global table), with one GET."""
    # Not `contains=`: NetBox compares it with the ranges' masks too, so a bare address misses its range.
    filters = {"mark_populated": "true", "vrf_id": vrf_id if vrf_id is not None else "null"}
    found: list[Object] = await client.call(
        "look up populated ip-ranges", calls.find("ipam", "ip_ranges", filters, brief=False)
    )
    return [obj for obj in found if obj.get("mark_populated")]


def range_holding(ranges: Sequence[Object], address: str) -> str | None:
    """The range of `ranges` that holds `address` ("start-end"), if any."""
    parsed = ipaddress.ip_address(address)
    for obj in ranges:
        first, last = (ipaddress.ip_interface(str(obj[key])).ip for key in ("start_address", "end_address"))
        if first.version == last.version == parsed.version and int(first) <= int(parsed) <= int(last):
            return f"{first}-{last}"
    return None


def populated_why(populated: str, source: Source) -> str:
    return f"in ip-range {populated} of {source.display}, marked populated: NetBox hands out none of it"


async def holders_at(client: NetboxClient, address: str, source: Source) -> list[Object]:
    """The NetBox IP addresses at `address` in the source's VRF, oldest (lowest id) first."""
    found: list[Object] = await client.call(f"look up {address}", calls.find_address(address, source.vrf_id))
    return sorted((o for o in found if host_of(o) == address), key=lambda o: int(o["id"]))


def ours_among(holders: Sequence[Object], uid: str) -> Object | None:
    return next((o for o in holders if is_ours(o, uid)), None)


async def keep_if_alone(
    client: NetboxClient, pool: Pool, claim: ClaimContext, address: str, source: Source, kept: Object
) -> None:
    """Keep `kept` only if nothing else holds the address at the last listing; else delete it and fail (held).

    When only addresses of this provider's other claims share it (a race), the oldest (lowest id) lists again every
    CONTENDED_WAIT_SECONDS for up to the client's read timeout (long enough for the others' POST replies to arrive),
    while the others give way at once. A claim that gives way to a racer fails with a short random retry
    (RACE_RETRY_SECONDS), so that racers that all gave way do not race again in step. Safety rests on the last
    listing alone."""
    deadline = asyncio.get_running_loop().time() + client.settings.read_timeout
    while True:
        holders = await holders_at(client, address, source)
        if not any(o["id"] == kept["id"] for o in holders):
            raise AllocationFailedError(
                f"NetBox IP address #{kept['id']} made for claim {claim} at {address} is gone again; it is asked again",
                retry_after=1.0,
            )
        await _drop_duplicates(client, claim, kept, holders)
        others = [o for o in holders if o["id"] != kept["id"] and not is_ours(o, claim.uid)]
        if not others:
            return
        race = all(_racer(o) for o in others)
        oldest = race and int(kept["id"]) < min(int(o["id"]) for o in others)
        if not oldest or asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(CONTENDED_WAIT_SECONDS)
    await client.call(f"delete address #{kept['id']}", calls.delete_address(int(kept["id"])))
    log.info(
        "requested address taken at the same time by another object; ours deleted",
        claim=str(claim),
        pool=str(pool.ref),
        address=address,
        id=kept["id"],
        other=others[0]["id"],
    )
    raise AllocationFailedError(
        requested_address_held(address, pool.ref, describe(others[0])),
        retry_after=race_retry_seconds() if race else None,
    )


async def _drop_duplicates(client: NetboxClient, claim: ClaimContext, kept: Object, holders: Sequence[Object]) -> None:
    """Another address of this claim beside `kept` (another attempt for the same claim): the younger one goes. When
    that is `kept`, it is deleted and the claim asks again soon (its next attempt adopts the older one)."""
    twins = [o for o in holders if is_ours(o, claim.uid) and o["id"] != kept["id"]]
    for twin in twins:
        if int(twin["id"]) > int(kept["id"]):
            await client.call(f"delete address #{twin['id']}", calls.delete_address(int(twin["id"])))
    if any(int(twin["id"]) < int(kept["id"]) for twin in twins):
        await client.call(f"delete address #{kept['id']}", calls.delete_address(int(kept["id"])))
        raise AllocationFailedError(
            f"claim {claim} holds an older NetBox IP address at {kept['address']}; #{kept['id']} deleted, asking again",
            retry_after=1.0,
        )


def _racer(obj: Mapping[str, Any]) -> bool:
    """Whether `obj` may be another claim's address of this provider: it carries a claim UID (a listing may show a
    just-created address before its tags)."""
    return is_ours(obj) or bool((obj.get("custom_fields") or {}).get(CLAIM_UID_FIELD))
