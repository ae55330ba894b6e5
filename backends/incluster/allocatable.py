"""Parsing and validation of an in-cluster pool's address entries, and its allocatable set.

An entry of `addresses` or `excludedAddresses` is an IP, a range `A-B` of one family with A <= B, or a CIDR (host
bits set mean the whole network, as in the Go provider), without blanks; netmasks and scoped IPv6 addresses are
refused. Entries become integer intervals, never expanded address by address. Messages start with the Go
provider's webhook text, optionally `: <entry>`, and end with their field: `(spec.addresses[1])`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from backends.incluster.intervals import IntervalSet, int_to_address, parse_ip
from backends.validation import PoolSpecError

ADDRESSES_REQUIRED = "addresses is required"
INVALID_ADDRESS = "provided address is not a valid IP, range, nor CIDR"
MIXED_FAMILIES = "provided addresses are of mixed IP families"
GATEWAY_MIXED_FAMILIES = "provided gateway and addresses are of mixed IP families"
EXCLUDED_MIXED_FAMILIES = "addresses and excluded addresses are of mixed IP families"
INVALID_PREFIX = "provided prefix is not valid"
DIFFERENT_SUBNET = "provided address belongs to a different subnet than others"
# Not among the Go provider's listed messages: our own wording for an unparsable gateway.
INVALID_GATEWAY = "provided gateway is not a valid IP address"

ADDRESS_BITS = {4: 32, 6: 128}


FIELD_SUFFIX = re.compile(r" \(spec\.[A-Za-z.]+(\[\d+\])?\)$")


def without_field(message: str) -> str:
    """A validation message without its field, to recognise one problem whose entry moved to another index."""
    return FIELD_SUFFIX.sub("", message)


@dataclass(frozen=True)
class AddressEntry:
    """One parsed entry: the closed integer interval `[first, last]` of IP `family` (4 or 6)."""

    text: str
    family: int
    first: int
    last: int


@dataclass(frozen=True)
class AllocatableSet:
    """The addresses a pool may hand out, its IP family and subnet, as integers: for a prefix pool (`host_bits` > 0
    or not) child numbers, each the child's first address shifted right by `host_bits` (see `prefix_spec`)."""

    addresses: IntervalSet
    family: int
    subnet_first: int = 0  # 0, 0: no subnet known (an index's allocatable set alone)
    subnet_last: int = 0
    host_bits: int = 0


def parse_address_entry(text: str) -> AddressEntry:
    """Parse one entry (IP, range or CIDR), written as the Go provider's parsers take it: no blanks in it. Raises
    PoolSpecError(INVALID_ADDRESS) when it is none of these."""
    if not isinstance(text, str):
        raise PoolSpecError(f"{INVALID_ADDRESS}: {text!r}")
    try:
        if "/" in text:
            address_part, _, length_part = text.partition("/")
            if not (length_part.isascii() and length_part.isdigit()):
                raise ValueError("prefix length must be a decimal number")
            parse_ip(address_part)  # refuses a scoped address, which ip_network would tolerate
            network = ipaddress.ip_network(f"{address_part}/{int(length_part)}", strict=False)
            return AddressEntry(text, network.version, int(network.network_address), int(network[-1]))
        if "-" in text:
            low_text, high_text = text.split("-")  # more than one `-` raises ValueError
            (low_family, first), (high_family, last) = parse_ip(low_text), parse_ip(high_text)
            if low_family != high_family:
                raise ValueError("range ends are of different IP families")
            if first > last:
                raise ValueError("range start is after its end")
            return AddressEntry(text, low_family, first, last)
        family, value = parse_ip(text)
        return AddressEntry(text, family, value, value)
    except ValueError:
        raise PoolSpecError(f"{INVALID_ADDRESS}: {shown(text)}") from None


def shown(text: str) -> str:
    """`text` for a message; quoted, and said so, when blanks surround it, which a message would hide."""
    return text if text == text.strip() else f"{text!r} (blanks around it)"


Parsed = TypeVar("Parsed")


def parse_entries(
    entries: Sequence[str], parse: Callable[[str], Parsed], errors: list[str], field: str
) -> list[Parsed]:
    """The entries of the list `field` parsed by `parse`; a problem in `errors` per entry that does not parse."""
    parsed: list[Parsed] = []
    for position, text in enumerate(entries):
        try:
            parsed.append(parse(text))
        except PoolSpecError as error:
            errors.extend(f"{message} ({field}[{position}])" for message in error.messages)
    return parsed


def _subnet_bounds(first_address: int, prefix: int, family: int) -> tuple[int, int]:
    host_bits = ADDRESS_BITS[family] - prefix
    subnet_first = (first_address >> host_bits) << host_bits
    return subnet_first, subnet_first + (1 << host_bits) - 1


