"""Query arguments, searches, return fields and paging.

Contract:

* :func:`parse_query` splits WAPI query arguments into options (``_return_fields``, ``_return_fields+``,
  ``_return_as_object``, ``_max_results``, ``_paging``, ``_page_id``, ``_function``; ``_proxy_search``,
  ``_inheritance`` and ``_return_type=json|json-pretty`` are accepted and ignored) and plain arguments
  (search filters for GET, field values for POST/PUT); any other ``_``-argument is refused;
* search filters are ``<field><modifier>=<value>`` with modifier ``''`` (equal), ``!`` (not equal), ``:``
  (case-insensitive), ``~`` (regular expression), ``:~``, ``<`` / ``>`` (<= / >=, numeric for addresses);
  extensible attributes are searched as ``*<name><modifier>=<value>`` and must be defined
  (``Unknown extensible attribute``); a field that exists but is not searchable answers
  ``Field is not searchable: <name>``; an equality search on ``view`` naming a DNS view that does not exist
  answers 404 ``View <name> not found`` (so does ``view=`` or ``view= ``: the blank pseudo-view of IPAM-only
  host records cannot be searched for); ``=`` compares case-sensitively, ``:=`` does not (names are stored in
  lower case, see :mod:`.names`); repeated filters must all match; an equality search on an address,
  network or MAC field must carry a valid value of that kind (so ``ipv4addr=func:nextavailableip:...``, what
  infoblox-client's ``check_if_exists=True`` sends for an allocation, is refused with ``Invalid value``);
* :func:`return_field_names` answers the fields to render: the basic fields, or exactly ``_return_fields``,
  plus ``_return_fields+``; unknown names are refused before anything else happens;
* :class:`Pager` runs a search: without paging ``_max_results`` > 0 truncates, < 0 (default -1000) refuses a
  larger result with ``Result set too large (> N)``; with ``_paging=1`` (which needs ``_return_as_object=1``
  and a positive ``_max_results``) it answers ``{"result": [...], "next_page_id": "..."}`` and remembers the
  rest of the snapshot under that page id; the last page has no ``next_page_id``.  Objects deleted between
  pages are skipped.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from . import errors, handlers, names, rules
from .addressing import parse_address
from .fields import Field, check_value
from .schema import ObjectSchema
from .store import ObjectStore, StoredObject

_IGNORED = {"_proxy_search", "_inheritance"}
_MODIFIER_CHARS = "!:~<>"
_ADDRESS_KINDS = {"ipv4", "ipv6"}
_TYPED_SEARCH_KINDS = {"ipv4", "ipv6", "cidr4", "cidr6", "mac"}


@dataclass
class QueryOptions:
    """Parsed query arguments."""

    return_fields: list[str] | None = None
    return_plus: list[str] = field(default_factory=list)
    as_object: bool = False
    max_results: int | None = None
    paging: bool = False
    page_id: str | None = None
    function: str | None = None
    arguments: list[tuple[str, str]] = field(default_factory=list)

    @property
    def wants_object(self) -> bool:
        """Whether the caller asked for fields back (so POST/PUT answer an object, not a bare ref)."""
        return self.return_fields is not None or bool(self.return_plus)


def _flag(name: str, value: str) -> bool:
    if value not in ("0", "1", "true", "false", "True", "False"):
        raise errors.proto(f"Invalid value for {name}: {value}")
    return value in ("1", "true", "True")


def parse_query(pairs: list[tuple[str, str]]) -> QueryOptions:
    """Split query arguments into :class:`QueryOptions` (see module docstring)."""
    opts = QueryOptions()
    for key, value in pairs:
        if key == "_return_fields":
            opts.return_fields = (opts.return_fields or []) + [v for v in value.split(",") if v]
        elif key in ("_return_fields+", "_return_fields "):  # a literal '+' decodes as a space
            opts.return_plus += [v for v in value.split(",") if v]
        elif key == "_return_as_object":
            opts.as_object = _flag(key, value)
        elif key == "_paging":
            opts.paging = _flag(key, value)
        elif key == "_max_results":
            try:
                opts.max_results = int(value)
            except ValueError:
                raise errors.proto(f"Invalid value for _max_results: {value}") from None
        elif key == "_page_id":
            opts.page_id = value
        elif key == "_function":
            opts.function = value
        elif key == "_return_type":
            if value not in ("json", "json-pretty"):
                raise errors.proto(f"_return_type {value} is not supported by the WAPI simulator")
        elif key in _IGNORED:
            continue
        elif key.startswith("_"):
            raise errors.unknown_field(key)
        else:
            opts.arguments.append((key, value))
    return opts


def return_field_names(schema: ObjectSchema, opts: QueryOptions) -> list[str]:
    """The fields to render for ``opts``; refuses unknown or search-only names."""
    names = list(schema.basic) if opts.return_fields is None else list(opts.return_fields)
    names += opts.return_plus
    unique: list[str] = []
    for name in names:
        if schema.field(name).search_only:
            raise errors.unknown_field(name)
        if name not in unique:
            unique.append(name)
    return unique


@dataclass(frozen=True)
class _Filter:
    name: str
    op: str
    value: str
    extattr: bool


def _parse_filters(store: ObjectStore, schema: ObjectSchema, arguments: list[tuple[str, str]]) -> list[_Filter]:
    filters = []
    for key, value in arguments:
        stripped = key.rstrip(_MODIFIER_CHARS)
        op = key[len(stripped) :]
        if op not in ("", "!", ":", "~", ":~", "!:", "<", ">"):
            raise errors.proto(f"Invalid search modifier {op} for {stripped}")
        if stripped.startswith("*"):
            name = stripped[1:]
            if store.by_key("extensibleattributedef", name) is None:
                raise errors.unknown_extattr(name)
            filters.append(_Filter(name, op, value, True))
            continue
        spec = schema.field(stripped)
        if not spec.searchable and not spec.search_only:
            raise errors.proto(f"Field is not searchable: {stripped}")
        if stripped == "view" and op == "" and store.dns_view_network_view(value) is None:
            raise names.missing_view(value)
        if op in ("", "!") and spec.kind in _TYPED_SEARCH_KINDS:
            value = check_value(stripped, Field(spec.kind), value)
        if op and "~" in op:
            try:
                re.compile(value)
            except re.error:
                raise errors.proto(f"Invalid regular expression for {stripped}: {value}") from None
        filters.append(_Filter(stripped, op, value, False))
    return filters


def _candidates(store: ObjectStore, schema: ObjectSchema, obj: StoredObject, flt: _Filter) -> list[str]:
    if flt.extattr:
        entry = (obj.get("extattrs") or {}).get(flt.name)
        if entry is None:
            return []
        value = entry["value"]
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]
    if obj.obj_type == "record:host" and flt.name in ("ipv4addr", "ipv6addr", "mac"):
        entries = obj.get("ipv6addrs" if flt.name == "ipv6addr" else "ipv4addrs") or []
        return [str(e[flt.name]) for e in entries if e.get(flt.name) is not None]
    value = rules.derived_value(store, obj, flt.name)
    if value is None:
        value = obj.get(flt.name, schema.fields[flt.name].default)
    if value is None:
        return []
    if isinstance(value, bool):
        return ["true" if value else "false"]
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _matches(store: ObjectStore, schema: ObjectSchema, obj: StoredObject, flt: _Filter) -> bool:
    if flt.name == "contains_address" and not flt.extattr:
        address = parse_address(flt.value)
        network = ipaddress.ip_network(obj.get("network"))
        return address is not None and address.version == network.version and address in network
    found = _candidates(store, schema, obj, flt)
    wanted = flt.value
    is_address = not flt.extattr and schema.fields[flt.name].kind in _ADDRESS_KINDS
    if is_address and parse_address(wanted) is not None:
        wanted = str(parse_address(wanted))
    op = flt.op
    if op in ("<", ">"):

        def number(text: str) -> Any:
            address = parse_address(text)
            return int(address) if address is not None else text

        target = number(wanted)
        return any(
            (number(c) <= target if op == "<" else number(c) >= target)
            for c in found
            if type(number(c)) is type(target)
        )
    if "~" in op:
        pattern = re.compile(wanted, re.IGNORECASE if ":" in op else 0)
        return any(pattern.search(c) for c in found)
    equal = any(c.lower() == wanted.lower() for c in found) if ":" in op else wanted in found
    return not equal if "!" in op else equal


def _sort_key(obj: StoredObject) -> tuple[Any, ...]:
    fields = obj.fields
    if obj.obj_type in ("network", "ipv6network"):
        network = ipaddress.ip_network(fields["network"])
        return (int(network.network_address), network.prefixlen, fields["network_view"])
    if obj.obj_type in ("fixedaddress", "ipv6fixedaddress"):
        address: str = fields.get("ipv4addr") or fields["ipv6addr"]
        return (int(ipaddress.ip_address(address)), fields["network_view"])
    if obj.obj_type == "range":
        return (int(ipaddress.ip_address(fields["start_addr"])), fields["network_view"])
    if obj.obj_type == "record:host":
        return (fields["name"].lower(), fields["view"])
    if obj.obj_type == "zone_auth":
        return (fields["fqdn"], fields["view"])
    return (str(fields.get("name", "")),)


class Pager:
    """Runs searches and keeps paged-search snapshots. Thread-safe for its own state."""

    def __init__(self, max_cursors: int = 1000) -> None:
        self._lock = threading.Lock()
        self._cursors: OrderedDict[str, tuple[list[str], int, list[str]]] = OrderedDict()
        self._max_cursors = max_cursors

    def search(self, store: ObjectStore, schema: ObjectSchema, opts: QueryOptions) -> Any:
        """Answer a GET on an object type (the caller holds ``store.lock``)."""
        names = return_field_names(schema, opts)
        if opts.paging:
            return self._page(store, schema, opts, names)
        found = self._find(store, schema, opts)
        limit = -1000 if opts.max_results is None else opts.max_results
        if limit < 0 and len(found) > -limit:
            raise errors.proto(f"Result set too large (> {-limit})")
        if limit > 0:
            found = found[:limit]
        result = [handlers.render(store, obj, names) for obj in found]
        return {"result": result} if opts.as_object else result

    @staticmethod
    def _find(store: ObjectStore, schema: ObjectSchema, opts: QueryOptions) -> list[StoredObject]:
        filters = _parse_filters(store, schema, opts.arguments)
        found = [obj for obj in store.of_type(schema.name) if all(_matches(store, schema, obj, f) for f in filters)]
        return sorted(found, key=_sort_key)

    def _page(self, store: ObjectStore, schema: ObjectSchema, opts: QueryOptions, names: list[str]) -> Any:
        if not opts.as_object:
            raise errors.proto("_return_as_object needs to be enabled for paging requests.")
        if opts.max_results is None or opts.max_results <= 0:
            raise errors.proto("_max_results needs to be a positive number for paging requests.")
        if opts.page_id is not None:
            with self._lock:
                cursor = self._cursors.pop(opts.page_id, None)
            if cursor is None:
                raise errors.proto(f"Invalid page id: {opts.page_id}")
            refs, offset, names = cursor
        else:
            refs, offset = [obj.ref for obj in self._find(store, schema, opts)], 0
        chunk = refs[offset : offset + opts.max_results]
        objects = [obj for obj in (store.get(ref) for ref in chunk) if obj is not None]
        answer: dict[str, Any] = {"result": [handlers.render(store, obj, names) for obj in objects]}
        next_offset = offset + opts.max_results
        if next_offset < len(refs):
            page_id = "789c" + secrets.token_hex(24)
            with self._lock:
                self._cursors[page_id] = (refs, next_offset, names)
                while len(self._cursors) > self._max_cursors:
                    self._cursors.popitem(last=False)
            answer["next_page_id"] = page_id
        return answer
