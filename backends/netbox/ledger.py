"""The NetBox IP addresses of ours, and what this controller remembers of them per pool.

An address of ours carries both ownership marks: the owner tag and the claim's UID in the custom field
capi_claim_uid; it also records the claim's namespace/name (capi_claim_ref) and, when known, the management
cluster's identity (capi_cluster_identity). Only addresses carrying both marks are ever changed or deleted.
`Ledger` reads and writes them. A deletion updates the pool's `PoolIndex` in the same method; an address enters
it (`hold`) once the caller checked it is the claim's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from backends.netbox import calls
from backends.netbox.client import NetboxClient
from backends.netbox.resolver import Resolved, Source
from backends.netbox.spec import (
    ANNOTATION_CLAIM_UID,
    ANNOTATION_IP_ID,
    CLAIM_REF_FIELD,
    CLAIM_UID_FIELD,
    CLUSTER_IDENTITY_FIELD,
    DEFAULT_DESCRIPTION,
    OWNER_TAG,
    Pool,
    render,
)
from ipam_provider.backend.contract import Allocation, AllocationFailedError, ClaimContext, PoolRef
from ipam_provider.common import Object, normalized_address

log = structlog.get_logger(__name__)

REQUESTED_MARK = " [requested address]"  # ends the description of an address made at a requested address


def host_of(obj: Mapping[str, Any]) -> str:
    """The address of a NetBox IP address, without its mask."""
    return str(ipaddress.ip_interface(str(obj["address"])).ip)


def uid_of(obj: Mapping[str, Any]) -> Any:
    """The claim UID a NetBox IP address records (None when it records none)."""
    return (obj.get("custom_fields") or {}).get(CLAIM_UID_FIELD)


def claim_ref(claim: ClaimContext) -> str:
    """What the custom field capi_claim_ref records: the claim's "<namespace>/<name>"."""
    return f"{claim.namespace}/{claim.name}"


def claim_ref_of(obj: Mapping[str, Any]) -> str | None:
    """The "<namespace>/<name>" of the claim a NetBox IP address was made for, if recorded."""
    value = (obj.get("custom_fields") or {}).get(CLAIM_REF_FIELD)
    return str(value) if value else None


def is_ours(obj: Mapping[str, Any], claim_uid: str | None = None) -> bool:
    """Whether a NetBox IP address carries our ownership marks (for `claim_uid`, when given)."""
    slugs = {tag.get("slug") for tag in obj.get("tags") or [] if isinstance(tag, Mapping)}
    uid = uid_of(obj)
    return OWNER_TAG in slugs and bool(uid) and (claim_uid is None or uid == claim_uid)


def allocation_of(resolved: Resolved, obj: Mapping[str, Any], uid: str, source: Source | None = None) -> Allocation:
    """The Allocation for a NetBox IP address: the source's prefix-length override and gateway apply."""
    interface = ipaddress.ip_interface(str(obj["address"]))
    source = source or resolved.source_of(str(interface.ip))
    prefix, gateway = interface.network.prefixlen, None
    if source is not None:
        prefix = source.ref.prefix_length if source.ref.prefix_length is not None else prefix
        gateway = source.ref.gateway
    annotations = {ANNOTATION_IP_ID: str(obj["id"]), ANNOTATION_CLAIM_UID: uid}
    return Allocation(str(interface.ip), prefix, gateway, annotations)


@dataclass
class PoolIndex:
    """What this controller remembers about one pool between calls."""

    exhausted: dict[int, float] = field(default_factory=dict)  # source id → when it answered 409
    by_claim: dict[str, tuple[int, str]] = field(default_factory=dict)  # claim uid → (NetBox id, address)
    uncertain: dict[str, float] = field(default_factory=dict)  # claim uid → when its POST's outcome became unknown


