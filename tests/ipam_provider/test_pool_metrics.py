"""The per-pool `ipam_provider_*` series, driven by the reconcilers against the in-memory API server and the fake
backend, read from prometheus-client's default registry. Every test uses pools of its own names, so that series
of other tests do not mix in."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from ipam_provider.api.capi import CLAIMS, FINALIZER_PROTECT_POOL
from ipam_provider.backend.contract import AddressCounts, PoolExhaustedError, PoolReport
from ipam_provider.backend.registry import BackendRegistry, backend_name
from ipam_provider.pool_metrics import FirstSeen
from ipam_provider.reconcile.context import pool_resource
from tests.support.fake_backend import FAKE_POOL, GLOBAL_FAKE_POOL, FakeBackend
from tests.support.world import NS, POOLS, World, claim, pool, ready_state, resynced

BACKEND = "fake_backend"  # derived from the fake backend's module: tests/support/fake_backend.py
POOL_SERIES = (
    "ipam_provider_allocated_ips",
    "ipam_provider_available_ips",
    "ipam_provider_allocation_total",
    "ipam_provider_release_total",
    "ipam_provider_allocation_errors_total",
    "ipam_provider_waiting_claims",
    "ipam_provider_pool_ready",
)


def labels(name: str, namespace: str = NS, kind: str = "FakeIPPool") -> dict[str, str]:
    return {"backend": BACKEND, "kind": kind, "namespace": namespace, "name": name}


def value(metric: str, name: str, **extra: str) -> float | None:
    return REGISTRY.get_sample_value(metric, {**labels(name), **extra})


def allocations_timed(kind: str = "FakeIPPool") -> float:
    """The kind's duration histogram's count: one histogram per backend and kind, not per pool."""
    return (
        REGISTRY.get_sample_value("ipam_provider_allocation_duration_seconds_count", {"backend": BACKEND, "kind": kind})
        or 0.0
    )


def series_of(name: str, namespace: str = NS) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of the pool's series."""
    wanted = labels(name, namespace)
    return [
        (sample.name, sample.labels, sample.value)
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name in POOL_SERIES and all(sample.labels.get(k) == v for k, v in wanted.items())
    ]


def ready_series(name: str) -> dict[str, float]:
    return {s[1]["reason"]: s[2] for s in series_of(name) if s[0] == "ipam_provider_pool_ready"}


def waiting_series(name: str) -> dict[str, float]:
    return {s[1]["reason"]: s[2] for s in series_of(name) if s[0] == "ipam_provider_waiting_claims"}


async def test_allocations_counts_and_readiness_of_a_pool(world: World) -> None:
    world.add(POOLS, pool("tm-alloc"))
    timed_before = allocations_timed()
    world.backend.report_with = PoolReport(True, "PoolReady", counts=AddressCounts(254, used=2, free=252))
    for name in ("a1", "a2"):
        world.add(CLAIMS, claim(name, "tm-alloc"))
        assert await world.claims.reconcile(NS, name) is None
        assert ready_state(world.claim(name)) == ("True", "AddressAllocated")
    world.sync()
    assert resynced(await world.pools.reconcile(FAKE_POOL.ref(NS, "tm-alloc")))

    assert value("ipam_provider_allocation_total", "tm-alloc") == 2
    assert allocations_timed() - timed_before == 2
    assert value("ipam_provider_allocation_duration_seconds_count", "tm-alloc") is None, "not split by pool"
    assert value("ipam_provider_allocated_ips", "tm-alloc") == 2
    assert value("ipam_provider_available_ips", "tm-alloc") == 252
    assert ready_series("tm-alloc") == {"PoolReady": 1}
    assert waiting_series("tm-alloc") == {"Pending": 0}

    assert await world.claims.reconcile(NS, "a1") is None  # fulfilled already: nothing written, nothing counted
    assert value("ipam_provider_allocation_total", "tm-alloc") == 2


