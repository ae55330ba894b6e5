"""Micro-measurement: does the in-cluster allocator's cost per allocation depend on how much is allocated?

For each allocation strategy, with and without the static band, in an IPv4 /8 pool (10.0.0.0/8) and an IPv6 /64
pool, a `PoolIndex` is built holding N reservations (N = 100 and N = 1,000,000), laid out fragmented: every other
address from the bottom of the pool, N runs of used addresses (the worst case for the run map). Then
`take_candidate` is timed repeatedly; after each timed call the candidate is settled as a failed write (untimed),
which restores the layout, so every call sees the same state. In memory only: no API server.

Extra rows measure the paths a sparse pool does not reach:
- Random, exact: the uniform draws are switched off, so every choice is the exact rank/select over the used
  addresses (what a dense zone gets);
- LeastRecentlyReleased, reuse: no never-used address is left (exclusions keep N + 1,000 addresses of the pool
  allocatable: N live reservations and 1,000 release records, released at distinct times); each choice takes the
  oldest record.

Prints, per row, the median µs per allocation at N = 100 and at N = 1,000,000, and their ratio (the figure: close to 1
means the cost does not follow the number allocated).

Run from the repository root: `python benchmarks/allocator_cost.py [--calls 3000] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.incluster import policy
from backends.incluster.allocatable import AllocatableSet, build_allocatable_set
from backends.incluster.index import PoolIndex
from backends.incluster.intervals import IntervalSet, int_to_address
from backends.incluster.policy import AllocationPolicy, AllocationStrategy
from backends.incluster.reservations import Reservation

POOLS = {4: (["10.0.0.0/8"], 8), 6: (["fd00:1234:5678:9abc::/64"], 64)}
SIZES = (100, 1_000_000)
RECORDS = 1_000
EPOCH = 1_800_000_000


@dataclass(frozen=True)
class Row:
    strategy: AllocationStrategy
    band: bool
    variant: str = ""  # "", "exact" (Random without uniform draws) or "reuse" (LeastRecentlyReleased, no never-used)

    @property
    def label(self) -> str:
        variant = f", {self.variant}" if self.variant else ""
        return f"{self.strategy.value}{variant}" + (" + band" if self.band else "")


def rows() -> Iterator[Row]:
    for strategy in AllocationStrategy:
        for band in (False, True):
            yield Row(strategy, band)
    yield Row(AllocationStrategy.RANDOM, False, "exact")
    yield Row(AllocationStrategy.RANDOM, True, "exact")
    yield Row(AllocationStrategy.LEAST_RECENTLY_RELEASED, False, "reuse")
    yield Row(AllocationStrategy.LEAST_RECENTLY_RELEASED, True, "reuse")


def reservation(value: int, family: int, released_at: int | None = None) -> Reservation:
    address = int_to_address(value, family)
    return Reservation(
        name=address,
        address=address,
        prefix=0,
        gateway=None,
        claim_uid="" if released_at is not None else address,
        claim=f"bench/{address}",
        released_at=(
            datetime.datetime.fromtimestamp(released_at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if released_at is not None
            else None
        ),
        resource_version="1",
        uid=address,
    )


class Layouts:
    """The index of each (family, N, reuse) layout, built once from its reservations; each row sets its policy
    on it (`PoolIndex.set_policy`, as a spec change of the policy alone does)."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, int, bool], PoolIndex] = {}

    def get(self, family: int, size: int, reuse: bool) -> PoolIndex:
        key = (family, size, reuse)
        if key not in self._made:
            addresses, prefix = POOLS[family]
            pool = build_allocatable_set(addresses, prefix).addresses
            first = pool.first()
            assert first is not None
            if reuse:  # N + RECORDS allocatable addresses: N live, then the records, released oldest first
                pool = pool.intersection(IntervalSet([(first, first + size + RECORDS - 1)]))
                held = [reservation(first + i, family) for i in range(size)]
                held += [reservation(first + size + i, family, EPOCH + i) for i in range(RECORDS)]
            else:
                held = [reservation(first + 2 * i, family) for i in range(size)]
            self._made[key] = PoolIndex.build(AllocatableSet(pool, family), held)
        return self._made[key]

    def clear(self) -> None:
        self._made.clear()


def timer_overhead_ns(calls: int) -> float:
    """The median cost of one pair of perf_counter_ns calls, to subtract from each timing."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        samples.append(time.perf_counter_ns() - started)
    return statistics.median(samples)


def allocation_times_ns(index: PoolIndex, calls: int) -> list[int]:
    """The time of each of `calls` `take_candidate` calls; each candidate is settled (a failed write) untimed."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        value = index.take_candidate("bench")
        samples.append(time.perf_counter_ns() - started)
        assert value is not None
        index.settle(value)
    return samples


def measure(row: Row, family: int, size: int, layouts: Layouts, calls: int, repeats: int) -> float:
    """The median cost of one allocation over `repeats` times `calls`, in µs (the median, so that the moments the
    shared machine preempts the process do not count)."""
    index = layouts.get(family, size, row.variant == "reuse")
    index.set_policy(AllocationPolicy(row.strategy, row.band))
    index.clock = lambda: float(EPOCH + 10 * RECORDS)
    draws = policy.RANDOM_DRAWS
    policy.RANDOM_DRAWS = 0 if row.variant == "exact" else draws
    try:
        overhead = timer_overhead_ns(calls)
        samples = [sample for _ in range(repeats) for sample in allocation_times_ns(index, calls)]
        return max(statistics.median(samples) - overhead, 0.0) / 1000
    finally:
        policy.RANDOM_DRAWS = draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="timed allocations per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="repeats; the fastest is reported")
    arguments = parser.parse_args()
    started = time.monotonic()
    layouts = Layouts()
    print(f"{'strategy':<40} {'pool':<5} {'N=100 (µs)':>11} {'N=1,000,000 (µs)':>17} {'ratio':>6}")
    for family in (4, 6):
        for row in rows():
            small, large = (measure(row, family, n, layouts, arguments.calls, arguments.repeats) for n in SIZES)
            pool = "/8" if family == 4 else "/64"
            print(f"{row.label:<40} {pool:<5} {small:>11.2f} {large:>17.2f} {large / small:>6.2f}", flush=True)
        layouts.clear()
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
