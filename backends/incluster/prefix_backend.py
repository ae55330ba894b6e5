"""The in-cluster prefix backend: InClusterPrefixPool and GlobalInClusterPrefixPool (v1alpha2), registered as
`inclusterprefix`. A claim gets the lowest free child prefix of `allocationPrefixLength`; its IPAddress carries the
child's first address, the allocation length and the pool's gateway. Only the parsed pool (`prefix_spec`), its
admission checks and report are its own: ledger, allocator and repair are the address pools'.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from backends.incluster.allocatable import ADDRESS_BITS
from backends.incluster.backend import InClusterBackend
from backends.incluster.prefix_spec import PrefixPool, child_of, prefix_pool_advisories, prefix_pool_change_problems
from backends.incluster.spec import ParsedPool, consistency_condition
from ipam_provider.api.capi import IPAM_GROUP
from ipam_provider.backend.contract import (
    AddressCounts,
    AddressInUse,
    Allocation,
    BackendContext,
    PoolKind,
    PoolNotReadyError,
    PoolRef,
    PoolReport,
)
from ipam_provider.common import Object, cap_int64

IN_CLUSTER_PREFIX_POOL = PoolKind(
    IPAM_GROUP, "v1alpha2", "InClusterPrefixPool", "inclusterprefixpools", namespaced=True
)
GLOBAL_IN_CLUSTER_PREFIX_POOL = PoolKind(
    IPAM_GROUP, "v1alpha2", "GlobalInClusterPrefixPool", "globalinclusterprefixpools", namespaced=False
)


class InClusterPrefixBackend(InClusterBackend):
    """Serves InClusterPrefixPool and GlobalInClusterPrefixPool."""

    name = "inclusterprefix"
    kinds: Sequence[PoolKind] = (IN_CLUSTER_PREFIX_POOL, GLOBAL_IN_CLUSTER_PREFIX_POOL)
    pool_type: type[ParsedPool] = PrefixPool

    def observe_pool(self, kind: PoolKind, old: Object | None, new: Object | None) -> Collection[PoolRef]:
        """A prefix pool's report depends on no other pool; a deleted one is forgotten (`observe_live`)."""
        self.observe_live(kind, old, new)
        return ()

    async def review_pool_change(
        self, pool_ref: PoolRef, old: Object | None, new: Object | None, in_use: Sequence[AddressInUse]
    ) -> list[str]:
        """The admission webhook's checks for prefix pools (see `prefix_spec`)."""
        return prefix_pool_change_problems(old, new, in_use)

    async def _report(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[Allocation]) -> PoolReport:
        try:
            allocatable = self.parse(pool_ref, pool).allocatable
        except PoolNotReadyError as error:
            invalid = AddressCounts(total=0, used=len(addresses), free=0, out_of_range=len(addresses))
            return PoolReport(False, "InvalidConfiguration", error.message, counts=invalid)
        out_of_range = sum(1 for a in addresses if child_of(a.address, a.prefix, allocatable) is None)
        total = allocatable.addresses.size
        free = max(total - (len(addresses) - out_of_range), 0)
        counts = AddressCounts(total=total, used=len(addresses), free=free, out_of_range=out_of_range)
        length = ADDRESS_BITS[allocatable.family] - allocatable.host_bits
        message = f"{cap_int64(counts.free)} of {cap_int64(counts.total)} /{length} prefixes free"
        if out_of_range:
            message += f"; {out_of_range} allocated prefixes are not ones the pool would hand out now"
        conditions = [consistency_condition(prefix_pool_advisories(allocatable))]
        return PoolReport(True, "PoolReady", message, counts=counts, conditions=conditions)


def create_backend(context: BackendContext) -> InClusterPrefixBackend:
    return InClusterPrefixBackend(context)