async def test_exhaustion_is_counted_and_waiting_claims_show_their_reason(world: World) -> None:
    world.add(POOLS, pool("tm-full"))
    timed_before = allocations_timed()
    world.backend.fail("allocate", PoolExhaustedError("no free address in tm-full"))
    world.add(CLAIMS, claim("w1", "tm-full"))
    world.add(CLAIMS, claim("w2", "tm-full"))
    world.add(CLAIMS, claim("w3", "tm-full", annotations={"cluster.x-k8s.io/paused": ""}))  # never looked at
    for name in ("w1", "w2"):
        assert await world.claims.reconcile(NS, name) == 60.0
    assert await world.claims.reconcile(NS, "w1") == 60.0
    # The claims' new reason shows at once, before the pool's next reconcile.
    assert waiting_series("tm-full") == {"PoolExhausted": 2, "Pending": 1}
    world.sync()
    world.backend.report_with = PoolReport(False, "PoolExhausted", counts=AddressCounts(2, used=2, free=0))
    await world.pools.reconcile(FAKE_POOL.ref(NS, "tm-full"))

    assert value("ipam_provider_allocation_errors_total", "tm-full", reason="PoolExhausted") == 3
    assert value("ipam_provider_allocation_total", "tm-full") == 0  # present from the first pool reconcile
    assert waiting_series("tm-full") == {"PoolExhausted": 2, "Pending": 1}
    assert ready_series("tm-full") == {"PoolExhausted": 0}
    assert value("ipam_provider_available_ips", "tm-full") == 0

    # An address comes free: the claims are served, their waiting series go, Pending stays (the paused claim).
    world.backend.fail("allocate", None)
    for name in ("w1", "w2"):
        assert await world.claims.reconcile(NS, name) is None
    world.sync()
    world.backend.report_with = PoolReport(True, "PoolReady", counts=AddressCounts(4, used=4, free=0))
    await world.pools.reconcile(FAKE_POOL.ref(NS, "tm-full"))
    assert waiting_series("tm-full") == {"Pending": 1}
    assert ready_series("tm-full") == {"PoolReady": 1}, "the previous reason's series is gone"
    assert value("ipam_provider_allocation_total", "tm-full") == 2
    assert allocations_timed() - timed_before == 2


async def test_a_release_is_counted_and_a_deleted_pool_loses_every_series(world: World) -> None:
    world.add(POOLS, pool("tm-gone"))
    world.add(CLAIMS, claim("r1", "tm-gone"))
    assert await world.claims.reconcile(NS, "r1") is None
    world.sync()
    world.backend.fail("allocate", PoolExhaustedError("full"))
    world.add(CLAIMS, claim("r2", "tm-gone"))
    assert await world.claims.reconcile(NS, "r2") == 60.0
    world.sync()
    ref = FAKE_POOL.ref(NS, "tm-gone")
    await world.pools.reconcile(ref)
    for name in ("r1", "r2"):
        assert await world.kube.delete(CLAIMS, name, NS)
    world.sync()
    assert await world.claims.reconcile(NS, "r1") is None
    assert await world.claims.reconcile(NS, "r2") is None
    assert value("ipam_provider_release_total", "tm-gone") == 2
    names = {s[0] for s in series_of("tm-gone")}
    assert {"ipam_provider_allocation_errors_total", "ipam_provider_release_total"} <= names

    assert await world.kube.delete(POOLS, "tm-gone", NS)  # the pool carries ProtectPool: it is being deleted
    world.sync()
    assert await world.pools.reconcile(ref) is None  # no IPAddress left: the finalizer goes, and the pool with it
    assert world.kube.stored(POOLS, "tm-gone", NS) is None
    world.sync()
    assert await world.pools.reconcile(ref) is None
    assert series_of("tm-gone") == []


