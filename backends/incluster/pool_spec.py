"""The spec of an in-cluster pool (InClusterIPPool / GlobalInClusterIPPool) as allocation reads it: its fields,
its allocatable set, its allocation policy, and what a release needs of it."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, field_validator

from backends.incluster.allocatable import AllocatableSet, PoolSpecError, build_allocatable_set
from backends.incluster.domains import domain_problem
from backends.incluster.policy import AllocationPolicy, AllocationStrategy
from backends.incluster.preallocations import PreAllocations
from backends.incluster.strategies import pinned_addresses
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
