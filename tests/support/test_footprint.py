"""`tests/support/footprint.py`: the walk finds per-object state wherever an owned object or module keeps it."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from ipam_provider.runtime.cache import store as store_module
from ipam_provider.runtime.cache.store import Store
from tests.support.footprint import footprint, footprint_growth


def pool(name: str, version: int = 1) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": str(version)}, "spec": {"a": [1, 2]}}


def test_paths_aggregate_elements_and_growth_names_them() -> None:
    store = Store()
    store.add_index("spec", lambda obj: [obj["metadata"]["name"][0]])
    store.upsert(pool("a1"))
    before = footprint(store, CollectorRegistry())
    for name in ("b1", "b2", "c1"):
        store.upsert(pool(name))
    after = footprint(store, CollectorRegistry())
    assert set(before) == set(after)  # the path set does not grow with the objects
    assert footprint_growth(before, after) == {
        "Store._objects": (1, 4),  # an API object is an element, not walked into
        "Store._indexes[*]": (1, 3),  # the buckets of the index
        "Store._indexes[*][*]": (1, 4),  # the keys in them
    }
    store.remove(("ns", "b1"))
    store.remove(("ns", "b2"), pool("b2", 2))
    store.remove(("ns", "c1"))
    grown = footprint_growth(before, footprint(store, CollectorRegistry()))
    assert set(grown) == {"Store._tombstones"}  # a tombstone per deleted object


def test_only_the_wildcard_of_a_bounded_path_matches_anything() -> None:
    sessions = "Controller.registry._backends[*].resolver.{}._sessions"
    grown = {sessions.format(via): 2 for via in ("_resolved[*][*]", "connections._clients[*]")}
    assert footprint_growth({}, grown) == {}
    near = {"Controller.registry._backends.resolver.x._sessions": (0, 1), sessions.format("x") + "[*]": (0, 1)}
    assert footprint_growth({}, {path: after for path, (_, after) in near.items()}) == near


def test_module_state_caches_cycles_and_series(monkeypatch: pytest.MonkeyPatch) -> None:
    memo: dict[str, int] = {}

    @functools.cache
    def cached(value: int) -> int:
        return value

    @functools.lru_cache(maxsize=8)
    def bounded(value: int) -> int:  # bounded by design: not counted
        return value

    cached.__module__ = bounded.__module__ = store_module.__name__  # as if defined there
    monkeypatch.setattr(store_module, "_bounded", bounded, raising=False)

    monkeypatch.setattr(store_module, "_memo", memo, raising=False)
    monkeypatch.setattr(store_module, "_cached", cached, raising=False)
    registry = CollectorRegistry()
    counter = Counter("things", "Things.", ["pool"], registry=registry)
    cyclic = Store()
    cyclic._objects[("ns", "self")] = {"store": cyclic}
    before = footprint(cyclic, registry)
    memo["x"] = 1
    cached(1)
    cached(2)
    bounded(1)
    counter.labels(pool="a").inc()
    grown = footprint_growth(before, footprint(cyclic, registry))
    assert grown == {
        "ipam_provider.runtime.cache.store._memo": (0, 1),
        "ipam_provider.runtime.cache.store._cached.cache": (0, 2),
        "prometheus.things": (0, 1),
    }


async def test_counts_live_tasks() -> None:
    assert footprint(object(), CollectorRegistry())["asyncio.all_tasks"] >= 1