def _check_spec(
    addresses: Sequence[str], prefix: int, gateway: str | None, excluded_addresses: Sequence[str]
) -> tuple[list[AddressEntry], list[AddressEntry], int | None, int]:
    """A pool spec's parsed addresses, exclusions, gateway and family; else PoolSpecError, checked in the Go
    provider's order, a failing stage stopping the next: addresses given; all entries parse; one family; the gateway
    and exclusions of it, the prefix within its bits, `addresses` inside the first address's subnet."""
    if not addresses:
        raise PoolSpecError(f"{ADDRESSES_REQUIRED} (spec.addresses)")
    errors: list[str] = []
    entries = parse_entries(addresses, parse_address_entry, errors, "spec.addresses")
    if errors:
        raise PoolSpecError(*errors)
    exclusions = parse_entries(excluded_addresses, parse_address_entry, errors, "spec.excludedAddresses")
    if errors:
        raise PoolSpecError(*errors)

    family = entries[0].family
    mixed = [entry.text for entry in entries if entry.family != family]
    if mixed:
        raise PoolSpecError(f"{MIXED_FAMILIES}: {', '.join(mixed)} (spec.addresses)")

    gateway_value: int | None = None
    if gateway:
        try:
            gateway_family, gateway_value = parse_ip(gateway)
        except ValueError:
            errors.append(f"{INVALID_GATEWAY}: {shown(gateway)} (spec.gateway)")
        else:
            if gateway_family != family:
                errors.append(f"{GATEWAY_MIXED_FAMILIES}: {gateway} (spec.gateway)")

    mixed_exclusions = [entry.text for entry in exclusions if entry.family != family]
    if mixed_exclusions:
        errors.append(f"{EXCLUDED_MIXED_FAMILIES}: {', '.join(mixed_exclusions)} (spec.excludedAddresses)")

    if isinstance(prefix, bool) or not isinstance(prefix, int) or not 0 <= prefix <= ADDRESS_BITS[family]:
        errors.append(f"{INVALID_PREFIX}: {prefix!r} (spec.prefix)")
    else:
        subnet_first, subnet_last = _subnet_bounds(entries[0].first, prefix, family)
        errors.extend(
            f"{DIFFERENT_SUBNET}: {entry.text} (spec.addresses[{position}])"
            for position, entry in enumerate(entries)
            if entry.first < subnet_first or entry.last > subnet_last
        )
    if errors:
        raise PoolSpecError(*errors)
    return entries, exclusions, gateway_value, family


def build_allocatable_set(
    addresses: Sequence[str],
    prefix: int,
    gateway: str | None = None,
    excluded_addresses: Sequence[str] = (),
    allocate_reserved: bool = False,
) -> AllocatableSet:
    """The addresses a valid pool spec hands out (else PoolSpecError, see `_check_spec`): `addresses` minus
    `excluded_addresses` and the gateway, and, unless `allocate_reserved`, minus the subnet's first address (IPv4
    network, IPv6 subnet-router anycast) and, for IPv4, its last (broadcast, even for a /31 or /32). O(k log k)."""
    entries, exclusions, gateway_value, family = _check_spec(addresses, prefix, gateway, excluded_addresses)
    subnet_first, subnet_last = _subnet_bounds(entries[0].first, prefix, family)
    removed = [(entry.first, entry.last) for entry in exclusions]
    if not allocate_reserved:
        removed.append((subnet_first, subnet_first))
        if family == 4:
            removed.append((subnet_last, subnet_last))
    if gateway_value is not None:
        removed.append((gateway_value, gateway_value))
    allocatable = IntervalSet((entry.first, entry.last) for entry in entries).subtract(IntervalSet(removed))
    return AllocatableSet(allocatable, family, subnet_first, subnet_last)


def pre_allocation_problems(pre_allocations: Mapping[str, str], allocatable: AllocatableSet) -> list[str]:
    """What is wrong with a pool's `preAllocations` (claim name → address) on their own: an address that does not
    parse, is of another family, is not allocatable, or is named for two claims (not collisions with held ones)."""
    problems: list[str] = []
    claims_of: dict[int, list[str]] = {}
    for claim_name, text in sorted(pre_allocations.items()):
        try:
            family, value = parse_ip(str(text))
        except ValueError:
            problems.append(f"spec.preAllocations[{claim_name}]: {text!r} is not an IP address")
            continue
        if family != allocatable.family:
            problems.append(f"spec.preAllocations[{claim_name}]: {text} is not an IPv{allocatable.family} address")
        elif value not in allocatable.addresses:
            problems.append(f"spec.preAllocations[{claim_name}]: {text} is not an allocatable address of the pool")
        else:
            claims_of.setdefault(value, []).append(claim_name)
    for value, names in sorted(claims_of.items()):
        if len(names) > 1:
            address = int_to_address(value, allocatable.family)
            problems.append(
                f"spec.preAllocations: {address} is pre-allocated to more than one claim: {', '.join(names)}"
            )
    return problems