async def test_a_deleting_pool_that_still_has_addresses_reports_deleting(world: World) -> None:
    world.add(POOLS, pool("tm-del"))
    world.add(CLAIMS, claim("d1", "tm-del"))
    assert await world.claims.reconcile(NS, "d1") is None
    world.sync()
    await world.pools.reconcile(FAKE_POOL.ref(NS, "tm-del"))
    stored = world.kube.stored(POOLS, "tm-del", NS)
    assert stored is not None and stored["metadata"]["finalizers"] == [FINALIZER_PROTECT_POOL]
    assert await world.kube.delete(POOLS, "tm-del", NS)
    world.sync()
    assert await world.pools.reconcile(FAKE_POOL.ref(NS, "tm-del")) == 15.0
    assert ready_series("tm-del") == {"Deleting": 0}


async def test_a_cluster_scoped_pool_has_an_empty_namespace_label(world: World) -> None:
    world.add(pool_resource(GLOBAL_FAKE_POOL), pool("tm-global", kind=GLOBAL_FAKE_POOL))
    await world.pools.reconcile(GLOBAL_FAKE_POOL.ref(None, "tm-global"))
    found = REGISTRY.get_sample_value(
        "ipam_provider_pool_ready", {**labels("tm-global", "", "GlobalFakeIPPool"), "reason": "PoolReady"}
    )
    assert found == 1


def test_backend_names() -> None:
    registry = BackendRegistry([FakeBackend()])
    assert registry.name_of(FAKE_POOL.group, FAKE_POOL.kind) == "fake_backend"
    assert registry.name_of("other.example", "Nothing") == ""
    named = BackendRegistry()
    named.register(FakeBackend(), "static")
    assert named.name_of(FAKE_POOL.group, GLOBAL_FAKE_POOL.kind) == "static"

    class Plugin(FakeBackend):
        name = "plugin-pools"

    assert backend_name(Plugin()) == "plugin-pools"
    Plugin.__module__ = "my_plugin.backend"
    Plugin.name = ""
    assert backend_name(Plugin()) == "my_plugin"


def test_first_seen_is_per_uid_and_bounded() -> None:
    now = [100.0]
    seen = FirstSeen(limit=2, clock=lambda: now[0])
    seen.seen(("ns", "a"), "uid-a")
    now[0] = 105.0
    seen.seen(("ns", "a"), "uid-a")  # seen again: the first sighting counts
    assert seen.fulfilled(("ns", "a"), "uid-a") == 5.0
    assert seen.fulfilled(("ns", "a"), "uid-a") is None, "gone once fulfilled"
    seen.seen(("ns", "b"), "uid-b1")
    now[0] = 110.0
    seen.seen(("ns", "b"), "uid-b2")  # a new claim of the same name starts afresh
    assert seen.fulfilled(("ns", "b"), "uid-b2") == 0.0
    for name in ("c", "d", "e"):
        seen.seen(("ns", name), name)
    assert len(seen) == 2, "bounded: the oldest entry went"
    assert seen.fulfilled(("ns", "c"), "c") is None and seen.fulfilled(("ns", "e"), "e") == 0.0
    seen.forget(("ns", "d"))
    assert len(seen) == 0


async def test_a_failure_counted_after_its_pool_went_leaves_no_series(world: World) -> None:
    world.add(POOLS, pool("tm-gone"))
    world.add(CLAIMS, claim("g1", "tm-gone"))
    allocate = world.backend.allocate

    async def pool_deleted_meanwhile(*args: Any, **kwargs: Any) -> Any:
        assert await world.kube.delete(POOLS, "tm-gone", NS)
        world.sync()
        await world.pools.reconcile(FAKE_POOL.ref(NS, "tm-gone"))  # the pool's deletion is handled first
        raise PoolExhaustedError("no free address in tm-gone")

    world.backend.allocate = pool_deleted_meanwhile  # type: ignore[method-assign]
    await world.claims.reconcile(NS, "g1")
    world.backend.allocate = allocate  # type: ignore[method-assign]
    assert series_of("tm-gone") == []
