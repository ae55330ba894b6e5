"""The grid objects this backend writes: payloads, return fields, and parsing what the grid answers.

Every object carries the ownership extensible attributes: CAPI-Claim-UID (the claim's uid: the one attribute
ownership is decided on), CAPI-Claim-Namespace, CAPI-Claim-Name, CAPI-Cluster-Name (when the claim names a
cluster), CAPI-Pool (`<namespace>/<pool name>`, what the per-pool index searches on) and CAPI-Cluster-Identity
when the grid defines it (the management cluster that made it: `identity`), plus the pool's own extra attributes.
A gateway reservation (see `allocator`) carries CAPI-Pool only (`gateway_marks`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.infoblox.spec import (
    EA_CLAIM_NAME,
    EA_CLAIM_NAMESPACE,
    EA_CLAIM_UID,
    EA_CLUSTER_NAME,
    EA_POOL,
    HOST_RECORD,
    Pool,
    Target,
)
from ipam_provider.backend.contract import ClaimContext

FIXED_V4, FIXED_V6, HOST = "fixedaddress", "ipv6fixedaddress", "record:host"
ALL_TYPES = (FIXED_V4, FIXED_V6, HOST)
ZERO_MAC = "00:00:00:00:00:00"
RETURN_FIELDS = {
    FIXED_V4: ("ipv4addr", "network_view", "extattrs", "comment"),
    FIXED_V6: ("ipv6addr", "network_view", "extattrs", "comment"),
    HOST: ("name", "view", "ipv4addrs", "ipv6addrs", "extattrs", "comment"),
}


@dataclass(frozen=True)
class GridObject:
    """A fixed address or host record as the grid answered it."""

    ref: str
    obj_type: str
    address: str
    extattrs: Mapping[str, str]
    name: str | None = None
    comment: str = ""

    @property
    def claim_uid(self) -> str | None:
        return self.extattrs.get(EA_CLAIM_UID)

    @property
    def requested(self) -> bool:
        """Whether the object was made for a requested address (its keep-if-alone check may not have run)."""
        return self.comment.startswith(REQUESTED_COMMENT)


def object_type(pool: Pool) -> str:
    if pool.spec.mode == HOST_RECORD:
        return HOST
    return FIXED_V4 if pool.version == 4 else FIXED_V6


def types_for_version(version: int | None) -> tuple[str, ...]:
    """Every type an object of this IP family (None: any) could have been created as."""
    if version == 4:
        return (FIXED_V4, HOST)
    if version == 6:
        return (FIXED_V6, HOST)
    return ALL_TYPES


def next_available(target: Target, network_view: str) -> str:
    return f"func:nextavailableip:{target.argument},{network_view}"


def ownership_extattrs(pool: Pool, claim: ClaimContext, stamp: Mapping[str, str] | None = None) -> dict[str, str]:
    """The pool's extra attributes, the claim's ownership attributes, and `stamp` (the management cluster's
    CAPI-Cluster-Identity when the grid defines it: see `identity.ClusterStamp`)."""
    eas = dict(pool.spec.extensible_attributes)
    eas.update(stamp or {})
    eas.update(
        {
            EA_CLAIM_UID: claim.uid,
            EA_CLAIM_NAMESPACE: claim.namespace,
            EA_CLAIM_NAME: claim.name,
            EA_POOL: pool.label,
        }
    )
    if claim.cluster_name:
        eas[EA_CLUSTER_NAME] = claim.cluster_name
    return eas


def wapi_extattrs(eas: Mapping[str, str]) -> dict[str, dict[str, str]]:
    return {name: {"value": value} for name, value in eas.items()}


@dataclass(frozen=True)
class Marks:
    """What an object this backend writes carries besides its address: its extensible attributes, its comment,
    and the identity an ipv6fixedaddress's DUID is derived from."""

    extattrs: Mapping[str, str]
    comment: str
    identity: str


