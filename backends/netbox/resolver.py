"""What a pool's spec names in NetBox: the ownership marks, the sources, the tenant and tags; and their usage.
Everything raises PoolUnusableError (pool-level, with a reason) or NetboxError (from the client).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.netbox import calls, reasons
from backends.netbox.client import HTTPError, NetboxClient, OutcomeUnknownError, Ownership
from backends.netbox.connections import Connections
from backends.netbox.reasons import PoolUnusableError
from backends.netbox.spec import (
    CLAIM_REF_FIELD,
    CLAIM_UID_FIELD,
    CLUSTER_IDENTITY_FIELD,
    OWNER_TAG,
    Pool,
    SourceRef,
    parse_pool,
)
from backends.validation import PoolSpecError
from ipam_provider.backend.contract import PoolRef
from ipam_provider.backend.repair import Pacer
from ipam_provider.common import Object, cap_int64

IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Source:
    """A resolved source: its NetBox object and the addresses it spans."""

    ref: SourceRef
    index: int
    id: int
    first: IPAddr
    last: IPAddr
    mask: int  # the prefix length NetBox gives its addresses
    vrf_id: int | None
    total: int  # the addresses NetBox hands out from it
    reserved: tuple[IPAddr, ...] = ()  # addresses in it that NetBox never hands out (network, broadcast)

    @property
    def display(self) -> str:
        return f"{self.first}/{self.mask}" if self.ref.type == "prefix" else f"{self.first}-{self.last}"

    def contains(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return ip.version == self.first.version and int(self.first) <= int(ip) <= int(self.last)

    def offers(self, address: str) -> bool:
        """Whether NetBox's available-ips could hand out `address` from this source (if it were free)."""
        return self.total > 0 and self.contains(address) and ipaddress.ip_address(address) not in self.reserved

    def status(self, used: int) -> dict[str, Any]:
        """The source's entry in the pool's `status.sources`, `used` of its addresses being held in NetBox."""
        capped = {"total": cap_int64(self.total), "used": cap_int64(used), "free": cap_int64(max(self.total - used, 0))}
        return {"type": self.ref.type, "id": self.id, "range": self.display, **capped}

    def networks(self) -> list[str]:
        return [str(n) for n in ipaddress.summarize_address_range(self.first, self.last)]


@dataclass(frozen=True)
class Resolved:
    ownership: Ownership
    sources: tuple[Source, ...]
    tenant_id: int | None
    tag_ids: tuple[int, ...]

    def source_of(self, address: str) -> Source | None:
        return next((s for s in self.sources if s.contains(address)), None)

    def offering(self, address: str) -> tuple[Source | None, str]:
        """The first source that could hand out `address`, or None and why none can (outside every source: "")."""
        why = ""
        for source in (s for s in self.sources if s.contains(address)):
            gateway = source.ref.gateway
            if gateway is not None and ipaddress.ip_address(gateway) == ipaddress.ip_address(address):
                reason = f"the gateway of {source.display}"
            elif source.total == 0:
                reason = f"NetBox hands out no address of {source.display} (it is marked populated)"
            elif not source.offers(address):
                reason = f"a reserved address of {source.display} (its network address, or its IPv4 broadcast address)"
            else:
                return source, ""
            why = why or reason
        return None, why

    def nowhere(self) -> str:
        return f"in none of the pool's NetBox sources ({', '.join(s.display for s in self.sources)})"


