"""An in-cluster address pool (InClusterIPPool / GlobalInClusterIPPool) as allocation and admission read it.

`ParsedPool` is what one call reads of a pool, parsed once; `AddressPool` is an address pool's.

`PreAllocations`, `spec.preAllocations`: claim → the address it gets (an `InClusterIPPool` names claims of its
namespace by name, a `GlobalInClusterIPPool` as `namespace/name`). An entry whose address is allocatable *pins* it:
no dynamic allocation takes it, only the named claim may request it, and that claim gets exactly it. Wrong entries
(`problems`) make the pool Ready=False, the others keep serving; a claim whose own entry is wrong, or whose address
is named twice, gets AllocationFailed.

`pool_change_problems(old, new, in_use)`: the admission webhook's reasons to refuse a CREATE or UPDATE: a spec the
backend cannot use; bad `spec.preAllocations` entries, or ones naming an address another claim's live IPAddress
holds; on UPDATE, addresses in use the new spec leaves out (the Go provider's "pool addresses do not contain
allocated addresses"). An unchanged spec is never refused, nor an UPDATE for problems the old spec had.

`address_pool_advisories`: what the Go provider accepts but is most likely a mistake, for the `SpecConsistent`
condition (a Warning Event when False): True when none applies; else False with the reason of the first, in this
order: `NoAllocatableAddresses`, `GatewayOutsideSubnet`, `OverlappingEntries` (of `spec.addresses`),
`ExclusionOutsideAddresses` (an exclusion excluding none of them).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import AfterValidator, Field, ValidationError, field_validator

from backends.incluster.allocatable import (
    AddressEntry,
    AllocatableSet,
    build_allocatable_set,
    parse_address_entry,
    pre_allocation_problems,
)
from backends.incluster.domains import domain_problem
from backends.incluster.intervals import IntervalSet, address_to_int, address_value, int_to_address
from backends.incluster.policy import AllocationPolicy, AllocationStrategy
from backends.validation import OpenAPI, PoolSpecError, Spec, rules, spec_error
from ipam_provider.api.capi import addresses_listing
from ipam_provider.backend.contract import (
    REQUESTED_ADDRESS_ANNOTATION,
    AddressInUse,
    AllocationFailedError,
    ClaimContext,
    PoolNotReadyError,
    PoolRef,
    ReportCondition,
)
from ipam_provider.common import Object, listed, normalized_address

STRANDED = "pool addresses do not contain allocated addresses"  # the Go provider's text
SPEC_ERRORS = (PoolSpecError, ValidationError, ValueError)
NAMESPACED_KEY = "an InClusterIPPool names claims of its own namespace by name alone"
GLOBAL_KEY = "a GlobalInClusterIPPool names claims as namespace/name"
SPEC_CONSISTENT = "SpecConsistent"
NO_ALLOCATABLE = "NoAllocatableAddresses"
GATEWAY_OUTSIDE_SUBNET = "GatewayOutsideSubnet"
OVERLAPPING_ENTRIES = "OverlappingEntries"
EXCLUSION_OUTSIDE = "ExclusionOutsideAddresses"
LISTED_ENTRIES = 5  # entries named per kind of advisory; the rest are counted


# No blanks around an entry or its range's ends: the Go provider's parsers (netip, netipx) refuse them.
ENTRY_RULE = (
    "isIP(self) || isCIDR(self) || (self.split('-').size() == 2 && "
    "isIP(self.split('-')[0]) && isIP(self.split('-')[1]))"
)
ENTRIES = OpenAPI(
    maxItems=1024,
    items=OpenAPI(
        maxLength=100,
        validations=rules((ENTRY_RULE, "provided address is not a valid IP, range, nor CIDR")),
    ),
)
V6_POOL = "self.addresses[0].contains(':')"
# The pool's reservations are named by its domain (backends/incluster/domains.py): a change would strand them.
DOMAIN_IMMUTABLE = (
    "has(self.uniquenessDomain) == has(oldSelf.uniquenessDomain) && "
    "(!has(self.uniquenessDomain) || self.uniquenessDomain == oldSelf.uniquenessDomain)"
)


def _blank_is_none(gateway: str | None) -> str | None:
    """`gateway: ""` means no gateway, as in the Go provider (its webhook checks only a non-empty one)."""
    return gateway if gateway is None or gateway.strip() else None


Gateway = Annotated[
    str | None,
    AfterValidator(_blank_is_none),
    OpenAPI(
        maxLength=39,
        validations=rules(("self == '' || isIP(self)", "provided gateway is not a valid IP address")),
    ),
]


class InClusterPoolSpec(Spec):
    """The CRD checks what the Go provider's webhook checks, with its messages."""

    openapi: ClassVar[OpenAPI] = OpenAPI(
        "spec is the desired state of the pool. Wire-compatible with the Go in-cluster provider's v1alpha2 API.",
        validations=rules(
            ("self.addresses.size() > 0", "addresses is required", ".addresses"),
            (
                "self.addresses.all(a, a.contains(':')) || self.addresses.all(a, !a.contains(':'))",
                "provided addresses are of mixed IP families",
                ".addresses",
            ),
            (
                "!has(self.gateway) || self.gateway == '' || self.addresses.size() == 0 || "
                f"self.gateway.contains(':') == {V6_POOL}",
                "provided gateway and addresses are of mixed IP families",
                ".gateway",
            ),
            (
                "!has(self.excludedAddresses) || self.addresses.size() == 0 || "
                f"self.excludedAddresses.all(e, e.contains(':') == {V6_POOL})",
                "addresses and excluded addresses are of mixed IP families",
                ".excludedAddresses",
            ),
            (
                f"self.addresses.size() == 0 || {V6_POOL} || self.prefix <= 32",
                "provided prefix is not valid",
                ".prefix",
            ),
            (DOMAIN_IMMUTABLE, "uniquenessDomain cannot change: create a new pool instead", ".uniquenessDomain"),
        ),
    )

    addresses: Annotated[list[str], ENTRIES, OpenAPI(required=True)] = Field(default_factory=list)
    """addresses is the list of addresses the pool hands out. Each entry is a single IP (10.0.0.5), a range of two IPs
    of the same family (10.0.0.10-10.0.0.20), or a CIDR (10.0.0.0/24)."""
    prefix: Annotated[int, OpenAPI(required=True, minimum=0, maximum=128)] = 0
    """prefix is the network prefix length of the handed-out addresses."""
    gateway: Gateway = None
    """gateway is the gateway of the network; it is never handed out."""
    excluded_addresses: Annotated[list[str], ENTRIES] = Field(default_factory=list, alias="excludedAddresses")
    """excludedAddresses are never handed out. Each entry is a single IP (10.0.0.5), a range of two IPs of the same
    family (10.0.0.10-10.0.0.20), or a CIDR (10.0.0.0/24)."""
    allocate_reserved: bool = Field(default=False, alias="allocateReservedIPAddresses")
    """allocateReservedIPAddresses lets the pool hand out the first address of the subnet and, for IPv4, its broadcast
    address."""
    reuse_grace_seconds: Annotated[int | None, OpenAPI(format="int64", minimum=0)] = Field(
        default=None, alias="addressReuseGracePeriodSeconds"
    )
    """addressReuseGracePeriodSeconds keeps a released address unused for this long."""
    pre_allocations: Annotated[
        dict[str, Any],
        OpenAPI(
            maxProperties=1024,
            additionalProperties=OpenAPI(
                type="string",
                maxLength=39,
                validations=rules(("isIP(self)", "preAllocations: the address is not a valid IP address")),
            ),
        ),
    ] = Field(default_factory=dict, alias="preAllocations")
    """preAllocations maps a claim to the address it gets. The address is never handed to another claim, even before
    the named claim exists. An InClusterIPPool names claims of its own namespace by name; a GlobalInClusterIPPool
    names them as namespace/name."""
    # A DNS label: the domain is also the value of a label on the domain's reservations (see `domains`).
    uniqueness_domain: Annotated[
        str | None, OpenAPI(minLength=1, maxLength=63, pattern="^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    ] = Field(default=None, alias="uniquenessDomain")
    """uniquenessDomain names a cluster-wide set of in-cluster pools (namespaced and global, of any namespace) that
    never hand out the same address, even where their addresses overlap: an address held by one pool of the domain is
    used for every other. Without it, addresses are unique within the pool only, and pools whose addresses overlap
    report AddressesOverlap. It cannot be set, changed or removed after the pool is created. Not part of the Go
    provider's API."""
    allocation_strategy: Annotated[AllocationStrategy, OpenAPI(defaulted=True)] = Field(
        default=AllocationStrategy.LOWEST_FREE, alias="allocationStrategy"
    )
    """allocationStrategy is how a claim without a requested address gets one: LowestFree takes the lowest free
    address; Random a free address chosen uniformly; LeastRecentlyReleased an address never used before if there is
    one (the lowest), else the address released longest ago. Every strategy respects addressReuseGracePeriodSeconds
    and reserveStaticBand."""
    reserve_static_band: Annotated[bool, OpenAPI(defaulted=True)] = Field(default=False, alias="reserveStaticBand")
    """reserveStaticBand keeps the pool's lowest addresses (min(max(16, size/16), 256) of the allocatable ones; none in
    a pool of fewer than 16) for requested and pre-allocated addresses: claims without a requested address get an
    address of the band only when no other is free."""

    @field_validator("uniqueness_domain")
    @classmethod
    def _domain_is_a_dns_label(cls, value: str | None) -> str | None:
        problem = domain_problem(value) if value is not None else None
        if problem is not None:
            raise ValueError(problem)
        return value


def parse_pool(pool: Object) -> tuple[InClusterPoolSpec, AllocatableSet]:
    """The pool's spec and allocatable set; PoolSpecError or ValidationError when invalid."""
    spec = InClusterPoolSpec.model_validate(pool.get("spec") or {})
    allocatable = build_allocatable_set(
        spec.addresses, spec.prefix, spec.gateway, spec.excluded_addresses, spec.allocate_reserved
    )
    return spec, allocatable


def first_line(error: Exception) -> str:
    """A spec error on one line: pydantic's as `spec_error` words it, any other's first line."""
    return spec_error(error) if isinstance(error, ValidationError) else str(error).splitlines()[0]


def survey_parse(pool: Object) -> tuple[AllocatableSet, str | None] | None:
    """The pool's allocatable set and uniqueness domain, for the overlap survey; None for an invalid pool."""
    try:
        spec, allocatable = parse_pool(pool)
    except SPEC_ERRORS:
        return None
    return allocatable, spec.uniqueness_domain or None


def allocation_policy(
    spec: InClusterPoolSpec, allocatable: AllocatableSet, pre: PreAllocations | None = None
) -> AllocationPolicy:
    """The pool's allocation policy: its strategy, its static band, and the addresses its preAllocations pin."""
    pinned = frozenset(pre.pinned if pre is not None else _pinned(spec.pre_allocations, allocatable))
    return AllocationPolicy(spec.allocation_strategy, spec.reserve_static_band, pinned)


def why_not_allocatable(spec: InClusterPoolSpec, allocatable: AllocatableSet, text: str) -> str | None:
    """Why the address `text` is not an allocatable address of the pool, or None when it is one."""
    family = allocatable.family
    try:
        value = address_to_int(text, family)
    except ValueError:
        return f"it is not an IPv{family} address, as spec.addresses are"
    if value in allocatable.addresses:
        return None
    if not any(entry.first <= value <= entry.last for entry in map(parse_address_entry, spec.addresses)):
        return "it is not in spec.addresses"
    if spec.gateway is not None and value == address_to_int(spec.gateway, family):
        return "it is the pool's gateway, spec.gateway"
    if not spec.allocate_reserved and value == allocatable.subnet_first:
        name = "network address" if family == 4 else "subnet-router anycast address"
        return f"it is the subnet's {name}, reserved unless spec.allocateReservedIPAddresses is true"
    if not spec.allocate_reserved and family == 4 and value == allocatable.subnet_last:
        return "it is the subnet's broadcast address, reserved unless spec.allocateReservedIPAddresses is true"
    return "it is in spec.excludedAddresses"


def claim_key(ref: PoolRef, namespace: str, name: str) -> str:
    """The preAllocations key that names the claim `namespace/name` in the pool `ref`."""
    return name if ref.namespace is not None else f"{namespace}/{name}"


def _pinned(entries: Mapping[str, Any], allocatable: AllocatableSet) -> dict[int, tuple[str, ...]]:
    """Each allocatable address that string entries of `preAllocations` name → the keys naming it (sorted)."""
    pinned: dict[int, tuple[str, ...]] = {}
    for key, text in sorted(entries.items()):
        value = address_value(text, allocatable.family) if isinstance(text, str) else None
        if value is not None and value in allocatable.addresses:
            pinned[value] = (*pinned.get(value, ()), key)
    return pinned


def _key_problem(ref: PoolRef, key: str) -> str | None:
    if ref.namespace is not None:
        return None if "/" not in key else f"spec.preAllocations[{key}]: {NAMESPACED_KEY}"
    namespace, slash, name = key.partition("/")
    return None if slash and namespace and name and "/" not in name else f"spec.preAllocations[{key}]: {GLOBAL_KEY}"


@dataclass(frozen=True)
class PreAllocations:
    """A pool's preAllocations: `entries` as written (a value not a string is a problem of its entry alone), each
    allocatable address named → the keys naming it (`pinned`), and what is wrong with the entries on their own."""

    ref: PoolRef
    family: int
    entries: Mapping[str, Any]
    pinned: Mapping[int, tuple[str, ...]]
    problems: tuple[str, ...]

    @classmethod
    def of(cls, ref: PoolRef, entries: Mapping[str, Any], allocatable: AllocatableSet) -> PreAllocations:
        texts = {key: text for key, text in entries.items() if isinstance(text, str)}
        problems = [
            f"spec.preAllocations[{key}]: {entries[key]!r} is not a string"
            for key in sorted(entries)
            if key not in texts
        ]
        problems += pre_allocation_problems(texts, allocatable)
        problems += [problem for key in sorted(entries) if (problem := _key_problem(ref, key)) is not None]
        return cls(ref, allocatable.family, dict(entries), _pinned(entries, allocatable), tuple(problems))

    def wanted(self, claim: ClaimContext) -> str | None:
        """The address the claim must get: its pre-allocated one, else the one it requests, else None (any).
        Raises AllocationFailedError for a non-IP annotation, a wrong entry of its own, or the two disagreeing."""
        requested = claim.requested_address
        pre_allocated = self.address_of(claim)
        if pre_allocated is None or requested in (None, pre_allocated):
            return requested if pre_allocated is None else pre_allocated
        raise AllocationFailedError(
            f"claim {claim} requests {requested} with annotation {REQUESTED_ADDRESS_ANNOTATION}, but {self.ref} "
            f"pre-allocates {pre_allocated} to it in spec.preAllocations; remove the annotation or change the pool"
        )

    def address_of(self, claim: ClaimContext) -> str | None:
        """The canonical address pre-allocated to the claim, or None when no entry names it. Raises
        AllocationFailedError when its entry is wrong or its address is pre-allocated to another claim too."""
        key = claim_key(self.ref, claim.namespace, claim.name)
        text = self.entries.get(key)
        if text is None:
            return None
        value = address_value(text, self.family) if isinstance(text, str) else None
        if value is None or value not in self.pinned:
            own = [p for p in self.problems if p.startswith(f"spec.preAllocations[{key}]")]
            detail = "; ".join(own) or f"spec.preAllocations[{key}]: {text!r} is not usable"
            raise AllocationFailedError(
                f"{self.ref} pre-allocates an address to this claim, but {detail}; fix the pool"
            )
        address = int_to_address(value, self.family)
        if len(self.pinned[value]) > 1:
            keys = ", ".join(self.pinned[value])
            raise AllocationFailedError(
                f"{self.ref} pre-allocates {address} to more than one claim ({keys}); fix spec.preAllocations"
            )
        return address

    def pinned_for_others(self, value: int, claim: ClaimContext) -> tuple[str, ...]:
        """The keys `value` is pre-allocated to, when none of them is the claim; else ()."""
        keys = self.pinned.get(value, ())
        return () if claim_key(self.ref, claim.namespace, claim.name) in keys else keys

    def held_by_named(self, value: int, holder: str) -> bool:
        """Whether `holder` (namespace/name) is a claim that `value` is pre-allocated to."""
        namespace, _, name = holder.partition("/")
        return claim_key(self.ref, namespace, name) in self.pinned.get(value, ())

    def pins(self, address: str, holder: str) -> bool:
        """Whether `address` is pre-allocated to `holder` (namespace/name)."""
        value = address_value(address, self.family)
        return value is not None and self.held_by_named(value, holder)

    def named_claim(self, value: int) -> tuple[str, str] | None:
        """(namespace, name) of the one claim `value` is pre-allocated to; None when it is not pinned, is pinned to
        several keys, or its key has the wrong form for the pool (such entries are problems, see `problems`)."""
        keys = self.pinned.get(value, ())
        if len(keys) != 1 or _key_problem(self.ref, keys[0]) is not None:
            return None
        if self.ref.namespace is not None:
            return self.ref.namespace, keys[0]
        namespace, _, name = keys[0].partition("/")
        return namespace, name


ParsedSpec = TypeVar("ParsedSpec")


def read_pool(
    ref: PoolRef, pool: Object, parse: Callable[[Object], tuple[ParsedSpec, AllocatableSet]]
) -> tuple[ParsedSpec, AllocatableSet, int, str]:
    """The pool's spec and allocatable set by `parse`, its metadata.generation (0 when unset) and uid (a pool
    re-created under its name is new); PoolNotReadyError when its spec is invalid."""
    try:
        fields, allocatable = parse(pool)
    except SPEC_ERRORS as error:
        raise PoolNotReadyError(f"{ref} is invalid: {first_line(error)}; fix the pool's spec") from error
    meta = pool.get("metadata") or {}
    return fields, allocatable, int(meta.get("generation") or 0), str(meta.get("uid") or "")


@dataclass(frozen=True, kw_only=True)
class ParsedPool:
    """What one call reads of a pool, parsed once (see the module)."""

    ref: PoolRef
    allocatable: AllocatableSet
    prefix: int
    gateway: str | None
    pre: PreAllocations
    generation: int = 0
    uid: str = ""
    reuse_grace_seconds: int | None = None
    domain: str | None = None
    policy: AllocationPolicy = AllocationPolicy()  # noqa: RUF009 - frozen, so one shared default is safe

    @classmethod
    def parse(cls, ref: PoolRef, pool: Object) -> ParsedPool:
        """The pool as one call reads it; PoolNotReadyError when its spec is invalid."""
        raise NotImplementedError

    def why_not(self, address: str) -> str | None:
        """Why the pool cannot hand out the (canonical) `address`, or None when it can."""
        raise NotImplementedError

    def exhausted(self, total: int) -> str:
        """The PoolExhausted message of a claim that finds none of the pool's `total` addresses free."""
        if not self.pre.pinned:
            return f"{self.ref} has no free address: all {total} are in use; add addresses to the pool or delete claims"
        return (
            f"{self.ref} has no free address for this claim: of its {total} addresses, those not pre-allocated are "
            f"all in use and {len(self.pre.pinned)} are pre-allocated to named claims (spec.preAllocations); add "
            "addresses to the pool or delete claims"
        )


@dataclass(frozen=True, kw_only=True)
class AddressPool(ParsedPool):
    fields: InClusterPoolSpec

    @classmethod
    def parse(cls, ref: PoolRef, pool: Object) -> AddressPool:
        fields, allocatable, generation, uid = read_pool(ref, pool, parse_pool)
        pre = PreAllocations.of(ref, fields.pre_allocations, allocatable)
        return cls(
            ref=ref,
            allocatable=allocatable,
            prefix=fields.prefix,
            gateway=fields.gateway,
            pre=pre,
            generation=generation,
            uid=uid,
            reuse_grace_seconds=fields.reuse_grace_seconds,
            domain=fields.uniqueness_domain,
            policy=allocation_policy(fields, allocatable, pre),
            fields=fields,
        )

    def why_not(self, address: str) -> str | None:
        return why_not_allocatable(self.fields, self.allocatable, address)


@dataclass(frozen=True)
class ReleaseTerms:
    """What a release does with a reservation of the pool, by its spec (see `Ledger.release`): back to its pin when
    `pre` pins the address to its claim; else a release record when `keep_record` (a reuse grace period, or
    LeastRecentlyReleased), carrying `recorded_grace` for the other pools of its domain; else deleted."""

    keep_record: bool = False
    recorded_grace: int | None = None
    pre: PreAllocations | None = None

    @classmethod
    def of(cls, ref: PoolRef, pool: Object | None) -> ReleaseTerms:
        """The terms of the pool `ref` as far as its spec parses (`pool`: its object, None when it is gone)."""
        try:
            spec = InClusterPoolSpec.model_validate((pool or {}).get("spec") or {})
        except ValidationError:
            return cls()
        try:
            pre: PreAllocations | None = PreAllocations.of(ref, spec.pre_allocations, parse_pool(pool or {})[1])
        except SPEC_ERRORS:
            pre = None
        lrr, grace = spec.allocation_strategy is AllocationStrategy.LEAST_RECENTLY_RELEASED, spec.reuse_grace_seconds
        return cls(bool(grace) or lrr, None if lrr else grace, pre)


def pool_change_problems(old: Object | None, new: Object | None, in_use: Sequence[AddressInUse]) -> list[str]:
    """The reasons to refuse changing the pool `old` into `new` (see the module)."""
    if new is None or (old is not None and (old.get("spec") or {}) == (new.get("spec") or {})):
        return []
    try:
        _, allocatable = parse_pool(new)
    except SPEC_ERRORS as error:
        return [f"the pool's spec is invalid: {first_line(error)}"]
    problems = _pre_allocation_problems(new, allocatable, in_use)
    if old is None:
        return problems
    try:
        _, previous = parse_pool(old)
    except SPEC_ERRORS:
        return problems + _stranded(PoolRef.from_object(new), None, allocatable, in_use)
    known = set(_pre_allocation_problems(old, previous, in_use))
    stranded = _stranded(PoolRef.from_object(new), previous, allocatable, in_use)
    return [problem for problem in problems if problem not in known] + stranded


def _pre_allocation_problems(pool: Object, allocatable: AllocatableSet, in_use: Sequence[AddressInUse]) -> list[str]:
    raw: Any = (pool.get("spec") or {}).get("preAllocations")
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        return ["spec.preAllocations must map claim names to addresses"]
    entries = {str(name): str(address) for name, address in raw.items()}
    problems = pre_allocation_problems(entries, allocatable)
    holders: dict[str, list[AddressInUse]] = {}
    for address in in_use:
        holders.setdefault(normalized_address(address.address), []).append(address)
    ref = PoolRef.from_object(pool)
    for claim_name, text in sorted(entries.items()):
        named = holders.get(normalized_address(text), [])
        if any(claim_key(ref, *holder.claim.partition("/")[::2]) != claim_name for holder in named):
            problems.append(
                f"spec.preAllocations[{claim_name}]: {normalized_address(text)} is already held by another claim's "
                f"IPAddress ({addresses_listing(ref)} lists them); pre-allocate another address or release that one "
                "first"
            )
    return problems


def _stranded(
    ref: PoolRef, previous: AllocatableSet | None, allocatable: AllocatableSet, in_use: Sequence[AddressInUse]
) -> list[str]:
    """The Go provider's refusal of addresses in use the new spec leaves out and the old one (if valid) held."""
    values: set[tuple[int, int]] = set()
    for address in in_use:
        held = _family_value(address.address)
        if held is None or _contains(allocatable, held) or (previous is not None and not _contains(previous, held)):
            continue  # not an address, still in the pool, or outside it already
        values.add(held)
    if not values:
        return []
    return [stranded_refusal(STRANDED, ref, len(values), "keep them in the pool or release them first")]


def stranded_refusal(text: str, ref: PoolRef, count: int, remedy: str) -> str:
    """The refusal of an UPDATE that leaves `count` addresses in use out of the pool: `text` (the Go provider's), the
    count and how to list them, naming none (the review's requester is not known; see docs/admission.md)."""
    return f"{text}: the new spec leaves out {count} address(es) in use ({addresses_listing(ref)} lists them); {remedy}"


def _contains(allocatable: AllocatableSet, held: tuple[int, int]) -> bool:
    family, value = held
    return family == allocatable.family and value in allocatable.addresses


def _family_value(text: str) -> tuple[int, int] | None:
    """The IP family and integer of an IPAddress's `spec.address`, or None if it is not an address."""
    try:
        version = ipaddress.ip_address(text.split("/")[0].strip()).version
        return version, address_to_int(text.split("/")[0], version)
    except ValueError:  # not an address, or a scoped IPv6 one: no pool holds it
        return None


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
    more = f" and {len(found) - LISTED_ENTRIES} more" if len(found) > LISTED_ENTRIES else ""
    message = "; ".join(found[:LISTED_ENTRIES]) + more + ": merge them into one entry"
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
    message = f"{listed(found, LISTED_ENTRIES)} excludes none of spec.addresses: correct or remove it"
    return [Advisory(EXCLUSION_OUTSIDE, message)]
