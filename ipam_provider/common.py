"""Small things shared by the core and every backend: the JSON object alias, int64 capping, address text, lists
in messages."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from ipam_provider.runtime.kube.resources import Object as Object  # the one alias, re-exported for the domain

INT64_MAX = 2**63 - 1  # the largest count a status field (an int64 in the CRD schema) can hold


def cap_int64(count: int) -> int:
    """`count`, capped at the int64 maximum (an IPv6 pool can hold more addresses than a status field can say)."""
    return min(count, INT64_MAX)


def normalized_address(address: str) -> str:
    """The address in its canonical text form, without a `/prefix` suffix; text that is no address as it is. A
    canonical dotted IPv4 address is answered without parsing (a repair pass normalizes every address)."""
    parts = address.split(".")
    if len(parts) == 4 and all(part.isdigit() and (part == "0" or not part.startswith("0")) for part in parts):
        return address  # canonical if it is an address at all; text that is none is answered as it is anyway
    try:
        return str(ipaddress.ip_address(address.split("/")[0].strip()))
    except ValueError:
        return address


def listed(items: Sequence[str], at_most: int, separator: str = ", ") -> str:
    """The first `at_most` of `items` joined by `separator`, then "and N more" (after a ";" when that separates)."""
    more = len(items) - at_most
    rest = f"{';' if separator.startswith(';') else ''} and {more} more" if more > 0 else ""
    return separator.join(items[:at_most]) + rest