async def ensure_ownership(client: NetboxClient) -> Ownership:
    """The owner tag's id and whether the claim-UID field is unique; creates what is missing (the tag and the custom
    fields claim UID, claim namespace/name and management cluster identity). One that cannot be created, or has the
    wrong shape (not Text on IP addresses; a UID filter logic that makes NetBox ignore the lookup by UID), is a
    PoolUnusableError saying how to fix it by hand."""
    tag = await _ensure(
        client,
        "the owner tag",
        calls.find("extras", "tags", {"slug": OWNER_TAG}),
        calls.create("extras", "tags", calls.OWNER_TAG_BODY),
        lambda error: PoolUnusableError(
            reasons.TAG_MISSING,
            f"the tag {OWNER_TAG!r} does not exist in NetBox and this token may not create it ({error.message}); "
            f"create it in NetBox (Customization → Tags: name and slug {OWNER_TAG!r})",
        ),
    )
    unique = "Unique checked, filter logic Exact"
    field = await _ensure_field(client, CLAIM_UID_FIELD, calls.CLAIM_UID_FIELD_BODY, unique)
    logic = _choice(field.get("filter_logic"))
    if logic not in ("exact", "loose"):
        raise PoolUnusableError(
            reasons.CUSTOM_FIELD_INVALID,
            f"the NetBox custom field {CLAIM_UID_FIELD!r} has filter logic {logic!r}, so NetBox ignores the lookup "
            f"of a claim's address by UID (cf_{CLAIM_UID_FIELD}=…) and it would list every address of ours; set its "
            "filter logic to Exact in NetBox (Customization → Custom Fields)",
        )
    await _ensure_field(client, CLAIM_REF_FIELD, calls.CLAIM_REF_FIELD_BODY, "filter logic Exact")
    await _ensure_field(client, CLUSTER_IDENTITY_FIELD, calls.CLUSTER_IDENTITY_FIELD_BODY, "filter logic Exact")
    return Ownership(int(tag["id"]), bool(field.get("unique")))


def _choice(value: Any) -> Any:
    """A NetBox choice field's value (`{"value": …, "label": …}` in answers, or the plain value)."""
    return value.get("value") if isinstance(value, dict) else value


async def _ensure_field(client: NetboxClient, name: str, body: Mapping[str, Any], how: str) -> dict[str, Any]:
    """The custom field `name` on IP addresses, of type Text; created when missing."""
    field = await _ensure(
        client,
        f"the custom field {name}",
        calls.find("extras", "custom_fields", {"name": name}, brief=False),
        calls.create("extras", "custom_fields", body),
        lambda error: PoolUnusableError(
            reasons.CUSTOM_FIELD_MISSING,
            f"the custom field {name!r} does not exist in NetBox and this token may not create it "
            f"({error.message}); create it in NetBox (Customization → Custom Fields): name {name!r}, "
            f"type Text, object type IPAM > IP Address, {how}; or give the token the permission "
            "extras.add_customfield",
        ),
    )
    kind_value = _choice(field.get("type"))
    if kind_value != "text" or "ipam.ipaddress" not in (field.get("object_types") or []):
        raise PoolUnusableError(
            reasons.CUSTOM_FIELD_INVALID,
            f"the NetBox custom field {name!r} must be of type Text and apply to IPAM > IP Address "
            f"(it is {kind_value!r} on {', '.join(field.get('object_types') or []) or 'no object type'}); fix it in "
            "NetBox (Customization → Custom Fields)",
        )
    return field


async def _ensure(
    client: NetboxClient,
    what: str,
    lookup: calls.Call,
    create: calls.Call,
    refused: Callable[[HTTPError], PoolUnusableError],
) -> dict[str, Any]:
    """The object `lookup` finds, created with `create` when there is none (a concurrent creator wins too)."""
    found = await client.call(f"look up {what}", lookup)
    if found:
        return dict(found[0])
    try:
        return dict(await client.call(f"create {what}", create, idempotent=False))
    except (HTTPError, OutcomeUnknownError) as error:
        if isinstance(error, HTTPError) and not (error.auth or error.invalid):
            raise
        # Created meanwhile by another controller (NetBox answers 400, or 500 when the two inserts race), or
        # our own create went through although its answer was lost?
        found = await client.call(f"look up {what}", lookup)
        if found:
            return dict(found[0])
        if isinstance(error, OutcomeUnknownError):
            raise
        raise refused(error) from error


