"""Two grid-wide bindings NIOS enforces on writes: extensible attributes restricted to object types, and the one
network view of a host record's DNS view.

Contract (the caller holds ``store.lock``; each check raises before anything is stored):

* :func:`check_allowed_types`: an ``extensibleattributedef`` whose ``allowed_object_types`` is a non-empty list
  restricts its attribute to those object types, named as NIOS names them (:data:`NIOS_TYPE_NAMES`, compared
  without regard to case). Writing the attribute (POST, PUT, ``extattrs+``) on an object of another type is
  refused with 400 ``Client.Ibap.Data.Conflict`` ``Extensible attribute '<name>' is not allowed for this
  operation``, the body real grids answer (terraform-provider-infoblox issue #420; infoblox-client issue #89).
  Removing the attribute (``extattrs-``), searching on it, and objects that carried it before the definition
  was restricted are left alone (what NIOS does then is not public);
* :func:`check_host_network_view`: a DNS view belongs to one network view (``view.network_view``), and so does
  a host record in it. ``network_view`` may be written on create (as infoblox-go-client's ``HostRecord`` sends
  it); it must name an existing network view (404 ``Network view <name> not found``) and be the DNS view's.
  Every address of the record must come from that network view too: a ``func:nextavailableip`` naming another
  one is refused. NIOS's own text for these refusals is not public; the simulator answers the documented WAPI
  shape for a bad value, 400 ``Client.Ibap.Proto`` ``Invalid value for <field>: "<value>": <reason>``.
"""

from __future__ import annotations

from typing import Any

from . import errors
from .store import ObjectStore

NIOS_TYPE_NAMES = {
    "fixedaddress": "FixedAddress",
    "ipv6fixedaddress": "IPv6FixedAddress",
    "record:host": "HostRecord",
    "network": "Network",
    "ipv6network": "IPv6Network",
    "range": "Range",
    "networkview": "NetworkView",
}
"""The names ``allowed_object_types`` uses for the simulated object types (NIOS's own tests write ``Network``
and ``IPv6Network``; the others follow the same pattern)."""


def not_allowed(name: str) -> errors.WapiError:
    """The refusal of an attribute whose definition does not allow the object's type."""
    return errors.conflict(f"Extensible attribute '{name}' is not allowed for this operation")


def check_allowed_types(store: ObjectStore, obj_type: str, extattrs: dict[str, Any]) -> None:
    """Refuse writing an attribute on ``obj_type`` when its definition restricts it to other types."""
    nios_name = NIOS_TYPE_NAMES.get(obj_type, obj_type).lower()
    for name in extattrs:
        definition = store.by_key("extensibleattributedef", name)
        allowed = (definition.get("allowed_object_types") or []) if definition is not None else []
        if allowed and nios_name not in {str(kind).lower() for kind in allowed}:
            raise not_allowed(name)


def check_host_network_view(store: ObjectStore, written: str | None, view: str, view_network_view: str) -> None:
    """Refuse a host record's written ``network_view`` when it does not exist or is not its DNS view's."""
    if written is None:
        return
    if not store.network_view_exists(written):
        raise errors.not_found(f"Network view {written} not found")
    if written != view_network_view:
        raise errors.invalid_value("network_view", written, _belongs(view, view_network_view))


def check_address_network_view(field: str, value: str, network_view: str, view_network_view: str) -> None:
    """Refuse a host address (``func:nextavailableip:...,<network view>``) taken from another network view."""
    if network_view != view_network_view:
        why = f"the host record's DNS view belongs to network view {view_network_view}"
        raise errors.invalid_value(field, value, why)


def _belongs(view: str, network_view: str) -> str:
    return f"DNS view {view} belongs to network view {network_view}"
