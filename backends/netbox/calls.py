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
from backends.netbox.spec import CLAIM_REF_FIELD, CLAIM_UID_FIELD, OWNER_TAG
from ipam_provider.common import Object

Call = Callable[[Api], Any]

OWNER_TAG_BODY = {
    "name": OWNER_TAG,
    "slug": OWNER_TAG,
    "color": "2196f3",
    "description": "IP addresses allocated by the Cluster API IPAM provider; it releases only addresses with this tag",
}
CLAIM_UID_FIELD_BODY = {
    "name": CLAIM_UID_FIELD,
    "label": "Cluster API claim UID",
    "type": "text",
    "object_types": ["ipam.ipaddress"],
    "description": "UID of the IPAddressClaim this address was allocated for (Cluster API IPAM provider)",
    "unique": True,
    "filter_logic": "exact",
    "ui_editable": "no",
}
CLAIM_REF_FIELD_BODY = {
    "name": CLAIM_REF_FIELD,
    "label": "Cluster API claim",
    "type": "text",
    "object_types": ["ipam.ipaddress"],
    "description": "<namespace>/<name> of the IPAddressClaim this address was allocated for (Cluster API IPAM "
    "provider); an address is moved to a new claim UID only for a claim of this name",
    "filter_logic": "exact",
    "ui_editable": "no",
}


def _plain(record: Any) -> Object:
    return dict(record)


def _endpoint(api: Api, kind: str) -> Any:
    return {"prefix": api.ipam.prefixes, "ipRange": api.ipam.ip_ranges}[kind]


def get_source(kind: str, source_id: int) -> Call:
    """GET /ipam/prefixes/{id}/ or /ipam/ip-ranges/{id}/: the object, or None on 404."""

    def run(api: Api) -> Object | None:
        record = _endpoint(api, kind).get(source_id)
        return _plain(record) if record is not None else None

    return run


def find_sources(kind: str, filters: Mapping[str, Any]) -> Call:
    """GET /ipam/prefixes/?… or /ipam/ip-ranges/?…: every match (usually one page)."""

    def run(api: Api) -> list[Object]:
        return [_plain(r) for r in _endpoint(api, kind).filter(**filters)]

    return run


def find(app: str, endpoint: str, filters: Mapping[str, Any], *, brief: bool = True) -> Call:
    """GET /<app>/<endpoint>/?…: every match (brief objects unless `brief` is False)."""

    def run(api: Api) -> list[Object]:
        extra = {"brief": 1} if brief else {}
        return [_plain(r) for r in getattr(getattr(api, app), endpoint).filter(**extra, **filters)]

    return run


def create(app: str, endpoint: str, body: Mapping[str, Any]) -> Call:
    """POST /<app>/<endpoint>/: the created object."""

    def run(api: Api) -> Object:
        return _plain(getattr(getattr(api, app), endpoint).create(dict(body)))

    return run


def count_addresses(filters: Mapping[str, Any]) -> Call:
    """GET /ipam/ip-addresses/?limit=1&…: the number of matching IP addresses."""

    def run(api: Api) -> int:
        return int(api.ipam.ip_addresses.count(**filters))

    return run


def allocate(kind: str, source_id: int, body: Mapping[str, Any]) -> Call:
    """POST /ipam/{prefixes|ip-ranges}/{id}/available-ips/: the created IP address (one request, no lookups).

    Raises pynetbox.AllocationError on 409 (the source is full).
    """

    def run(api: Api) -> Object:
        model = Prefixes if kind == "prefix" else IpRanges
        parent = model({"id": source_id}, api, _endpoint(api, kind))
        return _plain(parent.available_ips.create(dict(body)))

    return run


def get_address(address_id: int) -> Call:
    """GET /ipam/ip-addresses/{id}/: the object, or None on 404."""

    def run(api: Api) -> Object | None:
        record = api.ipam.ip_addresses.get(address_id)
        return _plain(record) if record is not None else None

    return run


def find_claim_addresses(claim_uid: str) -> Call:
    """GET /ipam/ip-addresses/?tag=<owner tag>&cf_<uid field>=<uid>: every address marked for the claim."""

    def run(api: Api) -> list[Object]:
        filters = {"tag": OWNER_TAG, f"cf_{CLAIM_UID_FIELD}": claim_uid}
        return [_plain(r) for r in api.ipam.ip_addresses.filter(**filters)]

    return run


def find_address(address: str, vrf_id: int | None) -> Call:
    """GET /ipam/ip-addresses/?address=<ip>&vrf_id=<id|null>: the objects holding that address in the VRF."""

    def run(api: Api) -> list[Object]:
        filters = {"address": address, "vrf_id": vrf_id if vrf_id is not None else "null"}
        return [_plain(r) for r in api.ipam.ip_addresses.filter(**filters)]

    return run


def list_page(app: str, endpoint: str, filters: Mapping[str, Any], page: Mapping[str, int]) -> Call:
    """One GET /<app>/<endpoint>/?…&limit=…&(start=…|offset=…): the page as NetBox answers it (`count`, `next`,
    `results`); never follows `next` (the caller paces its pages)."""

    def run(api: Api) -> Object:
        base = getattr(getattr(api, app), endpoint).url
        request = Request(base=base, http_session=api.http_session, filters=dict(filters), token=api.token)
        answer: Object = request._make_call(add_params=dict(page))  # one request; pynetbox's errors
        return answer

    return run


def patch_address(address_id: int, changes: Mapping[str, Any]) -> Call:
    """PATCH /ipam/ip-addresses/{id}/ with `changes`."""

    def run(api: Api) -> Object:
        request = Request(
            key=address_id, base=api.ipam.ip_addresses.url, token=api.token, http_session=api.http_session
        )
        result: Object = request.patch(dict(changes))
        return result

    return run


def delete_address(address_id: int) -> Call:
    """DELETE /ipam/ip-addresses/{id}/: True when deleted, False when it was already gone (404)."""

    def run(api: Api) -> bool:
        record = IpAddresses({"id": address_id}, api, api.ipam.ip_addresses)
        try:
            return bool(record.delete())
        except pynetbox.RequestError as error:
            if error.req.status_code == 404:
                return False
            raise

    return run