class Ledger:
    """Our NetBox IP addresses, read and written (see the module)."""

    def __init__(self, cluster_identity: str = "") -> None:
        self.cluster_identity = cluster_identity  # "" (unknown): nothing is stamped
        self.identity = {CLUSTER_IDENTITY_FIELD: cluster_identity} if cluster_identity else {}  # the field naming it
        self._indexes: dict[PoolRef, PoolIndex] = {}

    def index(self, ref: PoolRef) -> PoolIndex:
        return self._indexes.setdefault(ref, PoolIndex())

    def forget(self, ref: PoolRef) -> None:
        """The pool is gone: what was remembered of its addresses goes."""
        self._indexes.pop(ref, None)

    def forget_address(self, ref: PoolRef, uid: str, address_id: int) -> None:
        """NetBox address `address_id` of the claim `uid` is gone: if it is the one remembered for the claim, that and
        a lost POST of it go; a claim remembered holding another address keeps both."""
        index = self._indexes.get(ref)
        held = index.by_claim.get(uid) if index is not None else None
        if index is not None and held is not None and held[0] == address_id:
            del index.by_claim[uid]
            index.uncertain.pop(uid, None)

    def trusted(self, ref: PoolRef, claim: ClaimContext, existing: Allocation) -> bool:
        """Whether `existing` is known to be this claim's NetBox address without asking NetBox: its annotations
        name a NetBox id and this claim's UID, or this controller verified that address for the claim."""
        annotations = existing.annotations
        if annotations.get(ANNOTATION_CLAIM_UID) == claim.uid and (annotations.get(ANNOTATION_IP_ID) or "").isdigit():
            return True
        held = self.index(ref).by_claim.get(claim.uid)
        return held is not None and held[1] == normalized_address(existing.address)

    def hold(self, ref: PoolRef, uid: str, address_id: int, address: str) -> None:
        """Remember that NetBox holds `address` (NetBox id `address_id`) for the claim `uid`, checked."""
        index = self.index(ref)
        index.uncertain.pop(uid, None)
        index.by_claim[uid] = (address_id, normalized_address(address))

    def body(self, pool: Pool, resolved: Resolved, claim: ClaimContext) -> Object:
        """The fields of a NetBox IP address made for `claim`: the pool's metadata plus both ownership marks, and
        the management cluster's identity (when known)."""
        fields = pool.fields
        marks = {CLAIM_UID_FIELD: claim.uid, CLAIM_REF_FIELD: claim_ref(claim), **self.identity}
        body: Object = {
            "status": fields.status,
            "description": render(fields.description or DEFAULT_DESCRIPTION, claim)[:200],
            "tags": [{"id": resolved.ownership.owner_tag_id}, *({"id": t} for t in resolved.tag_ids)],
            "custom_fields": {**fields.custom_fields, **marks},
        }
        if claim.endpoint_of is not None:
            body["role"] = "vip"  # a Cluster's control-plane endpoint, whatever the pool gives machines
        elif fields.role:
            body["role"] = fields.role
        if resolved.tenant_id is not None:
            body["tenant"] = resolved.tenant_id
        if fields.dns_name:
            body["dns_name"] = render(fields.dns_name, claim)
        return body

    async def claim_addresses(self, client: NetboxClient, uid: str) -> list[Object]:
        """Our addresses for the claim `uid` (one GET: `tag=<owner tag>&cf_<uid field>=<uid>`)."""
        filters = {"tag": OWNER_TAG, f"cf_{CLAIM_UID_FIELD}": uid}
        found = await client.call(f"look up claim {uid}", calls.find("ipam", "ip_addresses", filters, brief=False))
        return [o for o in found if is_ours(o, uid)]

    async def holders_at(self, client: NetboxClient, address: str, source: Source) -> list[Object]:
        """The NetBox IP addresses at `address` in the source's VRF, oldest (lowest id) first (one GET)."""
        found: list[Object] = await client.call(f"look up {address}", calls.find_address(address, source.vrf_id))
        return sorted((o for o in found if host_of(o) == address), key=lambda o: int(o["id"]))

    async def create(self, client: NetboxClient, body: Mapping[str, Any], address: str, source: Source) -> Object:
        """POST `address` with `body` in the source's VRF (tried once: an unknown outcome raises
        OutcomeUnknownError)."""
        body = {**body, "address": f"{address}/{source.mask}", "vrf": source.vrf_id}
        created: Object = await client.call(
            f"record {address}", calls.create("ipam", "ip_addresses", body), idempotent=False
        )
        return created

    async def delete(self, client: NetboxClient, ref: PoolRef, address_id: int, uid: str = "") -> bool:
        """Delete NetBox IP address `address_id` (the caller checked our marks): the claim `uid` is no longer known
        to hold it (if it is the one remembered for it), and room was made in the pool (its sources are tried in
        order again). False when it was already gone."""
        deleted: bool = await client.call(f"delete address #{address_id}", calls.delete_address(address_id))
        index = self.index(ref)
        if index.by_claim.get(uid, (None, ""))[0] == address_id:
            del index.by_claim[uid]
        index.exhausted.clear()
        return deleted

    async def rekey(self, client: NetboxClient, ref: PoolRef, claim: ClaimContext, obj: Mapping[str, Any]) -> None:
        """Give our address `obj` this claim's UID and this management cluster's identity, if it records this
        claim's namespace/name; else AllocationFailedError, and nothing is changed."""
        recorded = claim_ref_of(obj)
        if recorded != claim_ref(claim):
            held_for = f"claim {recorded}" if recorded else f"a claim whose name is not recorded ({CLAIM_REF_FIELD})"
            raise AllocationFailedError(
                f"the IPAddress of claim {claim} names NetBox IP address #{obj['id']}, which is held for {held_for} "
                f"(UID {uid_of(obj)}); it is not taken over. Delete this IPAddress, or, if that address really "
                f"belongs to this claim (a restore), set its custom field {CLAIM_REF_FIELD} to {claim_ref(claim)!r} "
                "in NetBox"
            )
        changes = {"custom_fields": {CLAIM_UID_FIELD: claim.uid, **self.identity}}
        await client.call(f"re-key address #{obj['id']}", calls.patch_address(int(obj["id"]), changes))
        log.info("address re-keyed to the claim's new UID", claim=str(claim), pool=str(ref), id=obj["id"])
