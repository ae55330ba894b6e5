"""Parsing and validation of a prefix pool's spec, and its allocatable set of child prefixes.

A prefix pool hands out child prefixes of `allocationPrefixLength` bits carved from `prefixes`. Child prefixes are
numbered by their first address shifted right by the child's host bits (`first_address >> host_bits`), so the
children of one CIDR form one contiguous integer interval: the pool's allocatable set is an IntervalSet of child
numbers, as cheap for a /48 of /64s (65,536 children) or a /32 of /64s (2^32) as for a /120 of /128s. A child
number maps back to the child's first address with `<< host_bits`.

- `prefixes`: CIDRs of one IP family, each a network address (host bits clear), none longer than the allocation
  length. Overlapping entries are merged.
- `excludedPrefixes`: single IPs, ranges `A-B` or CIDRs of the pool's family (as an address pool's entries); every
  child that overlaps one is never handed out.
- `gateway`: an IP of the pool's family, copied into every IPAddress; it blocks nothing.

Validation messages start with the exact text of the Go in-cluster provider's webhook where it has one (IPv6), and
use the same shape for IPv4, which the Go provider does not serve; the CRD checks the same rules with CEL first.
Each ends with the field it is about in parentheses: `(spec.excludedPrefixes[0])`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from backends.incluster.allocatable import (
    ADDRESS_BITS,
    AllocatableSet,
    PoolSpecError,
    parse_address_entry,
    shown,
)
from backends.incluster.intervals import IntervalSet, address_to_int

DEFAULT_ALLOCATION_PREFIX_LENGTH = 64
PREFIXES_REQUIRED = "prefixes is required"
INVALID_CIDR = "provided entry is not a valid IPv{family} CIDR"
NOT_ALIGNED = "CIDR must be network-aligned"
LONGER_THAN_ALLOCATION = "CIDR prefix length must be <= allocationPrefixLength ({length})"
MIXED_FAMILIES = "provided prefixes are of mixed IP families"
ALLOCATION_LENGTH = "allocationPrefixLength must be between 1 and 128"
ALLOCATION_LENGTH_V4 = "allocationPrefixLength must be between 1 and 32 for IPv4 prefixes"
INVALID_GATEWAY = "provided gateway is not a valid IP address"
GATEWAY_FAMILY = "provided gateway must be IPv{family}"
INVALID_EXCLUDED = "provided entry is not a valid IP, range, nor CIDR"
EXCLUDED_FAMILY = "only IPv{family} excluded prefixes are supported"


def _looks_v4(text: str) -> bool:
    return "." in text and ":" not in text


def _parse_cidr(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """One `prefixes` entry as a network. Raises PoolSpecError when it is no CIDR or has host bits set."""
    entry = str(text)
    address_part, slash, length_part = entry.partition("/")
    try:
        if entry != entry.strip() or not slash or not (length_part.isascii() and length_part.isdigit()):
            raise ValueError("not a CIDR")  # blanks: the Go provider's parser refuses them
        if "%" in address_part:
            raise ValueError("a scoped address")
        loose = ipaddress.ip_network(f"{address_part}/{int(length_part)}", strict=False)
    except ValueError:
        family = 4 if _looks_v4(entry) else 6
        raise PoolSpecError([f"{INVALID_CIDR.format(family=family)}: {shown(entry)}"]) from None
    if int(loose.network_address) != int(ipaddress.ip_address(address_part)):
        raise PoolSpecError([f"{NOT_ALIGNED}: {entry}"])
    return loose


def _parse_prefixes(prefixes: Sequence[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    errors: list[str] = []
    networks = []
    for position, text in enumerate(prefixes):
        try:
            networks.append(_parse_cidr(text))
        except PoolSpecError as error:
            errors.extend(f"{message} (spec.prefixes[{position}])" for message in error.messages)
    if errors:
        raise PoolSpecError(errors)
    if len({network.version for network in networks}) > 1:
        raise PoolSpecError([f"{MIXED_FAMILIES}: {', '.join(str(p).strip() for p in prefixes)} (spec.prefixes)"])
    return networks


def _gateway_problems(gateway: str | None, family: int) -> list[str]:
    if not gateway:
        return []
    try:
        if gateway != gateway.strip():  # the Go provider's parser refuses blanks; ip_address tolerates a newline
            raise ValueError("blanks around the gateway")
        parsed = ipaddress.ip_address(gateway)
    except ValueError:
        return [f"{INVALID_GATEWAY}: {shown(gateway)} (spec.gateway)"]
    if parsed.version != family:
        return [f"{GATEWAY_FAMILY.format(family=family)}: {gateway} (spec.gateway)"]
    return []


def build_prefix_set(
    prefixes: Sequence[str],
    allocation_length: int = DEFAULT_ALLOCATION_PREFIX_LENGTH,
    gateway: str | None = None,
    excluded: Sequence[str] = (),
) -> AllocatableSet:
    """Validate a prefix pool's spec and compute its allocatable child numbers (see the module's docstring).

    Raises PoolSpecError listing the problems. The result's `host_bits` is the child's host bit count, and its
    subnet bounds are the first and last allocatable-or-not child numbers of the pool's prefixes.
    """
    if not prefixes:
        raise PoolSpecError([f"{PREFIXES_REQUIRED} (spec.prefixes)"])
    if isinstance(allocation_length, bool) or not 1 <= allocation_length <= 128:
        raise PoolSpecError([f"{ALLOCATION_LENGTH}: {allocation_length!r} (spec.allocationPrefixLength)"])
    networks = _parse_prefixes(prefixes)
    family = networks[0].version
    errors: list[str] = []
    if family == 4 and allocation_length > ADDRESS_BITS[4]:
        errors.append(f"{ALLOCATION_LENGTH_V4}: {allocation_length} (spec.allocationPrefixLength)")
    errors.extend(
        f"{LONGER_THAN_ALLOCATION.format(length=allocation_length)}: {network} (spec.prefixes[{position}])"
        for position, network in enumerate(networks)
        if network.prefixlen > allocation_length
    )
    errors.extend(_gateway_problems(gateway, family))
    exclusions = []
    for position, text in enumerate(excluded):
        try:
            entry = parse_address_entry(text)
        except PoolSpecError:
            errors.append(f"{INVALID_EXCLUDED}: {shown(str(text))} (spec.excludedPrefixes[{position}])")
            continue
        if entry.family != family:
            errors.append(f"{EXCLUDED_FAMILY.format(family=family)}: {entry.text} (spec.excludedPrefixes[{position}])")
        exclusions.append(entry)
    if errors:
        raise PoolSpecError(errors)
    host_bits = ADDRESS_BITS[family] - allocation_length
    children = IntervalSet(
        (int(network.network_address) >> host_bits, int(network.broadcast_address) >> host_bits) for network in networks
    )
    blocked = IntervalSet((entry.first >> host_bits, entry.last >> host_bits) for entry in exclusions)
    first, last = children.first(), children.last()
    assert first is not None and last is not None  # prefixes is not empty
    return AllocatableSet(children.subtract(blocked), family, first, last, host_bits=host_bits)


def child_of(address: str, prefix: int, allocatable: AllocatableSet) -> int | None:
    """The child number of an IPAddress's `address`/`prefix` when the pool could hand that prefix out now (right
    length, in `prefixes`, clear of `excludedPrefixes`); None when it is out of the pool's range."""
    if prefix != ADDRESS_BITS[allocatable.family] - allocatable.host_bits:
        return None
    try:
        child = address_to_int(address, allocatable.family) >> allocatable.host_bits
    except ValueError:
        return None
    return child if child in allocatable.addresses else None