async def resolve_pool(client: NetboxClient, pool: Pool, ownership: Ownership) -> Resolved:
    """Ids and extents of every source, and the tenant's and tags' ids, checked for what NetBox does not check;
    PoolUnusableError for anything missing."""
    sources = [await _resolve_source(client, pool, index, ref) for index, ref in enumerate(pool.sources)]
    _check_sources(pool, sources)
    await _check_gateways(client, pool, sources)
    tenant_id = None
    fields = pool.fields
    if fields.tenant:
        found = await client.call("look up the tenant", calls.find("tenancy", "tenants", {"slug": fields.tenant}))
        if not found:
            raise PoolUnusableError(
                reasons.OBJECT_NOT_FOUND,
                f"{pool.ref}: spec.addressFields.tenant names tenant slug {fields.tenant!r}, which NetBox does not "
                "have; create the tenant or fix the slug",
            )
        tenant_id = int(found[0]["id"])
    tag_ids: tuple[int, ...] = ()
    if fields.tags:
        found = await client.call("look up the tags", calls.find("extras", "tags", {"slug": list(fields.tags)}))
        by_slug = {t["slug"]: int(t["id"]) for t in found}
        missing = [slug for slug in fields.tags if slug not in by_slug]
        if missing:
            raise PoolUnusableError(
                reasons.OBJECT_NOT_FOUND,
                f"{pool.ref}: spec.addressFields.tags names {', '.join(missing)}, which NetBox does not have; create "
                "the tags in NetBox or remove them from the pool",
            )
        tag_ids = tuple(by_slug[slug] for slug in fields.tags)
    return Resolved(ownership, tuple(sources), tenant_id, tag_ids)


async def _resolve_source(client: NetboxClient, pool: Pool, index: int, ref: SourceRef) -> Source:
    where = f"{pool.ref}: spec.sources[{index}] ({ref})"
    if ref.id is not None:
        found = await client.call(f"GET {ref}", calls.get("ipam", calls.SOURCE_ENDPOINTS[ref.type], ref.id))
        matches = [found] if found is not None else []
    else:
        vrf_id = ref.vrf_id
        if ref.vrf_id is None and ref.vrf is not None:
            found = await client.call(f"look up VRF {ref.vrf}", calls.find("ipam", "vrfs", {"name": ref.vrf}))
            if len(found) != 1:
                state = "does not exist" if not found else f"is ambiguous ({len(found)} VRFs have that name; use vrfID)"
                raise PoolUnusableError(reasons.OBJECT_NOT_FOUND, f"{where}: VRF {ref.vrf!r} {state} in NetBox")
            vrf_id = int(found[0]["id"])
        filters: dict[str, Any] = {"vrf_id": calls.vrf_filter(vrf_id)}
        if ref.type == "prefix":
            filters["prefix"] = ref.value
        else:
            start, _, end = (ref.value or "").partition("-")
            filters.update(start_address=start, end_address=end)
        lookup = calls.find("ipam", calls.SOURCE_ENDPOINTS[ref.type], filters, brief=False)
        matches = await client.call(f"look up {ref}", lookup)
    if not matches:
        raise PoolUnusableError(
            reasons.SOURCE_NOT_FOUND,
            f"{where} does not exist in NetBox at {client.endpoint.display_url}; create it or fix the pool's sources",
        )
    if len(matches) > 1:
        raise PoolUnusableError(
            reasons.SOURCE_NOT_FOUND,
            f"{where} matches {len(matches)} objects in NetBox (ids {', '.join(str(m['id']) for m in matches)}); "
            "name it by id",
        )
    return source_from(ref, index, matches[0])


def _check_sources(pool: Pool, sources: Sequence[Source]) -> None:
    """One IP family per pool (the CAPI contract is single-stack); gateways and prefix lengths of the source's
    family."""
    if len({s.first.version for s in sources}) > 1:
        raise PoolUnusableError(
            reasons.INVALID, f"{pool.ref}: its sources mix IPv4 and IPv6 in NetBox; make one pool per IP family"
        )
    for source in sources:
        where = f"{pool.ref}: spec.sources[{source.index}] ({source.display})"
        gateway = source.ref.gateway  # a plain IP address: the spec checked it
        if gateway is not None and ipaddress.ip_address(gateway).version != source.first.version:
            raise PoolUnusableError(reasons.INVALID, f"{where}: the gateway {gateway} is not of the source's IP family")
        length, longest = source.ref.prefix_length, 32 if source.first.version == 4 else 128
        if length is not None and length > longest:
            raise PoolUnusableError(
                reasons.INVALID,
                f"{where}: prefixLength {length} is longer than an IPv{source.first.version} address (at most "
                f"{longest}); fix spec.sources[{source.index}].prefixLength or spec.prefixLength",
            )


