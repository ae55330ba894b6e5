"""Field descriptions and value checks shared by every simulated object type.

Contract: a :class:`Field` says what kind of value a WAPI field holds and how it behaves (searchable,
read-only, create-only, search-only, the value reported when unset, the allowed choices of an enum).
:func:`check_value` validates one written (or searched) value of a kind and answers it normalised: addresses
and networks in canonical text form, MAC addresses in lower case, JSON containers deep-copied.  A wrong value
is refused with ``Invalid value for <field>: <value>: <reason>`` (400 ``Client.Ibap.Proto``), or, for enums,
``Invalid value for <field> ("<value>") valid values are: ...``.  ``func:nextavailableip:...`` values are not
handled here: the object rules resolve them before or instead of calling :func:`check_value`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from . import errors
from .addressing import parse_address, parse_network

_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


@dataclass(frozen=True)
class Field:
    """One WAPI field.

    ``kind`` is one of: str, bool, int, uint, ipv4, ipv6, cidr4, cidr6, mac, enum, list, strlist, dict, any,
    extattrs, hostaddrs4, hostaddrs6.
    """

    kind: str
    searchable: bool = False
    readonly: bool = False
    create_only: bool = False
    search_only: bool = False
    default: Any = None
    choices: tuple[str, ...] = ()


def check_value(name: str, spec: Field, value: Any) -> Any:
    """Validate one written value of kind ``spec.kind``; answer it normalised. Raises :class:`WapiError`."""
    kind = spec.kind
    if kind == "str":
        if not isinstance(value, str):
            raise errors.invalid_value(name, value, "Must be string type")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise errors.invalid_value(name, value, "Must be boolean type")
        return value
    if kind in ("int", "uint"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise errors.invalid_value(name, value, "Must be integer type")
        if kind == "uint" and value < 0:
            raise errors.invalid_value(name, value, "Must be a non-negative integer")
        return value
    if kind in ("ipv4", "ipv6"):
        address = parse_address(value, 4 if kind == "ipv4" else 6) if isinstance(value, str) else None
        if address is None:
            raise errors.invalid_value(name, value, f"Invalid IPv{kind[-1]} address")
        return str(address)
    if kind in ("cidr4", "cidr6"):
        network = parse_network(value, 4 if kind == "cidr4" else 6) if isinstance(value, str) else None
        if network is None:
            raise errors.invalid_value(name, value, f"Invalid IPv{kind[-1]} network")
        return str(network)
    if kind == "mac":
        if not isinstance(value, str) or not _MAC.match(value.lower()):
            raise errors.invalid_value(name, value, "Invalid MAC address")
        return value.lower()
    if kind == "enum":
        if value not in spec.choices:
            raise errors.proto(
                f"Invalid value for {name} ({json.dumps(value)}) valid values are: {', '.join(spec.choices)}"
            )
        return value
    if kind == "strlist":
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise errors.invalid_value(name, value, "Must be array of string type")
        return list(value)
    if kind == "list":
        if not isinstance(value, list):
            raise errors.invalid_value(name, value, "Must be array type")
        return json.loads(json.dumps(value))
    if kind == "dict":
        if not isinstance(value, dict):
            raise errors.invalid_value(name, value, "Must be object type")
        return json.loads(json.dumps(value))
    return json.loads(json.dumps(value))
