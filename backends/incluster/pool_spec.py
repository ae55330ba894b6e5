"""The specs of the in-cluster pools as allocation and admission read them: an address pool's (InClusterIPPool /
GlobalInClusterIPPool) fields, allocatable set, allocation policy and what a release needs of it; a prefix pool's
(InClusterPrefixPool / GlobalInClusterPrefixPool) fields and allocatable child numbers; and the pool object's
generation and uid."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, field_validator

from backends.incluster.allocatable import AllocatableSet, PoolSpecError, build_allocatable_set
from backends.incluster.domains import domain_problem
from backends.incluster.policy import AllocationPolicy, AllocationStrategy
from backends.incluster.preallocations import PreAllocations
from backends.incluster.prefix_allocatable import DEFAULT_ALLOCATION_PREFIX_LENGTH, build_prefix_set
from backends.incluster.strategies import pinned_addresses
from backends.validation import spec_error
from ipam_provider.api.meta import Model
from ipam_provider.backend.contract import PoolRef
from ipam_provider.common import Object


class InClusterPoolSpec(Model):
    addresses: list[str] = Field(default_factory=list)
    prefix: int = 0
    gateway: str | None = None
    excluded_addresses: list[str] = Field(default_factory=list, alias="excludedAddresses")
    allocate_reserved: bool = Field(default=False, alias="allocateReservedIPAddresses")
    reuse_grace_seconds: int | None = Field(default=None, alias="addressReuseGracePeriodSeconds")
    pre_allocations: dict[str, Any] = Field(default_factory=dict, alias="preAllocations")
    uniqueness_domain: str | None = Field(default=None, alias="uniquenessDomain")  # see `domains`
    allocation_strategy: AllocationStrategy = Field(default=AllocationStrategy.LOWEST_FREE, alias="allocationStrategy")
    reserve_static_band: bool = Field(default=False, alias="reserveStaticBand")

    @field_validator("uniqueness_domain")
    @classmethod
    def _domain_is_a_dns_label(cls, value: str | None) -> str | None:
        problem = domain_problem(value) if value is not None else None
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("gateway")
    @classmethod
    def _empty_gateway_is_none(cls, value: str | None) -> str | None:
        """`gateway: ""` means no gateway, as in the Go provider (its webhook checks only a non-empty one)."""
        return value if value is None or value.strip() else None


def parse_pool(pool: Object) -> tuple[InClusterPoolSpec, AllocatableSet]:
    """The pool's spec and allocatable set; PoolSpecError or ValidationError when invalid."""
    spec = InClusterPoolSpec.model_validate(pool.get("spec") or {})
    allocatable = build_allocatable_set(
        spec.addresses, spec.prefix, spec.gateway, spec.excluded_addresses, spec.allocate_reserved
    )
    return spec, allocatable


def survey_parse(pool: Object) -> tuple[AllocatableSet, str | None] | None:
    """The pool's allocatable set and uniqueness domain, for the overlap survey; None for an invalid pool."""
    try:
        spec, allocatable = parse_pool(pool)
    except (PoolSpecError, ValidationError, ValueError):
        return None
    return allocatable, spec.uniqueness_domain or None


def allocation_policy(
    spec: InClusterPoolSpec, allocatable: AllocatableSet, pre: PreAllocations | None = None
) -> AllocationPolicy:
    """The pool's allocation policy: its strategy, its static band, and the addresses its preAllocations pin
    (`pre.pinned` when given: every allocatable address a string entry names, as `pinned_addresses` finds them)."""
    pinned = frozenset(pre.pinned) if pre is not None else pinned_addresses(spec.pre_allocations, allocatable)
    return AllocationPolicy(spec.allocation_strategy, spec.reserve_static_band, pinned)


def release_terms(ref: PoolRef, pool: Object | None) -> tuple[int | None, AllocationStrategy, PreAllocations | None]:
    """The pool's reuse grace period, allocation strategy and preAllocations, as far as its spec parses (the
    defaults for a pool that is gone)."""
    if pool is None:
        return None, AllocationStrategy.LOWEST_FREE, None
    try:
        spec, allocatable = parse_pool(pool)
    except (PoolSpecError, ValidationError, ValueError):
        try:
            spec = InClusterPoolSpec.model_validate(pool.get("spec") or {})
        except ValidationError:
            return None, AllocationStrategy.LOWEST_FREE, None
        return spec.reuse_grace_seconds, spec.allocation_strategy, None
    pre = PreAllocations.of(ref, spec.pre_allocations, allocatable)
    return spec.reuse_grace_seconds, spec.allocation_strategy, pre


class PrefixPoolSpec(Model):
    prefixes: list[str] = Field(default_factory=list)
    allocation_prefix_length: int = Field(default=DEFAULT_ALLOCATION_PREFIX_LENGTH, alias="allocationPrefixLength")
    gateway: str | None = None
    excluded_prefixes: list[str] = Field(default_factory=list, alias="excludedPrefixes")

    def allocation_fields(self) -> InClusterPoolSpec:
        """What the shared allocation path reads from an address pool's spec: the `prefix` and `gateway` of each
        IPAddress it writes (no reuse grace period)."""
        return InClusterPoolSpec.model_validate({"prefix": self.allocation_prefix_length, "gateway": self.gateway})


def parse_prefix_pool(pool: Object) -> tuple[PrefixPoolSpec, AllocatableSet]:
    """The pool's spec and allocatable child numbers; PoolSpecError or ValidationError when invalid."""
    spec = PrefixPoolSpec.model_validate(pool.get("spec") or {})
    gateway = spec.gateway if spec.gateway and spec.gateway.strip() else None
    allocatable = build_prefix_set(spec.prefixes, spec.allocation_prefix_length, gateway, spec.excluded_prefixes)
    return spec, allocatable


def pool_generation(pool: Object) -> int:
    """The pool object's metadata.generation (0 when unset)."""
    return int((pool.get("metadata") or {}).get("generation") or 0)


def pool_uid(pool: Object) -> str:
    """The pool object's uid: per-pool state belongs to one object (a pool re-created under the same name is new)."""
    return str((pool.get("metadata") or {}).get("uid") or "")


def first_line(error: Exception) -> str:
    """A spec error on one line: pydantic's as `spec_error` words it, any other's first line."""
    if isinstance(error, ValidationError):
        return spec_error(error)
    return str(error).splitlines()[0]
