"""Per-object-type WAPI rules: defaults, parents, uniqueness, conflicts, allocation, cascades, derived fields.

Contract (the caller holds ``store.lock``; every refusal is raised before anything is stored):

* ``networkview``: unique name; a new view gets a DNS view ``default.<name>``; the default view cannot be
  deleted; deleting a view deletes everything in it (its DNS views with their zones and host records too);
  renaming moves everything with it;
* ``network`` / ``ipv6network``: the network view must exist; the same CIDR twice is refused with
  ``The network <cidr> already exists.  Select another network.``; overlapping networks in one view are
  refused; deleting a network deletes its fixed addresses and DHCP ranges;
* ``range``: start <= end, both inside one network of the view (else ``A parent was not found``); ranges of a
  view may not overlap; ``exclude`` entries must lie inside the range;
* ``fixedaddress`` / ``ipv6fixedaddress``: the address (literal or ``func:nextavailableip``) must lie in a
  network of the view (else ``A parent was not found``); ``mac`` is required when ``match_client`` is
  ``MAC_ADDRESS`` (the default), ``duid`` always for IPv6; an address already held by another fixed address
  or DHCP-enabled host address is a ``Client.Ibap.Data.Conflict``; the network and broadcast addresses are
  refused; the ``network`` field is derived;
* ``record:host``: the DNS view must exist (``View <name> not found``, 404); the name is stored in lower case
  and must be a DNS name by length (see :mod:`.names`); the name is unique per DNS view
  (``The record '<name>' already exists.``); with ``configure_for_dns`` (default true) an authoritative zone
  must enclose the name, without it the record is IPAM-only and kept in the blank pseudo-view (see
  :mod:`.names`; unique among IPAM-only records, a choice: NIOS's rule is not public); at least one address;
  addresses may be ``func:nextavailableip``; a DHCP-enabled address needs a ``mac`` (IPv4) or ``duid`` (IPv6),
  a network, and no other DHCP holder; addresses without DHCP may be shared with other objects, as on NIOS;
* ``extensibleattributedef``: unique name; ``ENUM`` needs ``list_values``; a rename or delete is applied to
  every object's ``extattrs``;
* ``view`` / ``zone_auth``: see :mod:`.dns`;
* attributes restricted to object types, and a host record's network view: see :mod:`.bindings`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from . import dns, errors, names
from .addressing import NEXT_AVAILABLE_PREFIX, parse_address, parse_next_available
from .allocation import Pending, allocate
from .bindings import check_address_network_view, check_host_network_view
from .changes import Modifiers
from .changes import is_other as _other
from .changes import merge as _merge
from .fields import Field, check_value
from .schema import HOST_IPV4ADDR_FIELDS, HOST_IPV6ADDR_FIELDS
from .store import ObjectStore, StoredObject

Finisher = Callable[[ObjectStore, dict[str, Any], dict[str, Any], Modifiers, StoredObject | None], None]


def _require_view(store: ObjectStore, fields: dict[str, Any]) -> str:
    network_view: str = fields.setdefault("network_view", "default")
    if not store.network_view_exists(network_view):
        raise errors.not_found(f"Network view {network_view} not found")
    return network_view


def _finish_networkview(
    store: ObjectStore, fields: dict[str, Any], changes: dict[str, Any], modifiers: Modifiers, old: StoredObject | None
) -> None:
    _merge(fields, changes, modifiers)
    name = fields["name"]
    if _other(store.by_key("networkview", name), old):
        raise errors.conflict(f"Duplicate object '{name}' of type network view exists in the database.")
    fields.setdefault("is_default", False)
    if old is None:
        dns.add_default_view(store, name)
    elif old.get("name") != name:
        _rename_network_view(store, old.get("name"), name)


def _rename_network_view(store: ObjectStore, before: str, after: str) -> None:
    for obj in store.all_objects():
        if obj.get("network_view") == before:
            store.replace(obj.ref, StoredObject(obj.obj_type, {**obj.fields, "network_view": after}))
        elif obj.obj_type == "record:host":
            moved = {**obj.fields}
            for list_name in ("ipv4addrs", "ipv6addrs"):
                moved[list_name] = [
                    {**e, "network_view": after if e["network_view"] == before else e["network_view"]}
                    for e in obj.get(list_name) or []
                ]
            store.replace(obj.ref, StoredObject(obj.obj_type, moved))


def _finish_network(
    store: ObjectStore, fields: dict[str, Any], changes: dict[str, Any], modifiers: Modifiers, old: StoredObject | None
) -> None:
    _merge(fields, changes, modifiers)
    network_view = _require_view(store, fields)
    if old is not None:
        if fields["network"] != old.get("network") or network_view != old.get("network_view"):
            raise errors.proto("Moving or resizing a network is not supported by the WAPI simulator")
        return
    network = ipaddress.ip_network(fields["network"])
    obj_type = "network" if network.version == 4 else "ipv6network"
    if store.by_key(obj_type, f"{network}/{network_view}") is not None:
        raise errors.conflict(f"The network {network} already exists.  Select another network.")
    if not store.overlaps_network(obj_type, network_view, network):
        return
    for other in store.of_type(obj_type):  # name the first one created, as before the index
        other_net = ipaddress.ip_network(other.get("network"))
        if other.get("network_view") == network_view and other_net.overlaps(network):
            raise errors.conflict(f"The network {network} overlaps with the network {other_net}.")


def _finish_range(
    store: ObjectStore, fields: dict[str, Any], changes: dict[str, Any], modifiers: Modifiers, old: StoredObject | None
) -> None:
    _merge(fields, changes, modifiers)
    network_view = _require_view(store, fields)
    start, end = ipaddress.IPv4Address(fields["start_addr"]), ipaddress.IPv4Address(fields["end_addr"])
    if start > end:
        raise errors.proto(f"Invalid value for end_addr: {end} is lower than start_addr {start}")
    parent = store.containing_network(network_view, start)
    if parent is None or end not in ipaddress.ip_network(parent.get("network")):
        raise errors.parent_not_found()
    if "network" in changes and changes["network"] != parent.get("network"):
        raise errors.invalid_value("network", changes["network"], "The range is not in this network")
    fields["network"] = parent.get("network")
    for other in store.ranges_in(network_view):
        o_start = ipaddress.IPv4Address(other.get("start_addr"))
        o_end = ipaddress.IPv4Address(other.get("end_addr"))
        if _other(other, old) and start <= o_end and o_start <= end:
            raise errors.conflict(f"The DHCP range {start}-{end} overlaps with the DHCP range {o_start}-{o_end}.")
    for entry in fields.get("exclude") or []:
        bounds = [entry.get(k) if isinstance(entry, dict) else None for k in ("start_address", "end_address")]
        low, high = (parse_address(b, 4) if isinstance(b, str) else None for b in bounds)
        if not isinstance(low, ipaddress.IPv4Address) or not isinstance(high, ipaddress.IPv4Address):
            raise errors.invalid_value("exclude", entry, "Exclusion needs start_address and end_address")
        if not start <= low <= high <= end:
            raise errors.invalid_value("exclude", entry, "Exclusion must lie inside the range")


def _resolve(
    store: ObjectStore, raw: str, version: int, field_name: str, network_view: str, pending: Pending
) -> tuple[str, str]:
    """An address value (literal or ``func:nextavailableip``) -> ``(address, network view)``."""
    target = parse_next_available(raw)
    if target is None:
        return check_value(field_name, Field("ipv4" if version == 4 else "ipv6"), raw), network_view
    if target.network_view != network_view:
        raise errors.invalid_value(field_name, raw, f"Network view of the function differs from {network_view}")
    return allocate(store, target, version, field_name, pending)


def _dhcp_conflict(store: ObjectStore, network_view: str, address: str, old: StoredObject | None) -> None:
    holders = [
        r for r in store.usage.dhcp_owners(network_view, ipaddress.ip_address(address)) if old is None or r != old.ref
    ]
    if holders:
        kind = "fixed address" if holders[0].split("/", 1)[0].endswith("fixedaddress") else "host address"
        raise errors.conflict(f"The IP address {address} is already used by a {kind} in network view {network_view}.")


def _finish_fixed(version: int) -> Finisher:
    def finisher(
        store: ObjectStore,
        fields: dict[str, Any],
        changes: dict[str, Any],
        modifiers: Modifiers,
        old: StoredObject | None,
    ) -> None:
        _finish_fixed_address(store, fields, changes, modifiers, old, version)

    return finisher


def _finish_fixed_address(
    store: ObjectStore,
    fields: dict[str, Any],
    changes: dict[str, Any],
    modifiers: Modifiers,
    old: StoredObject | None,
    version: int,
) -> None:
    address_field = "ipv4addr" if version == 4 else "ipv6addr"
    raw = changes.pop(address_field, None)
    _merge(fields, changes, modifiers)
    if isinstance(raw, str) and raw.startswith(NEXT_AVAILABLE_PREFIX):
        target = parse_next_available(raw)
        assert target is not None
        fields.setdefault("network_view", target.network_view)
        fields[address_field], _ = _resolve(store, raw, version, address_field, fields["network_view"], {})
    elif raw is not None:
        fields[address_field] = raw
    network_view = _require_view(store, fields)
    if version == 4 and fields.get("match_client", "MAC_ADDRESS") == "MAC_ADDRESS" and not fields.get("mac"):
        raise errors.missing_field("mac")
    if version == 6 and fields.get("address_type", "ADDRESS") != "ADDRESS":
        raise errors.proto("address_type PREFIX/BOTH is not supported by the WAPI simulator")
    address = ipaddress.ip_address(fields[address_field])
    parent = store.containing_network(network_view, address)
    if parent is None:
        raise errors.parent_not_found()
    network = ipaddress.ip_network(parent.get("network"))
    if version == 4 and network.prefixlen < 31 and address in (network.network_address, network.broadcast_address):
        raise errors.conflict(f"The IP address {address} is the network or broadcast address of {network}.")
    if "network" in changes and changes["network"] != str(network):
        raise errors.invalid_value("network", changes["network"], "The address is not in this network")
    fields["network"] = str(network)
    _dhcp_conflict(store, network_view, str(address), old)


def _host_entries(
    store: ObjectStore, raw_entries: list[dict[str, Any]], version: int, host_view: str, pending: Pending
) -> list[dict[str, Any]]:
    allowed = HOST_IPV4ADDR_FIELDS if version == 4 else HOST_IPV6ADDR_FIELDS
    address_field = "ipv4addr" if version == 4 else "ipv6addr"
    entries = []
    for raw in raw_entries:
        entry: dict[str, Any] = {}
        for key, value in raw.items():
            spec = allowed.get(key)
            if spec is None:
                raise errors.unknown_field(key)
            if key == "_ref" or key == address_field:
                continue
            if spec.readonly:
                raise errors.proto(f"Field is not writable: {key}")
            entry[key] = check_value(key, spec, value)
        if address_field not in raw:
            raise errors.missing_field(address_field)
        value = raw[address_field]
        if not isinstance(value, str):
            raise errors.invalid_value(address_field, value, "Must be string type")
        target = parse_next_available(value)
        func_view = target.network_view if target is not None else host_view
        check_address_network_view(address_field, value, func_view, host_view)
        entry[address_field], entry["network_view"] = _resolve(store, value, version, address_field, func_view, pending)
        entries.append(entry)
    return entries


def _finish_host(
    store: ObjectStore, fields: dict[str, Any], changes: dict[str, Any], modifiers: Modifiers, old: StoredObject | None
) -> None:
    raw_lists = {name: changes.pop(name, None) for name in ("ipv4addrs", "ipv6addrs")}
    list_mods = {name: modifiers.pop(name, None) for name in ("ipv4addrs", "ipv6addrs")}
    _merge(fields, changes, modifiers)
    in_dns = fields.get("configure_for_dns", True)
    kept_ipam_only = old is not None and names.is_ipam_only(old) and "view" not in changes
    view = fields.setdefault("view", "default")
    host_view = names.host_network_view(store, old) if kept_ipam_only and old else store.dns_view_network_view(view)
    if host_view is None:
        raise names.missing_view(view)
    name = fields["name"] = names.normalise(fields["name"])
    names.check_dns_name("name", name)
    if in_dns and kept_ipam_only:
        raise errors.proto("Moving an IPAM-only host record into DNS is not supported by the WAPI simulator")
    if not in_dns:
        view = fields["view"] = names.IPAM_ONLY_VIEW
    if _other(store.by_key("record:host", f"{view}/{name}"), old):
        raise errors.conflict(f"The record '{name}' already exists.")
    if in_dns and store.zone_for(view, name) is None:
        raise errors.parent_not_found()
    pending: Pending = {}
    check_host_network_view(store, changes.get("network_view"), view, host_view)
    for version, list_name in ((4, "ipv4addrs"), (6, "ipv6addrs")):
        address_field = "ipv4addr" if version == 4 else "ipv6addr"
        entries = list(fields.get(list_name) or [])
        if raw_lists[list_name] is not None:
            entries = _host_entries(store, raw_lists[list_name], version, host_view, pending)
        mod = list_mods[list_name]
        if mod is not None and mod[0] == "+":
            entries += _host_entries(store, mod[1], version, host_view, pending)
        elif mod is not None:
            gone = {str(e.get(address_field)) for e in mod[1]}
            entries = [e for e in entries if e[address_field] not in gone]
        fields[list_name] = entries
        seen: set[str] = set()
        for entry in entries:
            address = entry[address_field]
            if address in seen:
                raise errors.conflict(f"The IP address {address} appears twice in host record '{name}'.")
            seen.add(address)
            if entry.get("configure_for_dhcp"):
                _check_dhcp_host_address(store, entry, version, old)
    if not fields["ipv4addrs"] and not fields["ipv6addrs"]:
        raise errors.missing_field("ipv4addrs")
    for list_name in ("ipv4addrs", "ipv6addrs"):
        if not fields[list_name]:
            del fields[list_name]


def _check_dhcp_host_address(store: ObjectStore, entry: dict[str, Any], version: int, old: StoredObject | None) -> None:
    identity = "mac" if version == 4 else "duid"
    if not entry.get(identity):
        raise errors.missing_field(identity)
    address = entry["ipv4addr" if version == 4 else "ipv6addr"]
    if store.containing_network(entry["network_view"], ipaddress.ip_address(address)) is None:
        raise errors.parent_not_found()
    _dhcp_conflict(store, entry["network_view"], address, old)


def _finish_eadef(
    store: ObjectStore, fields: dict[str, Any], changes: dict[str, Any], modifiers: Modifiers, old: StoredObject | None
) -> None:
    _merge(fields, changes, modifiers)
    name = fields["name"]
    if _other(store.by_key("extensibleattributedef", name), old):
        raise errors.conflict(f"Duplicate object '{name}' of type extensible attribute definition exists.")
    if set(fields.get("flags") or "") - set("ACGILMPRSV"):
        raise errors.invalid_value("flags", fields["flags"], "Invalid flags")
    values = fields.get("list_values")
    if values is not None and not all(isinstance(v, dict) and isinstance(v.get("value"), str) for v in values):
        raise errors.invalid_value("list_values", values, "Must be array of {value: string}")
    if fields["type"] == "ENUM" and not values:
        raise errors.missing_field("list_values")
    if old is not None and old.get("name") != name:
        for obj in store.all_objects():
            eas = obj.fields.get("extattrs") or {}
            if old.get("name") in eas:
                eas[name] = eas.pop(old.get("name"))


FINISHERS: dict[str, Finisher] = {
    "networkview": _finish_networkview,
    "network": _finish_network,
    "ipv6network": _finish_network,
    "range": _finish_range,
    "fixedaddress": _finish_fixed(4),
    "ipv6fixedaddress": _finish_fixed(6),
    "record:host": _finish_host,
    "extensibleattributedef": _finish_eadef,
    "view": dns.finish_view,
    "zone_auth": dns.finish_zone,
}


def finish(
    store: ObjectStore,
    obj_type: str,
    fields: dict[str, Any],
    changes: dict[str, Any],
    modifiers: Modifiers,
    old: StoredObject | None,
) -> None:
    """Apply ``changes``/``modifiers`` to ``fields`` under the rules of ``obj_type`` (see module docstring)."""
    FINISHERS[obj_type](store, fields, changes, modifiers, old)


def delete(store: ObjectStore, obj: StoredObject) -> None:
    """Delete ``obj`` and its dependants."""
    if obj.obj_type == "networkview":
        if obj.get("is_default"):
            raise errors.conflict("The default network view cannot be deleted.")
        name = obj.get("name")
        views = set(store.dns_views_of(name))
        for other in store.all_objects():
            in_view = other.obj_type in ("record:host", "zone_auth") and other.get("view") in views
            ipam_only = other.obj_type == "record:host" and names.host_network_view(store, other) == name
            if other.get("network_view") == name or in_view or ipam_only:
                store.remove(other.ref)
    elif obj.obj_type in ("view", "zone_auth"):
        for other in dns.dependants(store, obj):
            store.remove(other.ref)
    elif obj.obj_type in ("network", "ipv6network"):
        network = ipaddress.ip_network(obj.get("network"))
        for other in store.all_objects():
            if (
                other.obj_type in ("fixedaddress", "ipv6fixedaddress", "range")
                and other.get("network_view") == obj.get("network_view")
                and other.get("network") == str(network)
            ):
                store.remove(other.ref)
    elif obj.obj_type == "extensibleattributedef":
        for other in store.all_objects():
            (other.fields.get("extattrs") or {}).pop(obj.get("name"), None)
    store.remove(obj.ref)


def derived_value(store: ObjectStore, obj: StoredObject, name: str) -> Any:
    """Fields NIOS computes rather than stores; ``None`` when ``name`` is not one of them."""
    if obj.obj_type == "networkview" and name == "associated_dns_views":
        return store.dns_views_of(obj.get("name"))
    if obj.obj_type in ("network", "ipv6network"):
        network = ipaddress.ip_network(obj.get("network"))
        derived = {
            "network_container": "/",
            "ipv4addr": str(network.network_address),
            "netmask": network.prefixlen,
            "total_hosts": network.num_addresses,
        }
        return derived.get(name)
    if obj.obj_type == "record:host":
        if name == "network_view":
            return names.host_network_view(store, obj)
        if name == "zone":
            return store.zone_for(obj.get("view"), obj.get("name"))
        if name == "dns_name":
            return obj.get("name")
    return None


def host_address_network(store: ObjectStore, entry: dict[str, Any], version: int) -> str | None:
    """The CIDR of the network holding one host address, if any."""
    address = ipaddress.ip_address(entry["ipv4addr" if version == 4 else "ipv6addr"])
    network = store.containing_network(entry["network_view"], address)
    return network.get("network") if network is not None else None
