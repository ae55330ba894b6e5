"""The NetBox requests the backend makes, as functions run in a client's worker thread (`fn(api) -> plain data`).

Each function makes exactly the requests its docstring says, and returns JSON-like dicts (never pynetbox Records,
which hold the thread's session). They raise pynetbox's exceptions; `NetboxClient.call` classifies them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pynetbox
from pynetbox.core.query import Request
from pynetbox.models.ipam import IpAddresses, IpRanges, Prefixes

from backends.netbox.client import Api
from backends.netbox.spec import CLAIM_REF_FIELD, CLAIM_UID_FIELD, CLUSTER_IDENTITY_FIELD, OWNER_TAG
from ipam_provider.common import Object

Call = Callable[[Api], Any]
SOURCE_ENDPOINTS = {"prefix": "prefixes", "ipRange": "ip_ranges"}  # SourceRef.type → its NetBox endpoint

OWNER_TAG_BODY = {
    "name": OWNER_TAG,
    "slug": OWNER_TAG,
    "color": "2196f3",
    "description": "IP addresses allocated by the Cluster API IPAM provider; it releases only addresses with this tag",
}


def _text_field(name: str, label: str, description: str, **extra: Any) -> Object:
    """The body of a Text custom field on IP addresses, filtered exactly and not editable in NetBox's UI."""
    body = {"name": name, "label": label, "type": "text", "object_types": ["ipam.ipaddress"]}
    return {**body, "description": description, "filter_logic": "exact", "ui_editable": "no", **extra}


CLAIM_UID_FIELD_BODY = _text_field(
    CLAIM_UID_FIELD,
    "Cluster API claim UID",
    "UID of the IPAddressClaim this address was allocated for (Cluster API IPAM provider)",
    unique=True,
)
CLAIM_REF_FIELD_BODY = _text_field(
    CLAIM_REF_FIELD,
    "Cluster API claim",
    "<namespace>/<name> of the IPAddressClaim this address was allocated for (Cluster API IPAM provider); an address "
    "is moved to a new claim UID only for a claim of this name",
)
CLUSTER_IDENTITY_FIELD_BODY = _text_field(
    CLUSTER_IDENTITY_FIELD,
    "Cluster API management cluster",
    "Identity of the management cluster that allocated this address (Cluster API IPAM provider: the uid of its "
    "kube-system Namespace); its repair loop never releases another cluster's addresses",
)


def _endpoint(api: Api, app: str, endpoint: str) -> Any:
    return getattr(getattr(api, app), endpoint)


def vrf_filter(vrf_id: int | None) -> int | str:
    """The `vrf_id` filter of a VRF (None: the global table)."""
    return vrf_id if vrf_id is not None else "null"


def get(app: str, endpoint: str, object_id: int) -> Call:
    """GET /<app>/<endpoint>/{id}/: the object, or None on 404."""

    def run(api: Api) -> Object | None:
        record = _endpoint(api, app, endpoint).get(object_id)
        return dict(record) if record is not None else None

    return run


def find(app: str, endpoint: str, filters: Mapping[str, Any], *, brief: bool = True) -> Call:
    """GET /<app>/<endpoint>/?…: every match (brief objects unless `brief` is False)."""
    extra = {"brief": 1} if brief else {}
    return lambda api: [dict(r) for r in _endpoint(api, app, endpoint).filter(**extra, **filters)]


def find_address(address: str, vrf_id: int | None) -> Call:
    """GET /ipam/ip-addresses/?address=<ip>&vrf_id=<id|null>: the objects holding that address in the VRF."""
    return find("ipam", "ip_addresses", {"address": address, "vrf_id": vrf_filter(vrf_id)}, brief=False)


def create(app: str, endpoint: str, body: Mapping[str, Any]) -> Call:
    """POST /<app>/<endpoint>/: the created object."""
    return lambda api: dict(_endpoint(api, app, endpoint).create(dict(body)))


def count_addresses(filters: Mapping[str, Any]) -> Call:
    """GET /ipam/ip-addresses/?limit=1&…: the number of matching IP addresses."""
    return lambda api: int(api.ipam.ip_addresses.count(**filters))


def allocate(kind: str, source_id: int, body: Mapping[str, Any]) -> Call:
    """POST /ipam/{prefixes|ip-ranges}/{id}/available-ips/: the created IP address (one request, no lookups).
    Raises pynetbox.AllocationError on 409 (the source is full)."""

    def run(api: Api) -> Object:
        model = Prefixes if kind == "prefix" else IpRanges
        parent = model({"id": source_id}, api, _endpoint(api, "ipam", SOURCE_ENDPOINTS[kind]))
        return dict(parent.available_ips.create(dict(body)))

    return run


def list_page(app: str, endpoint: str, filters: Mapping[str, Any], page: Mapping[str, int]) -> Call:
    """One GET /<app>/<endpoint>/?…&limit=…&(start=…|offset=…): the page as NetBox answers it (`count`, `next`,
    `results`); never follows `next` (the caller paces its pages)."""

    def run(api: Api) -> Object:
        base = _endpoint(api, app, endpoint).url
        request = Request(base=base, http_session=api.http_session, filters=dict(filters), token=api.token)
        return dict(request._make_call(add_params=dict(page)))  # one request; pynetbox's errors

    return run


def patch_address(address_id: int, changes: Mapping[str, Any]) -> Call:
    """PATCH /ipam/ip-addresses/{id}/ with `changes`."""

    def run(api: Api) -> Object:
        request = Request(
            key=address_id, base=api.ipam.ip_addresses.url, token=api.token, http_session=api.http_session
        )
        return dict(request.patch(dict(changes)))

    return run


def delete_address(address_id: int) -> Call:
    """DELETE /ipam/ip-addresses/{id}/: True when deleted, False when it was already gone (404)."""

    def run(api: Api) -> bool:
        try:
            return bool(IpAddresses({"id": address_id}, api, api.ipam.ip_addresses).delete())
        except pynetbox.RequestError as error:
            if error.req.status_code == 404:
                return False
            raise

    return run
