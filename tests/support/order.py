"""The order tests run in: the modules whose tests take seconds each come first, the rest as collected.

With `pytest -n auto`, xdist hands the tests out in their order, and a worker that draws a test of several seconds
near the end keeps the run going while the other waits with nothing left. Started first, the long tests are spread
over the workers while the short ones are still there to even them out. A serial run keeps the collection's
order. Only the order changes: every test is collected, selected and run as before, and the tests of one module
keep their order.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Longest test first (seconds, fast lane, 2 workers): the property tests' state machines, the RBAC derivation (a
# mypy build of the tree), connection timers, clusterctl and brute-force models.
LONG_FIRST = (
    "tests/backends/incluster/test_policy_model.py",  # 7 s
    "tests/backends/incluster/test_intervals.py",  # 5.5 s
    "tests/backends/incluster/test_index_concurrent.py",  # 4.5 s
    "tests/tools/test_rbac_calls.py",  # 4 s, 3 of its tests
    "tests/ipam_provider/runtime/serving/test_guard.py",  # 2.5 s
    "tests/backends/incluster/test_domains_overlap.py",  # 2.5 s
    "tests/benchmarks/chaos/test_infoblox.py",  # 2 s
    "tests/tools/controlplane/test_cluster.py",  # 1.5 s
    "tests/system/test_clusterctl_release.py",  # 1.5 s
    "tests/backends/incluster/test_policy_strategies.py",  # 1.5 s
    "tests/ipam_provider/runtime/kube/test_bounds.py",  # 1.5 s
)


def rank(item: pytest.Item) -> int:
    """The place of the item's module in LONG_FIRST; after them all if it is not there."""
    try:
        module = item.path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return len(LONG_FIRST)
    return LONG_FIRST.index(module) if module in LONG_FIRST else len(LONG_FIRST)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist only (a worker's collection): a serial run keeps the collection's order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=rank)  # stable: the order within a rank is the collection's
