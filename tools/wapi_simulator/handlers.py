"""Create, update, delete and render objects: the WAPI write path shared by the HTTP API and the seeding API.

Contract (every function expects the caller to hold ``store.lock``; a refusal raises
:class:`~.errors.WapiError` before anything is stored, so a failed request changes nothing):

* :func:`read_body` checks a POST/PUT body field by field against the object type's schema: unknown fields,
  read-only fields, create-only fields on update (``Field is not allowed for update: <name>``), values of the
  wrong kind, ``+``/``-`` modifiers (update only, on ``extattrs`` and list fields), and extensible attributes
  (each must have an ``extensibleattributedef``, else ``Unknown extensible attribute: <name>``);
* :func:`create_object` / :func:`update_object` apply the type's rules (:mod:`.rules`), then store the object;
  an update that changes the natural key changes the reference, and the old reference stops existing;
* :func:`delete_object` removes an object and what NIOS removes with it (see :mod:`.rules`);
* :func:`render` builds the JSON object WAPI answers: ``_ref`` plus the asked fields, leaving out fields that
  have no value (booleans with a default and ``extattrs`` are always present when asked).
"""

from __future__ import annotations

import copy
from typing import Any

from . import bindings, errors, rules
from .addressing import NEXT_AVAILABLE_PREFIX
from .fields import Field, check_value
from .schema import HOST_ADDR_BASIC, SCHEMAS, ObjectSchema
from .store import ObjectStore, StoredObject, host_address_ref

Modifiers = dict[str, tuple[str, Any]]

# Fields whose value may be ``func:nextavailableip:...`` (resolved by the type's rules).
_FUNC_FIELDS = {("fixedaddress", "ipv4addr"), ("ipv6fixedaddress", "ipv6addr")}
_MODIFIABLE_KINDS = {"extattrs", "list", "strlist", "hostaddrs4", "hostaddrs6"}
_EA_ENTRY_KEYS = {"value", "descendants_action", "inheritance_operation", "inheritance_source"}


def schema_for(obj_type: str) -> ObjectSchema:
    """The schema of a supported object type; ``Unknown object type (<type>)`` otherwise."""
    schema = SCHEMAS.get(obj_type)
    if schema is None:
        raise errors.proto(f"Unknown object type ({obj_type})")
    return schema


def check_extattrs(store: ObjectStore, value: Any) -> dict[str, dict[str, Any]]:
    """Validate an ``extattrs`` value (``{"Name": {"value": ...}}``) against the EA definitions."""
    if not isinstance(value, dict):
        raise errors.invalid_value("extattrs", value, "Must be object type")
    checked: dict[str, dict[str, Any]] = {}
    for name, entry in value.items():
        definition = store.by_key("extensibleattributedef", name)
        if definition is None:
            raise errors.unknown_extattr(name)
        if not isinstance(entry, dict) or "value" not in entry or not set(entry) <= _EA_ENTRY_KEYS:
            raise errors.invalid_value(f"extattrs.{name}", entry, "Must be an object with a value")
        checked[name] = {"value": _check_ea_value(name, definition, entry["value"])}
    return checked


def _check_extattr_names(store: ObjectStore, value: Any) -> dict[str, Any]:
    """``extattrs-``: only the names matter (values, if given, are ignored)."""
    if not isinstance(value, dict):
        raise errors.invalid_value("extattrs", value, "Must be object type")
    for name in value:
        if store.by_key("extensibleattributedef", name) is None:
            raise errors.unknown_extattr(name)
    return dict(value)


