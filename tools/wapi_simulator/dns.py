"""WAPI rules for DNS views (``view``) and authoritative zones (``zone_auth``).

Contract (the caller holds ``store.lock``; every refusal is raised before anything is stored):

* ``view``: the name is unique (``Duplicate object '<name>' of type view exists in the database.``); its
  network view must exist (``Network view <name> not found``, 404); it is never the default view unless it is
  the one the store starts with; renaming a view or moving it to another network view is refused (not
  simulated); deleting the default view is refused; deleting a view deletes its zones and host records;
* ``zone_auth``: ``fqdn`` is stored in lower case without a trailing dot and must be a DNS name by length
  (see :mod:`.names`); its DNS view must exist (``View <name> not found``, 404); ``fqdn`` is unique per view
  (``Duplicate object '<fqdn>' of type zone exists in the database.``); deleting a zone deletes the host records
  whose enclosing zone it is;
* a new network view gets a DNS view ``default.<name>`` (:func:`add_default_view`); deleting a network view
  deletes its DNS views with their zones and host records (see :mod:`.rules`).
"""

from __future__ import annotations

from typing import Any

from . import errors, names
from .changes import Modifiers, is_other, merge
from .store import ObjectStore, StoredObject


def finish_view(
    store: ObjectStore, fields: dict[str, Any], changes: dict[str, Any], modifiers: Modifiers, old: StoredObject | None
) -> None:
    """Apply a create or update of a DNS view (see module docstring)."""
    merge(fields, changes, modifiers)
    name = fields["name"]
    if old is not None and name != old.get("name"):
        raise errors.proto("Renaming a DNS view is not supported by the WAPI simulator")
    if is_other(store.by_key("view", name), old):
        raise errors.conflict(f"Duplicate object '{name}' of type view exists in the database.")
    network_view = fields.setdefault("network_view", "default")
    if not store.network_view_exists(network_view):
        raise errors.not_found(f"Network view {network_view} not found")
    fields.setdefault("is_default", False)


def finish_zone(
    store: ObjectStore, fields: dict[str, Any], changes: dict[str, Any], modifiers: Modifiers, old: StoredObject | None
) -> None:
    """Apply a create or update of an authoritative zone (see module docstring)."""
    merge(fields, changes, modifiers)
    fqdn = fields["fqdn"] = names.normalise(fields["fqdn"])
    names.check_dns_name("fqdn", fqdn)
    view = fields.setdefault("view", "default")
    if store.dns_view_network_view(view) is None:
        raise errors.not_found(f"View {view} not found")
    if is_other(store.by_key("zone_auth", f"{view}/{fqdn}"), old):
        raise errors.conflict(f"Duplicate object '{fqdn}' of type zone exists in the database.")


def add_default_view(store: ObjectStore, network_view: str) -> None:
    """The DNS view ``default.<network view>`` NIOS creates with a network view (unless the name is taken)."""
    name = f"default.{network_view}"
    if store.by_key("view", name) is None:
        store.insert(StoredObject("view", {"name": name, "network_view": network_view, "is_default": False}))


def dependants(store: ObjectStore, obj: StoredObject) -> list[StoredObject]:
    """What goes with a deleted DNS view (its zones and host records) or zone (the host records it encloses)."""
    if obj.obj_type == "view":
        if obj.get("is_default"):
            raise errors.conflict("The default DNS view cannot be deleted.")
        view = obj.get("name")
        return [o for o in store.all_objects() if o.obj_type in ("zone_auth", "record:host") and o.get("view") == view]
    view, fqdn = obj.get("view"), obj.get("fqdn")
    return [
        o for o in store.of_type("record:host") if o.get("view") == view and store.zone_for(view, o.get("name")) == fqdn
    ]
