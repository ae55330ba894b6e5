"""WAPI object references.

A reference has the NIOS form ``<object type>/<opaque id>:<name part>``, e.g.
``fixedaddress/ZG5zLmZpeGVkX2FkZHJlc3MkMTAuMC4wLjUvZGVmYXVsdA:10.0.0.5/default``.

Contract:

* the opaque id is URL-safe base64 (no padding) of ``<internal type>$<natural key>``, so it never contains
  ``/`` or ``:``, and, as on NIOS, an object re-created with the same natural key gets the same reference;
* the name part is the object's human-readable key, its components joined by ``/`` and each component
  percent-encoded except for ``/`` (so ``10.0.0.0/24`` stays readable and IPv6 colons become ``%3A``);
* a reference changes when its natural key changes (for example a fixed address moved to another address);
  the old reference then answers 404, as on NIOS.
"""

from __future__ import annotations

import base64
from urllib.parse import quote

# WAPI object type -> the internal type name NIOS encodes in the opaque id.
_INTERNAL_TYPES: dict[str, str] = {
    "network": "dns.network",
    "ipv6network": "dns.network",
    "networkview": "dns.network_view",
    "fixedaddress": "dns.fixed_address",
    "ipv6fixedaddress": "dns.fixed_address",
    "record:host": "dns.host",
    "record:host_ipv4addr": "dns.host_address",
    "record:host_ipv6addr": "dns.host_address",
    "extensibleattributedef": "one.extensible_attributes_def",
    "range": "dns.dhcp_range",
    "view": "dns.view",
    "zone_auth": "dns.zone",
}


def make_ref(obj_type: str, key: str, name_parts: list[str]) -> str:
    """Build the reference of an object of ``obj_type`` with natural ``key`` and readable ``name_parts``."""
    internal = _INTERNAL_TYPES.get(obj_type, obj_type)
    opaque = base64.urlsafe_b64encode(f"{internal}${key}".encode()).decode().rstrip("=")
    name = "/".join(quote(part, safe="/") for part in name_parts)
    return f"{obj_type}/{opaque}:{name}"


def ref_type(ref: str) -> str:
    """The object type a reference names (the text before the first ``/``)."""
    return ref.split("/", 1)[0]


def is_ref(path: str) -> bool:
    """Whether a WAPI path (after ``/wapi/v<version>/``) names one object rather than an object type."""
    return "/" in path
