"""A claim that asks for one address (the requested-address annotation): a fixed address or host record with exactly
that IP (`ipv4addr`/`ipv6addr` set to the address instead of `func:nextavailableip`).

Contract (`Allocator.allocate_requested` follows it with the helpers here; only for a claim without an IPAddress: a
fulfilled claim keeps its address whatever it asks for):
- The address must be one the pool could hand out: inside one of its subnets (not the network or IPv4 broadcast
  address, nor the IPv6 subnet-router anycast address) or ranges, and not that subnet's or range's gateway. Else
  the claim fails with `requested_address_outside` and no request is sent.
- The fixed addresses and host records at that address in the pool's network view are searched (two GETs). One the
  claim owns (CAPI-Claim-UID: made by an earlier attempt that crashed or lost its reply) is adopted; one of ours that
  records this claim's namespace, name and pool under another UID (a restore or `clusterctl move`) is re-keyed to
  the claim (the take-over path's guard) and adopted. Any other
  makes the claim fail with `requested_address_held`, naming the claim its extensible attributes record, or the
  object's type and reference when it was not made by this provider.
- Else the object is posted with the literal address. NIOS refuses a second fixed address at one address in a
  network view (`Client.Ibap.Data.Conflict`); the holder is then searched and named.
- NIOS lets a host record (without DHCP) share an address with other host records and with a fixed address, so
  every object made or adopted here is checked after the fact: the address is searched again, and an object that
  is not alone there at its last search is deleted and the claim fails as held. Two claims racing for one address
  therefore never both keep it: of two kept objects, the one searched last would have seen the other, which was
  committed before its POST returned. So that a race has a winner, the racer whose reference sorts first waits for
  the others (which give way at once) for up to the instance's request timeout, searching again; if they are still
  there, it gives way too. A claim that gave way to a racer asks again after a short random delay (1-3 s), so
  racers that all gave way drift apart instead of racing again in step.
"""

from __future__ import annotations

import asyncio
import ipaddress

import structlog

from backends.backoff import CONTENDED_WAIT_SECONDS, race_retry_seconds
from backends.infoblox.connections import Connection
from backends.infoblox.ownership import same
from backends.infoblox.payloads import FIXED_V4, FIXED_V6, HOST, RETURN_FIELDS, GridObject, parse_object
from backends.infoblox.spec import EA_CLAIM_NAME, EA_CLAIM_NAMESPACE, EA_POOL, Pool, Target
from ipam_provider.backend.contract import (
    AllocationFailedError,
    ClaimContext,
    requested_address_held,
)
from ipam_provider.common import Object

log = structlog.get_logger(__name__)


def target_for(pool: Pool, address: str) -> tuple[Target | None, str]:
    """The first subnet or range of the pool that could hand out `address`, or None and why none can."""
    value = ipaddress.ip_address(address)
    why = ""
    for target in pool.targets:
        if target.version != value.version:
            continue
        reserved = False
        if target.kind == "network":
            network = ipaddress.ip_network(target.argument)
            if value not in network:
                continue
            if network.version == 4 and network.prefixlen < 31:
                reserved = value in (network.network_address, network.broadcast_address)
            elif network.version == 6 and network.prefixlen < 127:
                reserved = value == network.network_address
        else:
            first, last = (ipaddress.ip_address(part) for part in target.argument.split("-"))
            if not int(first) <= int(value) <= int(last):
                continue
        if target.gateway is not None and same(target.gateway, address):
            why = why or f"the gateway of {target}"
        elif reserved:
            why = why or f"a reserved address of {target} (its network, broadcast or subnet-router anycast address)"
        else:
            return target, ""
    return None, why


def describe(obj: GridObject) -> str:
    """Who holds a grid object, for the claim's message."""
    marks = obj.extattrs
    if obj.claim_uid:
        return f"claim {marks.get(EA_CLAIM_NAMESPACE)}/{marks.get(EA_CLAIM_NAME)}"
    if marks.get(EA_POOL):
        return f"the gateway reservation of InfobloxIPPool {marks[EA_POOL]} ({obj.ref})"
    return f"a {obj.obj_type} not managed by this provider ({obj.ref})"


