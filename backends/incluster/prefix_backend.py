"""The in-cluster prefix backend: InClusterPrefixPool and GlobalInClusterPrefixPool (v1alpha2).

A claim gets a child prefix of the pool's `allocationPrefixLength`, the lowest one free (first fit); its IPAddress
carries the child's first address as `address`, the allocation length as `prefix`, and the pool's `gateway` when
it has one. IPv6 as in the Go in-cluster provider, IPv4 as well.

Allocation is the address pools' (`backend.InClusterBackend`), over child numbers instead of addresses (see
`prefix_allocatable`): a child is held by an InClusterIPReservation named by (pool, the child's first address), so
etcd's create-uniqueness decides who holds it, exactly as for an address; the pool's index, its concurrency, the
adoption of IPAddresses without a reservation, release, and the repair capability (`repair`) are shared. Prefix
pools have no reuse grace period. The backend is registered under its own name, `inclusterprefix`, the `backend`
label of its metrics.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pydantic import ValidationError

from backends.incluster.advisories import consistency_condition, prefix_pool_advisories
from backends.incluster.allocatable import ADDRESS_BITS, AllocatableSet, PoolSpecError
from backends.incluster.backend import InClusterBackend
from backends.incluster.intervals import address_to_int
from backends.incluster.pool_spec import InClusterPoolSpec, first_line, parse_prefix_pool, pool_generation, pool_uid
from backends.incluster.prefix_admission import prefix_pool_change_problems
from backends.incluster.prefix_allocatable import child_of
from ipam_provider.backend.contract import (
    AddressCounts,
    AddressInUse,
    Allocation,
    BackendContext,
    ClaimContext,
    PoolExhaustedError,
    PoolKind,
    PoolNotReadyError,
    PoolRef,
    PoolReport,
)
from ipam_provider.common import Object, cap_int64
from ipam_provider.runtime.kube.resources import IPAM_GROUP

IN_CLUSTER_PREFIX_POOL = PoolKind(
    IPAM_GROUP, "v1alpha2", "InClusterPrefixPool", "inclusterprefixpools", namespaced=True
)
GLOBAL_IN_CLUSTER_PREFIX_POOL = PoolKind(
    IPAM_GROUP, "v1alpha2", "GlobalInClusterPrefixPool", "globalinclusterprefixpools", namespaced=False
)


class InClusterPrefixBackend(InClusterBackend):
    """Serves InClusterPrefixPool and GlobalInClusterPrefixPool."""

    name = "inclusterprefix"

    @property
    def kinds(self) -> Sequence[PoolKind]:
        return (IN_CLUSTER_PREFIX_POOL, GLOBAL_IN_CLUSTER_PREFIX_POOL)

    def observe_pool(self, kind: PoolKind, old: Object | None, new: Object | None) -> Collection[PoolRef]:
        """A prefix pool's report depends on no other pool."""
        return ()

    def _parse(self, ref: PoolRef, pool: Object) -> tuple[InClusterPoolSpec, AllocatableSet]:
        try:
            spec, allocatable = parse_prefix_pool(pool)
        except (PoolSpecError, ValidationError, ValueError) as error:
            raise PoolNotReadyError(f"{ref} is invalid: {first_line(error)}; fix the pool's spec") from error
        return spec.allocation_fields(), allocatable

    async def prepare(self, pool_ref: PoolRef, pool: Object) -> None:
        try:
            _, allocatable = parse_prefix_pool(pool)
        except (PoolSpecError, ValidationError, ValueError):
            return
        await self.indexes.prepare(pool_ref, allocatable, pool_generation(pool), uid=pool_uid(pool))

    async def review_pool_change(
        self, pool_ref: PoolRef, old: Object | None, new: Object | None, in_use: Sequence[AddressInUse]
    ) -> list[str]:
        """The admission webhook's checks for prefix pools (see `prefix_admission`)."""

        return prefix_pool_change_problems(old, new, in_use)

    def _why_not(self, spec: InClusterPoolSpec, allocatable: AllocatableSet, address: str) -> str | None:
        """A requested address of a prefix pool names a child prefix by its first address."""
        if child_of(address, spec.prefix, allocatable) is None:
            return f"it is not the first address of a /{spec.prefix} prefix in spec.prefixes, clear of excludedPrefixes"
        if address_to_int(address, allocatable.family) & ((1 << allocatable.host_bits) - 1):
            return f"it is not the first address of a /{spec.prefix} prefix"
        return None

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        try:
            return await super().allocate(pool_ref, pool, claim, existing)
        except PoolExhaustedError as error:
            spec, allocatable = self._parse(pool_ref, pool)
            total = cap_int64(allocatable.addresses.size)
            raise PoolExhaustedError(
                f"{pool_ref} has no free /{spec.prefix} prefix: all {total} are in use; add prefixes to the pool or "
                "delete claims"
            ) from error

    async def report(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[Allocation]) -> PoolReport:
        try:
            _, allocatable = self._parse(pool_ref, pool)
        except PoolNotReadyError as error:
            invalid = AddressCounts(total=0, used=len(addresses), free=0, out_of_range=len(addresses))
            return PoolReport(False, "InvalidConfiguration", error.message, counts=invalid)
        out_of_range = sum(1 for a in addresses if child_of(a.address, a.prefix, allocatable) is None)
        total = allocatable.addresses.size
        counts = AddressCounts(
            total=total,
            used=len(addresses),
            free=max(total - (len(addresses) - out_of_range), 0),
            out_of_range=out_of_range,
        )
        length = ADDRESS_BITS[allocatable.family] - allocatable.host_bits
        message = f"{cap_int64(counts.free)} of {cap_int64(counts.total)} /{length} prefixes free"
        if out_of_range:
            message += f"; {out_of_range} allocated prefixes are not ones the pool would hand out now"
        conditions = [consistency_condition(prefix_pool_advisories(allocatable))]
        return PoolReport(True, "PoolReady", message, counts=counts, conditions=conditions)


def create_backend(context: BackendContext) -> InClusterPrefixBackend:
    return InClusterPrefixBackend(context)
