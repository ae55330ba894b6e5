"""What an in-cluster pool's spec may say that the Go in-cluster provider accepts, but that is most likely a mistake.

Such a spec is accepted (existing manifests keep working) and the pool serves claims as it says; the pool's
`SpecConsistent` condition tells what is wrong instead, and the reconciler records a Warning Event with the
condition's reason when it enters it (see `ReportCondition.warning`). The condition is True with reason
`SpecConsistent` when none applies; else False with the reason of the first that applies, in this order, and a
message joining all of them, each naming its field:

- `NoAllocatableAddresses`: the pool can hand out no address at all: `spec.excludedAddresses` (or, for a prefix
  pool, `spec.excludedPrefixes`) covers every address, or what is left is only the gateway (`spec.gateway`), or only
  the subnet's network and broadcast addresses (`spec.allocateReservedIPAddresses` is false). Claims of the pool
  get PoolExhausted.
- `GatewayOutsideSubnet`: `spec.gateway` lies outside the subnet formed by the first address and `spec.prefix`;
  every IPAddress carries a gateway its machine cannot reach directly.
- `OverlappingEntries`: two entries of `spec.addresses` overlap (their union is used; the addresses they share are
  handed out once).
- `ExclusionOutsideAddresses`: an entry of `spec.excludedAddresses` excludes none of `spec.addresses`, a likely typo.

A spec the backend cannot use at all is `Ready=False/InvalidConfiguration` instead, and leaves this condition as it
is. Cost: O(k log k) for k entries, whatever the pool's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backends.incluster.allocatable import ADDRESS_BITS, AddressEntry, AllocatableSet, parse_address_entry
from backends.incluster.intervals import IntervalSet, address_to_int, int_to_address
from ipam_provider.backend.contract import ReportCondition

SPEC_CONSISTENT = "SpecConsistent"
NO_ALLOCATABLE = "NoAllocatableAddresses"
GATEWAY_OUTSIDE_SUBNET = "GatewayOutsideSubnet"
OVERLAPPING_ENTRIES = "OverlappingEntries"
EXCLUSION_OUTSIDE = "ExclusionOutsideAddresses"
LISTED = 5  # entries named per kind of advisory; the rest are counted


@dataclass(frozen=True)
class Advisory:
    """One problem of an accepted spec: the condition's reason and a message naming the field."""

    reason: str
    message: str


def consistency_condition(advisories: Sequence[Advisory]) -> ReportCondition:
    """The pool's `SpecConsistent` condition for these advisories (a Warning Event while False)."""
    if not advisories:
        return ReportCondition(SPEC_CONSISTENT, True, SPEC_CONSISTENT, "the spec has none of the known mistakes")
    message = "; ".join(advisory.message for advisory in advisories)
    return ReportCondition(SPEC_CONSISTENT, False, advisories[0].reason, message, warning=True)


def address_pool_advisories(
    addresses: Sequence[str],
    prefix: int,
    gateway: str | None,
    excluded: Sequence[str],
    allocate_reserved: bool,
    allocatable: AllocatableSet,
) -> list[Advisory]:
    """The advisories of an address pool whose spec parsed into `allocatable` (see the module's docstring)."""
    family = allocatable.family
    entries = [parse_address_entry(text) for text in addresses]
    exclusions = [parse_address_entry(text) for text in excluded]
    gateway_value = address_to_int(gateway, family) if gateway is not None and gateway.strip() else None
    advisories: list[Advisory] = []
    if not allocatable.addresses:
        advisories.append(_nothing_left(entries, exclusions, gateway_value, allocate_reserved))
    if gateway_value is not None and not allocatable.subnet_first <= gateway_value <= allocatable.subnet_last:
        subnet = f"{int_to_address(allocatable.subnet_first, family)}/{prefix}"
        advisories.append(
            Advisory(
                GATEWAY_OUTSIDE_SUBNET,
                f"spec.gateway {gateway} lies outside the pool's subnet {subnet} (the first address of "
                "spec.addresses with spec.prefix): its machines cannot reach it directly; correct spec.gateway",
            )
        )
    advisories += _overlapping(entries)
    advisories += _excluding_nothing(entries, exclusions)
    return advisories


def prefix_pool_advisories(allocatable: AllocatableSet) -> list[Advisory]:
    """The advisories of a prefix pool whose spec parsed into `allocatable`."""
    if allocatable.addresses:
        return []
    length = ADDRESS_BITS[allocatable.family] - allocatable.host_bits
    message = f"spec.excludedPrefixes leaves no /{length} child prefix of spec.prefixes to hand out"
    return [Advisory(NO_ALLOCATABLE, message)]


def _nothing_left(
    entries: Sequence[AddressEntry], exclusions: Sequence[AddressEntry], gateway: int | None, allocate_reserved: bool
) -> Advisory:
    """Which field leaves the pool without an address: the exclusions, else the gateway, else the reserved ones."""
    left = IntervalSet((entry.first, entry.last) for entry in entries)
    left = left.subtract(IntervalSet((entry.first, entry.last) for entry in exclusions))
    if not left:
        field = "spec.excludedAddresses"
    elif gateway is not None and not left.subtract(IntervalSet([(gateway, gateway)])):
        field = "spec.gateway"
    else:
        field = "the subnet's reserved addresses (spec.allocateReservedIPAddresses is false)"
    return Advisory(NO_ALLOCATABLE, f"{field} leaves no address of spec.addresses to hand out")


def _overlapping(entries: Sequence[AddressEntry]) -> list[Advisory]:
    """An advisory per entry of addresses that overlaps an earlier-starting one."""
    found: list[str] = []
    widest: tuple[int, int] | None = None  # (last, index) of the entry reaching furthest so far
    for index, entry in sorted(enumerate(entries), key=lambda pair: (pair[1].first, pair[0])):
        if widest is not None and entry.first <= widest[0]:
            other = entries[widest[1]]
            found.append(f"spec.addresses[{index}] ({entry.text}) overlaps spec.addresses[{widest[1]}] ({other.text})")
        if widest is None or entry.last > widest[0]:
            widest = (entry.last, index)
    if not found:
        return []
    message = "; ".join(found[:LISTED]) + _more(found) + ": merge them into one entry"
    return [Advisory(OVERLAPPING_ENTRIES, message)]


def _excluding_nothing(entries: Sequence[AddressEntry], exclusions: Sequence[AddressEntry]) -> list[Advisory]:
    """An advisory naming the entries of excludedAddresses that share no address with addresses."""
    addresses = IntervalSet((entry.first, entry.last) for entry in entries)
    found = [
        f"spec.excludedAddresses[{index}] ({entry.text})"
        for index, entry in enumerate(exclusions)
        if not addresses.intersection(IntervalSet([(entry.first, entry.last)]))
    ]
    if not found:
        return []
    message = f"{', '.join(found[:LISTED])}{_more(found)} excludes none of spec.addresses: correct or remove it"
    return [Advisory(EXCLUSION_OUTSIDE, message)]


def _more(items: Sequence[str]) -> str:
    return f" and {len(items) - LISTED} more" if len(items) > LISTED else ""