def claim_marks(
    pool: Pool, claim: ClaimContext, *, requested: bool = False, stamp: Mapping[str, str] | None = None
) -> Marks:
    """The marks of an object held for `claim`: the ownership attributes (with `stamp`) and the pool's own."""
    return Marks(ownership_extattrs(pool, claim, stamp), claim_comment(claim, requested=requested), claim.uid)


def gateway_marks(pool: Pool) -> Marks:
    """The marks of the reservation that keeps the pool's gateway from being handed out: CAPI-Pool only."""
    comment = f"Gateway of InfobloxIPPool {pool.label}, reserved so the Cluster API IPAM provider skips it"
    return Marks({EA_POOL: pool.label}, comment, pool.uid)


def fixed_payload(pool: Pool, address: str, network_view: str, marks: Marks) -> dict[str, Any]:
    """A fixedaddress (MAC of zeros: a reservation no DHCP client matches) or an ipv6fixedaddress (a DUID-UUID
    derived from the marks' identity, so that no two objects share one)."""
    payload: dict[str, Any] = {
        "network_view": network_view,
        "comment": marks.comment,
        "extattrs": wapi_extattrs(marks.extattrs),
    }
    if pool.version == 4:
        payload.update(ipv4addr=address, mac=ZERO_MAC)
    else:
        payload.update(ipv6addr=address, duid=duid_for(marks.identity))
    return payload


def host_payload(pool: Pool, address: str, fqdn: str, dns_view: str, marks: Marks) -> dict[str, Any]:
    """A record:host named `fqdn` in `dns_view`, registered in DNS as the pool's hostRecord.configureForDNS says."""
    assert pool.spec.host_record is not None
    entry_key, list_key = ("ipv4addr", "ipv4addrs") if pool.version == 4 else ("ipv6addr", "ipv6addrs")
    return {
        "name": fqdn,
        "view": dns_view,
        "configure_for_dns": pool.spec.host_record.configure_for_dns,
        list_key: [{entry_key: address}],
        "comment": marks.comment,
        "extattrs": wapi_extattrs(marks.extattrs),
    }


REQUESTED_COMMENT = "Cluster API IPAddressClaim, requested address: "


def claim_comment(claim: ClaimContext, *, requested: bool = False) -> str:
    """The object's comment; an object made for a requested address says so (`GridObject.requested`)."""
    lead = REQUESTED_COMMENT if requested else "Cluster API IPAddressClaim "
    return f"{lead}{claim.namespace}/{claim.name}"[:256]


def duid_for(identity: str) -> str:
    """A DUID-UUID (RFC 6355: type 4 followed by 16 octets) for a claim uid or any other identity."""
    try:
        value = uuid.UUID(identity)
    except ValueError:
        value = uuid.uuid5(uuid.NAMESPACE_URL, identity)
    return ":".join(f"{octet:02x}" for octet in b"\x00\x04" + value.bytes)


def parse_object(obj_type: str, raw: Mapping[str, Any]) -> GridObject | None:
    """A GridObject from a WAPI answer (None if it carries no address)."""
    ref = raw.get("_ref")
    if not isinstance(ref, str):
        return None
    address: Any = None
    if obj_type == FIXED_V4:
        address = raw.get("ipv4addr")
    elif obj_type == FIXED_V6:
        address = raw.get("ipv6addr")
    else:
        entries = [e for key in ("ipv4addrs", "ipv6addrs") for e in _list(raw.get(key)) if isinstance(e, Mapping)]
        if entries:
            address = entries[0].get("ipv4addr") or entries[0].get("ipv6addr")
    if not isinstance(address, str):
        return None
    extattrs = raw.get("extattrs")
    eas = {
        str(name): str(entry.get("value")) if isinstance(entry, Mapping) else str(entry)
        for name, entry in (extattrs.items() if isinstance(extattrs, Mapping) else ())
    }
    name, comment = raw.get("name"), raw.get("comment")
    return GridObject(
        ref,
        obj_type,
        address,
        eas,
        str(name) if isinstance(name, str) else None,
        comment if isinstance(comment, str) else "",
    )


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def type_of_ref(ref: str) -> str:
    return ref.split("/", 1)[0]
