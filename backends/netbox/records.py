"""The NetBox IP addresses of ours, as records: the body one is made with (the pool's fields plus both ownership
marks and the management cluster's identity), how its marks read back (`is_ours`, `claim_ref_of`, the requested
mark), and the Allocation it stands for."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

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
from ipam_provider.backend.contract import Allocation, ClaimContext
from ipam_provider.common import Object


def host_of(obj: Mapping[str, Any]) -> str:
    """The address of a NetBox IP address, without its mask."""
    return str(ipaddress.ip_interface(str(obj["address"])).ip)


def claim_ref(claim: ClaimContext) -> str:
    """What the custom field capi_claim_ref records: the claim's "<namespace>/<name>"."""
    return f"{claim.namespace}/{claim.name}"


def is_ours(obj: Mapping[str, Any], claim_uid: str | None = None) -> bool:
    """Whether a NetBox IP address carries our ownership marks (for `claim_uid`, when given)."""
    slugs = {tag.get("slug") for tag in obj.get("tags") or [] if isinstance(tag, Mapping)}
    uid = (obj.get("custom_fields") or {}).get(CLAIM_UID_FIELD)
    if OWNER_TAG not in slugs or not uid:
        return False
    return claim_uid is None or uid == claim_uid


def vrf_id_of(obj: Mapping[str, Any]) -> int | None:
    """The id of a NetBox IP address's VRF (None: the global table)."""
    vrf = obj.get("vrf")
    if isinstance(vrf, Mapping):
        return int(vrf["id"]) if vrf.get("id") is not None else None
    return int(vrf) if isinstance(vrf, int) else None


REQUESTED_MARK = " [requested address]"


def requested_description(description: str) -> str:
    """The description of an address made for a requested address: it ends with REQUESTED_MARK."""
    return description[: 200 - len(REQUESTED_MARK)] + REQUESTED_MARK


def is_requested(obj: Mapping[str, Any]) -> bool:
    """Whether a NetBox IP address was made for a requested address (its keep-if-alone check may not have run)."""
    return str(obj.get("description") or "").endswith(REQUESTED_MARK)


def claim_ref_of(obj: Mapping[str, Any]) -> str | None:
    """The "<namespace>/<name>" of the claim a NetBox IP address was made for, if recorded."""
    value = (obj.get("custom_fields") or {}).get(CLAIM_REF_FIELD)
    return str(value) if value else None


def identity_fields(cluster_identity: str) -> dict[str, str]:
    """The custom field that names the management cluster, when it is known."""
    return {CLUSTER_IDENTITY_FIELD: cluster_identity} if cluster_identity else {}


def address_body(pool: Pool, resolved: Resolved, claim: ClaimContext, cluster_identity: str) -> Object:
    """The fields of a NetBox IP address made for `claim`: the pool's metadata plus both ownership marks, and the
    management cluster's identity (when known)."""
    fields = pool.fields
    marks = {CLAIM_UID_FIELD: claim.uid, CLAIM_REF_FIELD: claim_ref(claim), **identity_fields(cluster_identity)}
    body: Object = {
        "status": fields.status,
        "description": render(fields.description or DEFAULT_DESCRIPTION, claim)[:200],
        "tags": [{"id": resolved.ownership.owner_tag_id}, *({"id": t} for t in resolved.tag_ids)],
        "custom_fields": {**fields.custom_fields, **marks},
    }
    if fields.role:
        body["role"] = fields.role
    if resolved.tenant_id is not None:
        body["tenant"] = resolved.tenant_id
    if fields.dns_name:
        body["dns_name"] = render(fields.dns_name, claim)
    return body


def allocation_of(resolved: Resolved, obj: Mapping[str, Any], uid: str, source: Source | None = None) -> Allocation:
    """The Allocation for a NetBox IP address: the source's prefix-length override and gateway apply."""
    interface = ipaddress.ip_interface(str(obj["address"]))
    address = str(interface.ip)
    source = source or resolved.source_of(address)
    prefix = interface.network.prefixlen
    gateway = None
    if source is not None:
        prefix = source.ref.prefix_length if source.ref.prefix_length is not None else prefix
        gateway = source.ref.gateway
    return Allocation(address, prefix, gateway, {ANNOTATION_IP_ID: str(obj["id"]), ANNOTATION_CLAIM_UID: uid})