def _check_ea_value(name: str, definition: StoredObject, value: Any) -> Any:
    if isinstance(value, list):
        if "V" not in (definition.get("flags") or ""):
            raise errors.proto(f"Extensible attribute {name} does not allow multiple values")
        return [_check_ea_value(name, definition, item) for item in value]
    ea_type = definition.get("type")
    if ea_type == "INTEGER":
        try:
            number = int(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            number = None
        if number is None:
            raise errors.proto(f"Invalid value for extensible attribute {name}: {value!r} is not an integer")
        low, high = definition.get("min"), definition.get("max")
        if (low is not None and number < low) or (high is not None and number > high):
            raise errors.proto(f"Invalid value for extensible attribute {name}: {number} is out of range")
        return number
    if ea_type == "DATE":
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise errors.proto(f"Invalid value for extensible attribute {name}: {value!r}")
        return value
    if not isinstance(value, str):
        raise errors.proto(f"Invalid value for extensible attribute {name}: {value!r} is not a string")
    if ea_type == "ENUM":
        allowed = [item.get("value") for item in definition.get("list_values") or []]
        if value not in allowed:
            raise errors.proto(f"Invalid value for extensible attribute {name}: {value!r} is not in the list")
    return value


def read_body(store: ObjectStore, schema: ObjectSchema, body: Any, creating: bool) -> tuple[dict[str, Any], Modifiers]:
    """Check a request body; answer ``(plain changes, modifiers)`` with values normalised."""
    if not isinstance(body, dict):
        raise errors.proto("The request body must be a JSON object")
    changes: dict[str, Any] = {}
    modifiers: Modifiers = {}
    for raw_name, value in body.items():
        name, op = raw_name, ""
        if raw_name[-1:] in ("+", "-"):
            name, op = raw_name[:-1], raw_name[-1]
        spec = schema.field(name)
        if spec.search_only:
            raise errors.unknown_field(name)
        if spec.readonly:
            raise errors.proto(f"Field is not writable: {name}")
        if spec.create_only and not creating:
            raise errors.proto(f"Field is not allowed for update: {name}")
        if op and (creating or spec.kind not in _MODIFIABLE_KINDS):
            raise errors.proto(f"Modifier {op} not allowed for {name}")
        if name in changes or name in modifiers:
            raise errors.proto(f"Arguments can not be repeated ({name})")
        if op == "-" and spec.kind == "extattrs":
            checked = _check_extattr_names(store, value)
        else:
            checked = _check_field(store, schema, name, spec, value)
        if spec.kind == "extattrs" and op != "-":
            bindings.check_allowed_types(store, schema.name, checked)
        if op:
            modifiers[name] = (op, checked)
        else:
            changes[name] = checked
    if creating:
        for name in schema.required:
            if name not in changes:
                raise errors.missing_field(name)
    return changes, modifiers


def _check_field(store: ObjectStore, schema: ObjectSchema, name: str, spec: Field, value: Any) -> Any:
    if spec.kind == "extattrs":
        return check_extattrs(store, value)
    if spec.kind in ("hostaddrs4", "hostaddrs6"):
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise errors.invalid_value(name, value, "Must be array of object type")
        return copy.deepcopy(value)
    if (schema.name, name) in _FUNC_FIELDS and isinstance(value, str) and value.startswith("func:"):
        if not value.startswith(NEXT_AVAILABLE_PREFIX):
            raise errors.invalid_value(name, value, "Unknown function")
        return value
    return check_value(name, spec, value)


def create_object(store: ObjectStore, obj_type: str, body: Any) -> StoredObject:
    """Create and store one object from a POST body."""
    schema = schema_for(obj_type)
    changes, modifiers = read_body(store, schema, body, creating=True)
    fields: dict[str, Any] = {}
    rules.finish(store, obj_type, fields, changes, modifiers, None)
    obj = StoredObject(obj_type, fields)
    store.insert(obj)
    return obj


def update_object(store: ObjectStore, ref: str, body: Any) -> StoredObject:
    """Apply a PUT body to the object ``ref``; answer the stored object (whose ref may have changed)."""
    old = store.get(ref)
    if old is None:
        raise errors.ref_not_found(ref)
    schema = schema_for(old.obj_type)
    changes, modifiers = read_body(store, schema, body, creating=False)
    fields = copy.deepcopy(old.fields)
    rules.finish(store, old.obj_type, fields, changes, modifiers, old)
    obj = StoredObject(old.obj_type, fields)
    store.replace(old.ref, obj)
    return obj


def delete_object(store: ObjectStore, ref: str) -> str:
    """Delete the object ``ref`` (and its dependants); answer its canonical reference."""
    obj = store.get(ref)
    if obj is None:
        raise errors.ref_not_found(ref)
    rules.delete(store, obj)
    return obj.ref


def render(store: ObjectStore, obj: StoredObject, names: list[str]) -> dict[str, Any]:
    """The WAPI JSON of ``obj`` with fields ``names`` (all must be readable fields of its type)."""
    schema = SCHEMAS[obj.obj_type]
    out: dict[str, Any] = {"_ref": obj.ref}
    for name in names:
        value = _field_value(store, obj, name, schema.fields[name])
        if value is not None:
            out[name] = value
    return out


def _field_value(store: ObjectStore, obj: StoredObject, name: str, spec: Field) -> Any:
    fields = obj.fields
    if spec.kind == "extattrs":
        return copy.deepcopy(fields.get("extattrs") or {})
    if spec.kind in ("hostaddrs4", "hostaddrs6"):
        entries = fields.get(name) or []
        version = 4 if spec.kind == "hostaddrs4" else 6
        return [_render_host_address(store, obj, entry, version) for entry in entries] or None
    derived = rules.derived_value(store, obj, name)
    if derived is not None:
        return derived
    if name in fields:
        return copy.deepcopy(fields[name])
    return copy.deepcopy(spec.default)


def _render_host_address(store: ObjectStore, host: StoredObject, entry: dict[str, Any], version: int) -> dict[str, Any]:
    address_field = "ipv4addr" if version == 4 else "ipv6addr"
    address = entry[address_field]
    dhcp = bool(entry.get("configure_for_dhcp"))
    out: dict[str, Any] = {
        "_ref": host_address_ref(version, address, host.get("name"), host.get("view")),
        "configure_for_dhcp": dhcp,
        "host": host.get("name"),
        address_field: address,
    }
    if dhcp:
        for key, value in entry.items():
            if key not in out and key != "network_view":
                out[key] = copy.deepcopy(value)
        network = rules.host_address_network(store, entry, version)
        if network is not None:
            out["network"] = network
    basic = HOST_ADDR_BASIC[version]
    return {key: value for key, value in out.items() if key == "_ref" or dhcp or key in basic}
