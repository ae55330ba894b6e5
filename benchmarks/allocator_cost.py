"""Micro-measurement: does the in-cluster allocator's cost per allocation depend on how much is allocated?

Builds a /48 IPv6 pool with N addresses already used, laid out either densely (one run) or fragmented (every
other address used, N runs), then times `allocate()` repeatedly; after each timed call the address is freed
again (untimed), so every call sees the same layout. Prints the mean cost per allocation in microseconds for
N = 100 and N = 100,000, and their ratio (close to 1 means the cost does not follow the allocation count).

Run from the repository root: `python benchmarks/allocator_cost.py [--calls 5000] [--repeats 5]`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.incluster.intervals import IntervalSet, PoolAllocator, address_to_int

POOL_BASE = address_to_int("fd00:1234:5678::", 6)
POOL = IntervalSet([(POOL_BASE + 1, POOL_BASE + 2**80 - 1)])


def build_allocator(already_used: int, layout: str) -> PoolAllocator:
    """A /48 pool with `already_used` addresses used, `dense` (consecutive) or `fragmented` (every other)."""
    step = 1 if layout == "dense" else 2
    return PoolAllocator(POOL, (POOL_BASE + 1 + step * index for index in range(already_used)))


def timer_overhead_ns(calls: int) -> float:
    """The mean cost of one pair of perf_counter_ns calls, to subtract from each timing."""
    total = 0
    for _ in range(calls):
        started = time.perf_counter_ns()
        total += time.perf_counter_ns() - started
    return total / calls


def mean_allocation_us(allocator: PoolAllocator, calls: int, overhead_ns: float) -> float:
    """Mean time of one `allocate()` call in µs; each allocated address is freed again outside the timing."""
    total = 0
    for _ in range(calls):
        started = time.perf_counter_ns()
        address = allocator.allocate()
        total += time.perf_counter_ns() - started
        assert address is not None
        allocator.mark_free(address)
    return max(total / calls - overhead_ns, 0.0) / 1000


def measure(already_used: int, layout: str, calls: int, repeats: int) -> float:
    """The best (least disturbed) of `repeats` mean allocation costs, in µs."""
    allocator = build_allocator(already_used, layout)
    expected_runs = 1 if layout == "dense" else already_used
    assert allocator.used_run_count == expected_runs
    overhead = timer_overhead_ns(calls)
    return min(mean_allocation_us(allocator, calls, overhead) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000, help="timed allocations per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="repeats; the fastest is reported")
    arguments = parser.parse_args()
    print(f"{'layout':<11} {'N=100 (µs)':>11} {'N=100,000 (µs)':>15} {'ratio':>6}")
    for layout in ("dense", "fragmented"):
        small = measure(100, layout, arguments.calls, arguments.repeats)
        large = measure(100_000, layout, arguments.calls, arguments.repeats)
        print(f"{layout:<11} {small:>11.2f} {large:>15.2f} {large / small:>6.2f}")


if __name__ == "__main__":
    main()