async def holders(connection: Connection, pool: Pool, network_view: str, address: str) -> list[GridObject]:
    """The fixed addresses and host records at `address` in `network_view` (two searches)."""
    fixed = FIXED_V4 if pool.version == 4 else FIXED_V6
    field_name = "ipv4addr" if pool.version == 4 else "ipv6addr"
    query = {field_name: address, "network_view": network_view}
    found: list[GridObject] = []
    for obj_type in (fixed, HOST):
        for raw in await connection.client.search(obj_type, RETURN_FIELDS[obj_type], query):
            obj = parse_object(obj_type, raw)
            if obj is not None and _holds(obj_type, raw, address):
                found.append(obj)
    return found


def _holds(obj_type: str, raw: Object, address: str) -> bool:
    """Whether the answered object holds `address` (a host record may hold several addresses)."""
    if obj_type != HOST:
        return True
    entries = [e for key in ("ipv4addrs", "ipv6addrs") for e in raw.get(key) or [] if isinstance(e, dict)]
    return any(same(str(e.get("ipv4addr") or e.get("ipv6addr") or ""), address) for e in entries)


def earlier_self(obj: GridObject, pool: Pool, claim: ClaimContext) -> bool:
    """Whether `obj` is this claim's object under an earlier UID (its namespace, name and pool recorded)."""
    marks = obj.extattrs
    recorded = (marks.get(EA_CLAIM_NAMESPACE), marks.get(EA_CLAIM_NAME), marks.get(EA_POOL))
    return bool(obj.claim_uid) and obj.claim_uid != claim.uid and recorded == (claim.namespace, claim.name, pool.label)


def held(address: str, pool: Pool, holder: GridObject, retry_after: float | None = None) -> AllocationFailedError:
    return AllocationFailedError(requested_address_held(address, pool.ref, describe(holder)), retry_after=retry_after)


async def keep_alone(
    connection: Connection, pool: Pool, claim: ClaimContext, network_view: str, address: str, kept: GridObject
) -> None:
    """Keep `kept` only if nothing else holds the address at the last search; else delete it and fail (held).

    When only objects of this provider's other claims share the address (a race), the one whose reference sorts
    first searches again every CONTENDED_WAIT_SECONDS, for up to the instance's request timeout (long enough for
    the others' POST replies to arrive), while the others give way at once. A racer that gives way fails with a
    short random retry (RACE_RETRY_SECONDS), so that racers that all gave way do not race again in step. Safety
    rests on the last search alone: an object is kept only if it was alone there after its POST."""
    deadline = asyncio.get_running_loop().time() + float(connection.spec.request_timeout_seconds)
    while True:
        found = await holders(connection, pool, network_view, address)
        await drop_duplicates(connection, claim, kept, found)
        others = [o for o in found if o.ref != kept.ref and o.claim_uid != claim.uid]
        if not others:
            return
        race = all(o.claim_uid for o in others)
        first = race and kept.ref < min(o.ref for o in others)
        if not first or asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(CONTENDED_WAIT_SECONDS)
    await connection.client.delete(kept.ref)
    log.info(
        "requested address taken at the same time by another object; ours deleted",
        claim=str(claim),
        pool=str(pool.ref),
        address=address,
        ref=kept.ref,
        other=others[0].ref,
    )
    raise held(address, pool, others[0], race_retry_seconds() if race else None)


async def drop_duplicates(
    connection: Connection, claim: ClaimContext, kept: GridObject, found: list[GridObject]
) -> None:
    """Another object of this claim beside `kept` (another attempt for the same claim): the one whose reference sorts
    later goes. When that is `kept`, it is deleted and the claim asks again soon (and adopts the other)."""
    twins = [o for o in found if o.claim_uid == claim.uid and o.ref != kept.ref]
    for twin in twins:
        if twin.ref > kept.ref:
            await connection.client.delete(twin.ref)
    if any(twin.ref < kept.ref for twin in twins):
        await connection.client.delete(kept.ref)
        raise AllocationFailedError(
            f"claim {claim} holds another object at {kept.address}; asking again", retry_after=1.0
        )