async def _check_gateways(client: NetboxClient, pool: Pool, sources: Sequence[Source]) -> None:
    """Every gateway NetBox could hand out from its source is recorded in NetBox (in the source's VRF)."""
    for source in sources:
        gateway = source.ref.gateway
        if gateway is None or not source.offers(gateway):
            continue
        found = await client.call(f"look up the gateway {gateway}", calls.find_address(gateway, source.vrf_id))
        if not found:
            vrf = f"VRF #{source.vrf_id}" if source.vrf_id is not None else "the global table"
            raise PoolUnusableError(
                reasons.GATEWAY_NOT_RECORDED,
                f"{pool.ref}: the gateway {gateway} of spec.sources[{source.index}] lies in {source.display}, and "
                f"NetBox holds no IP address for it, so NetBox could hand it to a machine; record {gateway}/"
                f"{source.mask} in NetBox (IPAM → IP Addresses, in {vrf}), or use a gateway outside the source",
            )


def source_from(ref: SourceRef, index: int, obj: dict[str, Any]) -> Source:
    """A Source from its NetBox prefix or ip-range object."""
    if ref.type == "prefix":
        network = ipaddress.ip_network(str(obj["prefix"]), strict=False)
        first, last, mask = network.network_address, network.broadcast_address, network.prefixlen
        # NetBox never hands out its network address, nor an IPv4 prefix's broadcast address, unless the prefix is a
        # pool or has no room for them (/31, /32; /127, /128).
        reserved: tuple[IPAddr, ...] = ()
        if not obj.get("is_pool") and mask < (31 if network.version == 4 else 127):
            reserved = (first, last) if network.version == 4 else (first,)
        total = network.num_addresses - len(reserved)
    else:
        start = ipaddress.ip_interface(str(obj["start_address"]))
        end = ipaddress.ip_interface(str(obj["end_address"]))
        first, last, mask = start.ip, end.ip, start.network.prefixlen
        total = 0 if obj.get("mark_populated") else int(last) - int(first) + 1
        reserved = ()
    return Source(ref, index, int(obj["id"]), first, last, mask, vrf_id_of(obj), total, reserved)


def vrf_id_of(obj: Mapping[str, Any]) -> int | None:
    """The id of a NetBox IP address's (or prefix's, ip-range's) VRF (None: the global table)."""
    vrf = obj.get("vrf")
    if isinstance(vrf, Mapping):
        return int(vrf["id"]) if vrf.get("id") is not None else None
    return int(vrf) if isinstance(vrf, int) else None


async def usage(client: NetboxClient, sources: Sequence[Source]) -> list[int]:
    """How many IP addresses NetBox holds in each source (any owner; at most its total), one counting GET each."""
    used = []
    for source in sources:
        filters = {"parent": source.networks(), "vrf_id": calls.vrf_filter(source.vrf_id)}
        count = await client.call(f"count the addresses of {source.ref}", calls.count_addresses(filters))
        used.append(min(count, source.total))
    return used


async def offered_by(client: NetboxClient, resolved: Resolved, address: str) -> tuple[Source | None, str]:
    """`Resolved.offering`, and for a prefix source one GET more: an address in an ip-range marked populated in the
    source's VRF is not the pool's to hand out (NetBox's available-ips of a prefix skips it)."""
    source, why = resolved.offering(address)
    if source is None or source.ref.type != "prefix":
        return source, why
    why = populated_why(await populated_ranges(client, source.vrf_id), address, source)
    return (None, why) if why else (source, "")


async def populated_ranges(client: NetboxClient, vrf_id: int | None) -> list[Object]:
    """The ip-ranges marked populated in the VRF (None: the global table), with one GET."""
    # Not `contains=`: NetBox compares it with the ranges' masks too, so a bare address misses its range.
    filters = {"mark_populated": "true", "vrf_id": calls.vrf_filter(vrf_id)}
    found = await client.call("look up populated ip-ranges", calls.find("ipam", "ip_ranges", filters, brief=False))
    return [obj for obj in found if obj.get("mark_populated")]


def populated_why(ranges: Sequence[Object], address: str, source: Source) -> str:
    """Why `address` of the prefix `source` is not the pool's: the range of `ranges` that holds it ("": none)."""
    parsed = ipaddress.ip_address(address)
    for obj in ranges:
        first, last = (ipaddress.ip_interface(str(obj[key])).ip for key in ("start_address", "end_address"))
        if first.version == last.version == parsed.version and int(first) <= int(parsed) <= int(last):
            return f"in ip-range {first}-{last} of {source.display}, marked populated: NetBox hands out none of it"
    return ""


