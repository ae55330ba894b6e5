"""What a pool's spec names in NetBox: the ownership marks, the sources, the tenant and tags; and their usage.

Contract:
- `ensure_ownership` makes sure the owner tag and the three custom fields (claim UID, claim namespace/name, the
  management cluster's identity) exist,
  creating them when missing. A custom field that cannot be created (no permission) or has the wrong shape (not
  Text on IP addresses; for the UID field, a filter logic other than Exact or Loose, which would make NetBox
  ignore the lookup by UID) is a Problem whose message says how to fix it by hand. A UID field without `unique`
  still works, but costs a lookup per allocation (see allocator).
- `resolve` turns every source (by id, by CIDR/VRF, by start-end/VRF), the tenant and the tags into ids, in a few
  GETs. The allocator caches the result per pool generation and client; the periodic report resolves afresh.
  It also checks what NetBox cannot: one IP family per pool, gateways and prefix lengths of the source's family,
  and that a gateway inside a source NetBox could hand out is recorded in NetBox (one GET per such gateway), so
  that available-ips never offers it (else Problem GatewayNotRecorded).
- `usage` counts, per source, the IP addresses NetBox holds in it (one GET with limit=1 per source).
- Everything raises Problem (pool-level, with a reason) or NetboxError (from the client).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.netbox import calls, problems
from backends.netbox.client import HTTPError, NetboxClient, OutcomeUnknownError
from backends.netbox.problems import Problem
from backends.netbox.spec import CLAIM_REF_FIELD, CLAIM_UID_FIELD, CLUSTER_IDENTITY_FIELD, OWNER_TAG, Pool, SourceRef
from ipam_provider.common import cap_int64

IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Ownership:
    owner_tag_id: int
    uid_unique: bool  # NetBox itself refuses a second address for one claim UID


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
    reserved: tuple[IPAddr, ...] = ()  # addresses in it that NetBox never hands out (network, broadcast, anycast)

    @property
    def type(self) -> str:
        return self.ref.type

    @property
    def display(self) -> str:
        if self.type == "prefix":
            return f"{self.first}/{self.mask}"
        return f"{self.first}-{self.last}"

    def contains(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return ip.version == self.first.version and int(self.first) <= int(ip) <= int(self.last)

    def offers(self, address: str) -> bool:
        """Whether NetBox's available-ips could hand out `address` from this source (if it were free)."""
        return self.total > 0 and self.contains(address) and ipaddress.ip_address(address) not in self.reserved

    def networks(self) -> list[IPNet]:
        return list(ipaddress.summarize_address_range(self.first, self.last))


@dataclass(frozen=True)
class Resolved:
    ownership: Ownership
    sources: tuple[Source, ...]
    tenant_id: int | None
    tag_ids: tuple[int, ...]

    def source_of(self, address: str) -> Source | None:
        return next((s for s in self.sources if s.contains(address)), None)


async def ensure_ownership(client: NetboxClient) -> Ownership:
    """The owner tag's id and whether the claim-UID field is unique; creates what is missing (the tag and the three
    custom fields)."""
    tag = await _ensure(
        client,
        "the owner tag",
        calls.find("extras", "tags", {"slug": OWNER_TAG}),
        calls.create("extras", "tags", calls.OWNER_TAG_BODY),
        lambda error: Problem(
            problems.TAG_MISSING,
            f"the tag {OWNER_TAG!r} does not exist in NetBox and this token may not create it ({error.message}); "
            f"create it in NetBox (Customization → Tags: name and slug {OWNER_TAG!r})",
        ),
    )
    unique = "Unique checked, filter logic Exact"
    field = await _ensure_field(client, CLAIM_UID_FIELD, calls.CLAIM_UID_FIELD_BODY, unique)
    logic = _choice(field.get("filter_logic"))
    if logic not in ("exact", "loose"):
        raise Problem(
            problems.CUSTOM_FIELD_INVALID,
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
        lambda error: Problem(
            problems.CUSTOM_FIELD_MISSING,
            f"the custom field {name!r} does not exist in NetBox and this token may not create it "
            f"({error.message}); create it in NetBox (Customization → Custom Fields): name {name!r}, "
            f"type Text, object type IPAM > IP Address, {how}; or give the token the permission "
            "extras.add_customfield",
        ),
    )
    kind_value = _choice(field.get("type"))
    if kind_value != "text" or "ipam.ipaddress" not in (field.get("object_types") or []):
        raise Problem(
            problems.CUSTOM_FIELD_INVALID,
            f"the NetBox custom field {name!r} must be of type Text and apply to IPAM > IP Address "
            f"(it is {kind_value!r} on {', '.join(field.get('object_types') or []) or 'no object type'}); fix it in "
            "NetBox (Customization → Custom Fields)",
        )
    return field


