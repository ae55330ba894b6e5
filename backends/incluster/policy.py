"""How an in-cluster pool chooses its next dynamic address: the allocation strategy, the KEP-3070 static band, and
the pre-allocated addresses that no dynamic allocation may take.

`AllocationPolicy` is built from the pool's spec (`allocationStrategy`, `reserveStaticBand`, `preAllocations`) and
handed to the pool's index; requested and pre-allocated addresses are taken by value and ignore the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

STATIC_BAND_MIN = 16
STATIC_BAND_MAX = 256
STATIC_BAND_STEP = 16


class AllocationStrategy(StrEnum):
    """`spec.allocationStrategy` of an in-cluster pool."""

    LOWEST_FREE = "LowestFree"
    RANDOM = "Random"
    LEAST_RECENTLY_RELEASED = "LeastRecentlyReleased"


def static_band_size(allocatable_count: int) -> int:
    """The number of the pool's lowest allocatable addresses that form the KEP-3070 static band:
    `min(max(16, size/16), 256)`, and 0 (no bands) when the pool has fewer than 16 allocatable addresses."""
    if allocatable_count < STATIC_BAND_MIN:
        return 0
    return min(max(STATIC_BAND_MIN, allocatable_count // STATIC_BAND_STEP), STATIC_BAND_MAX)


@dataclass(frozen=True)
class AllocationPolicy:
    """What a dynamic allocation of one pool may take, and in which order.

    - `strategy`: LowestFree (default), Random, or LeastRecentlyReleased (never-used addresses first, then the
      address released longest ago);
    - `static_band`: when true, the lowest `static_band_size(total)` allocatable addresses are taken only when no
      other address is free;
    - `pinned`: the pool's pre-allocated addresses (as integers), never chosen for a dynamic allocation.
    """

    strategy: AllocationStrategy = AllocationStrategy.LOWEST_FREE
    static_band: bool = False
    pinned: frozenset[int] = frozenset()