class Resolver:
    """The NetBox side of every pool: its parsed spec (the last good one is kept, for releases after the pool is
    gone), its client lent per operation, and what `resolve_pool` and `ensure_ownership` found."""

    def __init__(self, connections: Connections, ownership_seconds: float) -> None:
        self.connections = connections
        self.ownership_seconds = ownership_seconds
        self.known: dict[PoolRef, Pool] = {}  # the last good spec `parse` saw of each pool
        self._resolved: dict[PoolRef, tuple[tuple[str, int], NetboxClient, Resolved]] = {}  # by (uid, generation)
        self._ownership_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    def parse(self, pool_ref: PoolRef, pool: Object) -> Pool:
        """The pool's spec, remembered as the last good one; PoolUnusableError (InvalidConfiguration) if invalid."""
        try:
            parsed = parse_pool(pool_ref, pool)
        except PoolSpecError as error:
            message = f"{pool_ref} is invalid: {error}; fix the pool's spec"
            raise PoolUnusableError(reasons.INVALID, message) from error
        self.known[parsed.ref] = parsed
        return parsed

    @contextlib.asynccontextmanager
    async def session(self, pool: Pool, doing: str) -> AsyncIterator[NetboxClient]:
        """`pool`'s client, lent for one operation. A failure of one of `reasons.CAUGHT` becomes PoolUnusableError
        (its message begins with "`doing` <pool>"), and every PoolUnusableError first drops what it may have made
        stale: the resolved pool, and on an authentication failure the Secret and the client's ownership marks."""
        client: NetboxClient | None = None
        try:
            try:
                async with self.connections.use(pool) as client:
                    yield client
            except reasons.CAUGHT as error:
                token = client.endpoint.token if client is not None else None
                raise reasons.of_failure(error, f"{doing} {pool.ref}", token) from error
        except PoolUnusableError as problem:
            self._resolved.pop(pool.ref, None)
            if problem.reason == reasons.AUTH_FAILED:
                self.connections.invalidate(pool)
                if client is not None:
                    client.ownership = None
            raise

    async def ownership(self, client: NetboxClient, *, any_age: bool = False) -> Ownership:
        """The ownership marks of `client`'s NetBox, checked (and created) by one pool at a time; with `any_age`, a
        cached answer of any age. The answer is kept on the client, so it goes with it."""
        async with self._one_at_a_time(client.endpoint.url):
            cached = client.ownership
            if cached is not None and (any_age or time.monotonic() - cached[0] < self.ownership_seconds):
                return cached[1]
            ownership = await ensure_ownership(client)
            client.ownership = (time.monotonic(), ownership)
            return ownership

    @contextlib.asynccontextmanager
    async def _one_at_a_time(self, url: str) -> AsyncIterator[None]:
        """Hold the lock of `url`, made for the first holder and dropped after the last (a failure's traceback
        keeps nothing of it alive)."""
        lock, users = self._ownership_locks.setdefault(url, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._ownership_locks[url]

    async def resolve(
        self, client: NetboxClient, pool: Pool, *, fresh: bool = False, pacer: Pacer | None = None
    ) -> Resolved:
        """The pool's NetBox ids, cached per pool object (UID), generation and client; `fresh` asks NetBox again.
        When NetBox is asked, `pacer` (if any) is waited for once first (for the few GETs)."""
        version = (pool.uid, pool.generation)
        cached = self._resolved.get(pool.ref)
        if not fresh and cached is not None and cached[0] == version and cached[1] is client:
            return cached[2]
        if pacer is not None:
            await pacer.wait()
        resolved = await resolve_pool(client, pool, await self.ownership(client))
        self._resolved[pool.ref] = (version, client, resolved)
        return resolved

    def forget(self, pool_ref: PoolRef) -> None:
        """The pool is gone: its resolved ids go, its connection if no other pool uses it, and its last good spec in
        `known`. A deleted pool keeps its finalizer while IPAddresses name it, so its releases come before; one that
        comes after finds no spec (ReleaseImpossible: the repair loop finds the address)."""
        self._resolved.pop(pool_ref, None)
        self.known.pop(pool_ref, None)
        self.connections.forget(pool_ref)

    async def close(self) -> None:
        self._resolved.clear()
        await self.connections.close()
