"""The cache's contract: no regression to older versions, tombstones, and consistent indexes."""

from __future__ import annotations

from typing import Any

from ipam_provider.runtime.cache.store import Store


def obj(name: str, version: int, pool: str = "p", namespace: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": str(version)}, "spec": {"pool": pool}}


def test_an_older_version_never_replaces_a_newer_one() -> None:
    store = Store()
    assert store.upsert(obj("a", 5)) is True
    assert store.upsert(obj("a", 4)) is False
    assert store.get("ns", "a") == obj("a", 5)
    assert store.upsert(obj("a", 6)) is True
    assert store.get("ns", "a") == obj("a", 6)


def test_a_tombstone_refuses_versions_up_to_the_deletion_but_not_a_new_object() -> None:
    store = Store()
    store.upsert(obj("a", 5))
    store.remove(("ns", "a"), obj("a", 7))
    assert store.upsert(obj("a", 6)) is False, "a late answer to an earlier write must not resurrect the object"
    assert store.upsert(obj("a", 7)) is False
    assert store.get("ns", "a") is None
    assert store.upsert(obj("a", 9)) is True, "a re-created object (newer version) is stored"
    assert store.get("ns", "a") == obj("a", 9)


def test_indexes_follow_updates_and_removals() -> None:
    store = Store()
    store.add_index("pool", lambda o: [o["spec"]["pool"]])
    store.upsert(obj("a", 1, pool="p"))
    store.upsert(obj("b", 1, pool="p"))
    assert {o["metadata"]["name"] for o in store.by_index("pool", "p")} == {"a", "b"}
    store.upsert(obj("a", 2, pool="q"))
    assert [o["metadata"]["name"] for o in store.by_index("pool", "p")] == ["b"]
    assert [o["metadata"]["name"] for o in store.by_index("pool", "q")] == ["a"]
    store.remove(("ns", "b"))
    assert store.by_index("pool", "p") == []


def test_a_malformed_object_is_kept_but_not_indexed() -> None:
    store = Store()
    store.add_index("pool", lambda o: [o["spec"]["pool"]])
    store.upsert({"metadata": {"name": "odd", "namespace": "ns", "resourceVersion": "1"}})
    assert store.get("ns", "odd") is not None
    assert store.by_index("pool", "p") == []


def test_the_same_version_is_not_stored_again() -> None:
    """The watch's echo of a write whose answer is cached already, or a re-list's unchanged object."""
    store = Store()
    store.add_index("pool", lambda o: [o["spec"]["pool"]])
    assert store.upsert(obj("a", 5, pool="p")) is True
    assert store.upsert(obj("a", 5, pool="echo")) is False
    assert store.get("ns", "a") == obj("a", 5, pool="p")
    assert store.by_index("pool", "echo") == []


def test_a_tombstone_the_watch_showed_goes_once_the_objects_reconcile_finished() -> None:
    store = Store()
    store.upsert(obj("a", 5))
    store.upsert(obj("b", 5))
    store.remove(("ns", "a"), obj("a", 7), watched=True)
    store.remove(("ns", "b"), obj("b", 7))  # our own write's answer: the watch has not shown it yet
    store.forget_tombstone(("ns", "a"))
    store.forget_tombstone(("ns", "b"))
    assert store.upsert(obj("b", 6)) is False, "an unwatched deletion keeps its tombstone"
    assert store.upsert(obj("a", 6)) is True, "a watched and reconciled deletion leaves none"
    store.remove(("ns", "b"), obj("b", 8), watched=True)
    store.forget_tombstone(("ns", "b"))
    assert store.upsert(obj("b", 7)) is True
