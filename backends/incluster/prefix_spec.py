"""An in-cluster prefix pool (InClusterPrefixPool / GlobalInClusterPrefixPool) as allocation and admission read it.

It hands out child prefixes of `allocationPrefixLength` bits carved from `prefixes` (CIDRs of one family, network
addresses, none longer than the allocation length, overlaps merged), none overlapping `excludedPrefixes` (IPs,
ranges or CIDRs); `gateway` is copied into every IPAddress and blocks nothing. Children are numbered by their first
address shifted right by the host bits: the allocatable set is an IntervalSet of child numbers, as cheap for a /32
of /64s as for a /120 of /128s. Messages start with the Go provider's text (IPv6; the same shape for IPv4) and end
with their field.

`prefix_pool_change_problems(old, new, in_use)` refuses a spec the backend cannot use (on UPDATE, only messages the
old spec did not have) and, on UPDATE, children in use that the new spec would no longer hand out and the old one
would: the Go provider's "existing allocations become non-allocatable". An unchanged spec is never refused.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar

from pydantic import Field

from backends.incluster.allocatable import (
    ADDRESS_BITS,
    AllocatableSet,
    parse_address_entry,
    parse_entries,
    shown,
    without_field,
)
from backends.incluster.intervals import IntervalSet, address_to_int
from backends.incluster.spec import (
    ENTRY_RULE,
    NO_ALLOCATABLE,
    SPEC_ERRORS,
    Advisory,
    Gateway,
    ParsedPool,
    PreAllocations,
    first_line,
    read_pool,
    stranded_refusal,
)
from backends.validation import OpenAPI, PoolSpecError, Spec, rules
from ipam_provider.backend.contract import AddressInUse, PoolRef
from ipam_provider.common import Object

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
        family = 4 if "." in entry and ":" not in entry else 6
        raise PoolSpecError(f"{INVALID_CIDR.format(family=family)}: {shown(entry)}") from None
    if int(loose.network_address) != int(ipaddress.ip_address(address_part)):
        raise PoolSpecError(f"{NOT_ALIGNED}: {entry}")
    return loose


def _parse_prefixes(prefixes: Sequence[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    errors: list[str] = []
    networks = parse_entries(prefixes, _parse_cidr, errors, "spec.prefixes")
    if errors:
        raise PoolSpecError(*errors)
    if len({network.version for network in networks}) > 1:
        raise PoolSpecError(f"{MIXED_FAMILIES}: {', '.join(str(p).strip() for p in prefixes)} (spec.prefixes)")
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
        raise PoolSpecError(f"{PREFIXES_REQUIRED} (spec.prefixes)")
    if isinstance(allocation_length, bool) or not 1 <= allocation_length <= 128:
        raise PoolSpecError(f"{ALLOCATION_LENGTH}: {allocation_length!r} (spec.allocationPrefixLength)")
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
        raise PoolSpecError(*errors)
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


ALLOCATION = f"(has(self.allocationPrefixLength) ? self.allocationPrefixLength : {DEFAULT_ALLOCATION_PREFIX_LENGTH})"
# An entry written with dots and no colon is meant as IPv4; anything else (IPv4-mapped IPv6 included) as IPv6.
LOOKS_V4 = "(self.contains('.') && !self.contains(':'))"
V6_POOL = "self.prefixes[0].contains(':')"
NOT_EMPTY = "self.prefixes.size() == 0"
GATEWAY_OF_FAMILY = f"!has(self.gateway) || self.gateway == '' || !isIP(self.gateway) || {NOT_EMPTY} || "
GATEWAY_OF_FAMILY += f"self.gateway.contains(':') == {V6_POOL}"
EXCLUDED_OF_FAMILY = f"!has(self.excludedPrefixes) || {NOT_EMPTY} || "
PREFIX = OpenAPI(
    maxLength=100,
    validations=rules(
        (f"{LOOKS_V4} || isCIDR(self)", INVALID_CIDR.format(family=6)),
        (f"!{LOOKS_V4} || isCIDR(self)", INVALID_CIDR.format(family=4)),
        ("!isCIDR(self) || cidr(self) == cidr(self).masked()", NOT_ALIGNED),
    ),
)


class PrefixPoolSpec(Spec):
    """The CRD checks what the Go provider's webhook checks, with its messages (and IPv4 prefix pools too, with
    messages of the same shape); what CEL cannot check (allocations a change would strand) the backend reports. The
    Go message for a too long entry ends with the length, which a messageExpression could not carry (the API
    server's cost estimate refuses string(int)), so the CRD's message stops before it."""

    openapi: ClassVar[OpenAPI] = OpenAPI(
        "spec is the desired state of the prefix pool. Wire-compatible with the Go in-cluster provider's v1alpha2 "
        "API, IPv4 prefixes added.",
        validations=rules(
            ("self.prefixes.size() > 0", PREFIXES_REQUIRED, ".prefixes"),
            (
                "self.prefixes.all(p, p.contains(':')) || self.prefixes.all(p, !p.contains(':'))",
                MIXED_FAMILIES,
                ".prefixes",
            ),
            (
                f"self.prefixes.all(p, !isCIDR(p) || cidr(p).prefixLength() <= {ALLOCATION})",
                LONGER_THAN_ALLOCATION.partition(" (")[0],
                ".prefixes",
            ),
            (f"{NOT_EMPTY} || {V6_POOL} || {ALLOCATION} <= 32", ALLOCATION_LENGTH_V4, ".allocationPrefixLength"),
            (f"{GATEWAY_OF_FAMILY} || !{V6_POOL}", GATEWAY_FAMILY.format(family=6), ".gateway"),
            (f"{GATEWAY_OF_FAMILY} || {V6_POOL}", GATEWAY_FAMILY.format(family=4), ".gateway"),
            (
                f"{EXCLUDED_OF_FAMILY}!{V6_POOL} || self.excludedPrefixes.all(e, e.contains(':'))",
                EXCLUDED_FAMILY.format(family=6),
                ".excludedPrefixes",
            ),
            (
                f"{EXCLUDED_OF_FAMILY}{V6_POOL} || self.excludedPrefixes.all(e, !e.contains(':'))",
                EXCLUDED_FAMILY.format(family=4),
                ".excludedPrefixes",
            ),
        ),
    )

    prefixes: Annotated[list[str], OpenAPI(required=True, maxItems=1024, items=PREFIX)] = Field(default_factory=list)
    """prefixes are the CIDRs the pool carves its child prefixes from, all of one IP family; each must be a network
    address (fd00::/48, 10.0.0.0/16)."""
    allocation_prefix_length: Annotated[
        int,
        OpenAPI(
            defaulted=True,
            minimum=1,
            maximum=128,
            validations=rules(("self == oldSelf", "spec.allocationPrefixLength is immutable")),
        ),
    ] = Field(default=DEFAULT_ALLOCATION_PREFIX_LENGTH, alias="allocationPrefixLength")
    """allocationPrefixLength is the length of each handed-out child prefix (64: every claim gets a /64). At least the
    length of every entry of prefixes; at most 128, or 32 for IPv4. It cannot change once the pool exists."""
    gateway: Gateway = None
    """gateway is copied into every IPAddress of the pool. It does not keep any child prefix from being handed out."""
    # The Go prefix pool webhook says "entry" where its address pool webhook says "address".
    excluded_prefixes: Annotated[
        list[str],
        OpenAPI(maxItems=1024, items=OpenAPI(maxLength=100, validations=rules((ENTRY_RULE, INVALID_EXCLUDED)))),
    ] = Field(default_factory=list, alias="excludedPrefixes")
    """excludedPrefixes are never handed out: a child prefix that overlaps any of them is skipped. Each entry is a
    single IP, a range of two IPs (A-B), or a CIDR."""


def parse_prefix_pool(pool: Object) -> tuple[PrefixPoolSpec, AllocatableSet]:
    """The pool's spec and allocatable child numbers; PoolSpecError or ValidationError when invalid."""
    spec = PrefixPoolSpec.model_validate(pool.get("spec") or {})
    allocatable = build_prefix_set(spec.prefixes, spec.allocation_prefix_length, spec.gateway, spec.excluded_prefixes)
    return spec, allocatable


@dataclass(frozen=True, kw_only=True)
class PrefixPool(ParsedPool):
    """A prefix pool as one call reads it: no reuse grace period, no pre-allocations, the default policy."""

    @classmethod
    def parse(cls, ref: PoolRef, pool: Object) -> PrefixPool:
        fields, allocatable, generation, uid = read_pool(ref, pool, parse_prefix_pool)
        pre = PreAllocations.of(ref, {}, allocatable)
        prefix, gateway = fields.allocation_prefix_length, fields.gateway
        return cls(
            ref=ref, allocatable=allocatable, prefix=prefix, gateway=gateway, pre=pre, generation=generation, uid=uid
        )

    def why_not(self, address: str) -> str | None:
        """A requested address of a prefix pool names a child prefix by its first address."""
        if child_of(address, self.prefix, self.allocatable) is None:
            return f"it is not the first address of a /{self.prefix} prefix in spec.prefixes, clear of excludedPrefixes"
        if address_to_int(address, self.allocatable.family) & ((1 << self.allocatable.host_bits) - 1):
            return f"it is not the first address of a /{self.prefix} prefix"
        return None

    def exhausted(self, total: int) -> str:
        return (
            f"{self.ref} has no free /{self.prefix} prefix: all {total} are in use; add prefixes to the pool or "
            "delete claims"
        )


STRANDED = "existing allocations become non-allocatable"  # the Go provider's text


def prefix_pool_change_problems(old: Object | None, new: Object | None, in_use: Sequence[AddressInUse]) -> list[str]:
    """The reasons to refuse changing the prefix pool `old` into `new` (see the module)."""
    if new is None or (old is not None and (old.get("spec") or {}) == (new.get("spec") or {})):
        return []
    allocatable, problems = _parsed(new)
    previous, known = _parsed(old) if old is not None else (None, [])
    known = [without_field(problem) for problem in known]
    problems = [problem for problem in problems if without_field(problem) not in known]
    if problems:
        return [f"the pool's spec is invalid: {'; '.join(problems)}"]
    if old is None or allocatable is None:
        return []
    held = {
        address.address
        for address in in_use
        if not _allocatable(address, allocatable) and (previous is None or _allocatable(address, previous))
    }
    if not held:
        return []
    remedy = "keep their prefixes in the pool or release them first"
    return [stranded_refusal(STRANDED, PoolRef.from_object(new), len(held), remedy)]


def _parsed(pool: Object) -> tuple[AllocatableSet | None, list[str]]:
    """The pool's allocatable children, or None and the backend's messages for a spec it cannot use."""
    try:
        _, allocatable = parse_prefix_pool(pool)
    except PoolSpecError as error:
        return None, list(error.messages)
    except SPEC_ERRORS as error:
        return None, [first_line(error)]
    return allocatable, []


def _allocatable(address: AddressInUse, allocatable: AllocatableSet) -> bool:
    """Whether the pool could hand out the IPAddress's prefix now (none: the allocation length)."""
    length = ADDRESS_BITS[allocatable.family] - allocatable.host_bits
    return child_of(address.address, address.prefix if address.prefix is not None else length, allocatable) is not None


def prefix_pool_advisories(allocatable: AllocatableSet) -> list[Advisory]:
    """The advisories of a prefix pool whose spec parsed into `allocatable`."""
    if allocatable.addresses:
        return []
    length = ADDRESS_BITS[allocatable.family] - allocatable.host_bits
    message = f"spec.excludedPrefixes leaves no /{length} child prefix of spec.prefixes to hand out"
    return [Advisory(NO_ALLOCATABLE, message)]