async def _ensure(
    client: NetboxClient, what: str, lookup: calls.Call, create: calls.Call, refused: Callable[[HTTPError], Problem]
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


async def resolve(client: NetboxClient, pool: Pool, ownership: Ownership) -> Resolved:
    """Ids and extents of every source, and the tenant's and tags' ids; Problem for anything missing."""
    sources = []
    for index, ref in enumerate(pool.sources):
        sources.append(await _resolve_source(client, pool, index, ref))
    _check_sources(pool, sources)
    await _check_gateways(client, pool, sources)
    tenant_id = None
    fields = pool.fields
    if fields.tenant:
        found = await client.call("look up the tenant", calls.find("tenancy", "tenants", {"slug": fields.tenant}))
        if not found:
            raise Problem(
                problems.OBJECT_NOT_FOUND,
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
            raise Problem(
                problems.OBJECT_NOT_FOUND,
                f"{pool.ref}: spec.addressFields.tags names {', '.join(missing)}, which NetBox does not have; create "
                "the tags in NetBox or remove them from the pool",
            )
        tag_ids = tuple(by_slug[slug] for slug in fields.tags)
    return Resolved(ownership, tuple(sources), tenant_id, tag_ids)


async def _resolve_source(client: NetboxClient, pool: Pool, index: int, ref: SourceRef) -> Source:
    where = f"{pool.ref}: spec.sources[{index}] ({ref})"
    if ref.id is not None:
        found = await client.call(f"GET {ref}", calls.get_source(ref.type, ref.id))
        matches = [found] if found is not None else []
    else:
        vrf_id = await _vrf_id(client, where, ref)
        filters: dict[str, Any] = {"vrf_id": vrf_id if vrf_id is not None else "null"}
        if ref.type == "prefix":
            filters["prefix"] = ref.value
        else:
            start, _, end = (ref.value or "").partition("-")
            filters.update(start_address=start, end_address=end)
        matches = await client.call(f"look up {ref}", calls.find_sources(ref.type, filters))
    if not matches:
        raise Problem(
            problems.SOURCE_NOT_FOUND,
            f"{where} does not exist in NetBox at {client.endpoint.display_url}; create it or fix the pool's sources",
        )
    if len(matches) > 1:
        raise Problem(
            problems.SOURCE_NOT_FOUND,
            f"{where} matches {len(matches)} objects in NetBox (ids {', '.join(str(m['id']) for m in matches)}); "
            "name it by id",
        )
    return source_from(ref, index, matches[0])


def _check_sources(pool: Pool, sources: Sequence[Source]) -> None:
    """One IP family per pool (the CAPI contract is single-stack); gateways and prefix lengths of the source's
    family."""
    if len({s.first.version for s in sources}) > 1:
        raise Problem(
            problems.INVALID, f"{pool.ref}: its sources mix IPv4 and IPv6 in NetBox; make one pool per IP family"
        )
    for source in sources:
        where = f"{pool.ref}: spec.sources[{source.index}] ({source.display})"
        gateway = source.ref.gateway
        gateway_version: int | None
        try:
            gateway_version = ipaddress.ip_address(gateway).version if gateway is not None else None
        except ValueError:
            gateway_version = 0
        if gateway_version not in (None, source.first.version):
            raise Problem(problems.INVALID, f"{where}: the gateway {gateway} is not of the source's IP family")
        length, longest = source.ref.prefix_length, 32 if source.first.version == 4 else 128
        if length is not None and length > longest:
            raise Problem(
                problems.INVALID,
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
            raise Problem(
                problems.GATEWAY_NOT_RECORDED,
                f"{pool.ref}: the gateway {gateway} of spec.sources[{source.index}] lies in {source.display}, and "
                f"NetBox holds no IP address for it, so NetBox could hand it to a machine; record {gateway}/"
                f"{source.mask} in NetBox (IPAM → IP Addresses, in {vrf}), or use a gateway outside the source",
            )


async def _vrf_id(client: NetboxClient, where: str, ref: SourceRef) -> int | None:
    if ref.vrf_id is not None or ref.vrf is None:
        return ref.vrf_id
    found = await client.call(f"look up VRF {ref.vrf}", calls.find("ipam", "vrfs", {"name": ref.vrf}))
    if len(found) != 1:
        state = "does not exist" if not found else f"is ambiguous ({len(found)} VRFs have that name; use vrfID)"
        raise Problem(problems.OBJECT_NOT_FOUND, f"{where}: VRF {ref.vrf!r} {state} in NetBox")
    return int(found[0]["id"])


def source_from(ref: SourceRef, index: int, obj: dict[str, Any]) -> Source:
    """A Source from its NetBox prefix or ip-range object."""
    vrf = obj.get("vrf")
    vrf_id = int(vrf["id"]) if isinstance(vrf, dict) and vrf.get("id") is not None else None
    if ref.type == "prefix":
        network = ipaddress.ip_network(str(obj["prefix"]), strict=False)
        first, last, mask = network.network_address, network.broadcast_address, network.prefixlen
        total = _usable(network, bool(obj.get("is_pool")))
        reserved = _reserved(network, bool(obj.get("is_pool")))
    else:
        start = ipaddress.ip_interface(str(obj["start_address"]))
        end = ipaddress.ip_interface(str(obj["end_address"]))
        first, last, mask = start.ip, end.ip, start.network.prefixlen
        total = 0 if obj.get("mark_populated") else int(last) - int(first) + 1
        reserved = ()
    return Source(ref, index, int(obj["id"]), first, last, mask, vrf_id, total, reserved)


def _reserved(network: IPNet, is_pool: bool) -> tuple[IPAddr, ...]:
    """The addresses of a prefix NetBox never hands out (the ones `_usable` does not count)."""
    if is_pool or network.prefixlen >= (31 if network.version == 4 else 127):
        return ()
    if network.version == 4:
        return (network.network_address, network.broadcast_address)
    return (network.network_address,)


def _usable(network: IPNet, is_pool: bool) -> int:
    """How many addresses NetBox hands out from a prefix (its rules for network, broadcast and anycast)."""
    size = network.num_addresses
    if is_pool:
        return size
    if network.version == 4:
        return size if network.prefixlen >= 31 else size - 2
    return size if network.prefixlen >= 127 else size - 1


@dataclass(frozen=True)
class Usage:
    source: Source
    used: int

    @property
    def free(self) -> int:
        return max(self.source.total - self.used, 0)

    def wire(self) -> dict[str, Any]:
        return {
            "type": self.source.type,
            "id": self.source.id,
            "range": self.source.display,
            "total": cap_int64(self.source.total),
            "used": cap_int64(self.used),
            "free": cap_int64(self.free),
        }


async def usage(client: NetboxClient, sources: Sequence[Source]) -> list[Usage]:
    """The IP addresses NetBox holds in each source (any owner), one counting GET per source."""
    result = []
    for source in sources:
        filters = {
            "parent": [str(n) for n in source.networks()],
            "vrf_id": source.vrf_id if source.vrf_id is not None else "null",
        }
        used = await client.call(f"count the addresses of {source.ref}", calls.count_addresses(filters))
        result.append(Usage(source, min(used, source.total)))
    return result
