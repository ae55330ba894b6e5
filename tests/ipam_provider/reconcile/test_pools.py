"""PoolReconciler against the in-memory API server and the fake backend: the ProtectPool finalizer, status from the
backend's report, deletion held while IPAddresses name the pool, and pauses."""

from __future__ import annotations

from typing import Any

import pytest

from ipam_provider.api.capi import (
    ADDRESSES,
    ANNOTATION_DELETE_FOR_MOVE,
    ANNOTATION_SKIP_DELETE_VALIDATION,
    CLAIMS,
    FINALIZER_PROTECT_POOL,
)
from ipam_provider.backend.contract import AddressCounts, Allocation, PoolKind, PoolRef, PoolReport, ReportCondition
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.reconcile.pools import RETRY_ALLOCATING
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.fake_backend import FAKE_POOL, GLOBAL_FAKE_POOL, GROUP, FakeBackend
from tests.support.world import (
    NS,
    PAUSED,
    POOLS,
    Object,
    World,
    address,
    claim,
    make_world,
    pool,
    ready_of,
    ready_state,
    resynced,
)

REF = PoolRef(GROUP, "FakeIPPool", NS, "net")
DELETING = "2026-01-01T00:00:00Z"
IN_USE = "Pool has IPAddresses allocated. Cannot delete Pool until all IPAddresses have been removed."


def stored_pool(world: World, name: str = "net") -> Object:
    found = world.kube.stored(POOLS, name, NS)
    assert found is not None, f"pool {name} is gone"
    return found


async def test_a_live_pool_gets_the_finalizer_and_its_status_from_the_report(world: World) -> None:
    world.add(POOLS, pool())
    world.add(ADDRESSES, address("a1", "c1", ip="10.0.0.20", annotations={"k": "v"}))
    world.add(ADDRESSES, address("a2", "c2", "other", ip="10.0.0.21"))
    world.backend.report_with = PoolReport(
        True,
        "PoolReady",
        "1 of 254 used",
        status={"networkView": "default"},
        counts=AddressCounts(254, used=1, free=253, out_of_range=0),
    )

    assert resynced(await world.pools.reconcile(FAKE_POOL.ref(NS, "net")))

    stored = stored_pool(world)
    assert stored["metadata"]["finalizers"] == [FINALIZER_PROTECT_POOL]
    (report,) = world.backend.calls
    assert report.method == "report" and report.pool_ref == REF
    assert report.pool is not None and report.pool["metadata"]["finalizers"] == [FINALIZER_PROTECT_POOL]
    assert report.addresses == (Allocation("10.0.0.20", 24, "10.0.0.1", {"k": "v"}),), "the pool's IPAddresses only"
    assert stored["status"]["networkView"] == "default"
    assert stored["status"]["ipAddresses"] == {"total": 254, "used": 1, "free": 253, "outOfRange": 0}
    ready = ready_of(stored)
    assert ready is not None
    assert (ready["status"], ready["reason"], ready["message"]) == ("True", "PoolReady", "1 of 254 used")
    assert ready["observedGeneration"] == 1
    assert set(stored["status"]) == {"networkView", "ipAddresses", "conditions"}
    assert (await world.events()) == [], "a Ready pool records no Event"
    journal = world.journal
    finalizer, reported = journal.index("patch FakeIPPool net"), journal.index("backend report net")
    assert finalizer < reported < journal.index("patch FakeIPPool/status net"), journal
    assert world.ctx.caches.pool(REF) == stored

    await world.forget_requests()
    assert resynced(await world.pools.reconcile(FAKE_POOL.ref(NS, "net")))
    assert world.kube.writes() == [], "an unchanged report writes nothing"


async def test_a_report_without_counts_leaves_the_counts_alone(world: World) -> None:
    counts = {"total": 8, "used": 2, "free": 6}
    world.add(POOLS, {**pool(finalizers=[FINALIZER_PROTECT_POOL]), "status": {"ipAddresses": counts}})
    world.backend.report_with = PoolReport(True, "PoolReady")
    assert resynced(await world.pools.reconcile(FAKE_POOL.ref(NS, "net")))
    stored = stored_pool(world)
    assert stored["status"]["ipAddresses"] == counts
    assert ready_state(stored) == ("True", "PoolReady")


@pytest.mark.parametrize(("again", "period"), [(30.0, 30.0), (0.01, 1.0), (10_000.0, 600.0)])
async def test_a_report_that_says_when_it_changes_is_made_again_then(world: World, again: float, period: float) -> None:
    world.add(POOLS, pool(finalizers=[FINALIZER_PROTECT_POOL]))
    world.backend.report_with = PoolReport(True, "PoolReady", report_again=again)
    # at that time, at least 1 s later, at most the sync period later
    assert resynced(await world.pools.reconcile(FAKE_POOL.ref(NS, "net")), period)


async def test_a_pool_that_is_not_ready_says_why_with_a_warning_on_each_new_reason(world: World) -> None:
    world.add(POOLS, pool())
    world.backend.report_with = PoolReport(False, "PoolInvalid", "addresses must not be empty")
    assert resynced(await world.pools.reconcile(FAKE_POOL.ref(NS, "net")))
    ready = ready_of(stored_pool(world))
    assert ready is not None
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "PoolInvalid",
        "addresses must not be empty",
    )
    assert (await world.events()) == [("Warning", "PoolInvalid", "FakeIPPool", "net")]
    assert world.kube.stored_all(EVENTS, NS)[0]["message"] == "addresses must not be empty"

    await world.pools.reconcile(FAKE_POOL.ref(NS, "net"))
    assert len(await world.events()) == 1, "the same reason again: no new Event"
    world.backend.report_with = PoolReport(True, "PoolReady")
    await world.pools.reconcile(FAKE_POOL.ref(NS, "net"))
    assert ready_state(stored_pool(world)) == ("True", "PoolReady") and len(await world.events()) == 1
    world.backend.report_with = PoolReport(False, "Unreachable", "no route")
    await world.pools.reconcile(FAKE_POOL.ref(NS, "net"))
    assert (await world.events())[-1] == ("Warning", "Unreachable", "FakeIPPool", "net")


async def test_a_failing_report_propagates_after_the_finalizer(world: World) -> None:
    world.add(POOLS, pool())
    world.backend.fail("report", RuntimeError("backend bug"))
    with pytest.raises(RuntimeError):
        await world.pools.reconcile(FAKE_POOL.ref(NS, "net"))
    stored = stored_pool(world)
    assert stored["metadata"]["finalizers"] == [FINALIZER_PROTECT_POOL] and "status" not in stored


async def test_a_deleted_pool_is_held_while_ipaddresses_name_it(world: World) -> None:
    world.add(POOLS, pool(finalizers=[FINALIZER_PROTECT_POOL], deletionTimestamp=DELETING))
    world.kube.put(ADDRESSES, address("a1", "c1"))  # not in the cache: the count is read from the API server
    world.kube.put(ADDRESSES, address("a2", "c2", "other"))

    assert await world.pools.reconcile(FAKE_POOL.ref(NS, "net")) == 15.0
    stored = stored_pool(world)
    assert stored["metadata"]["finalizers"] == [FINALIZER_PROTECT_POOL]
    ready = ready_of(stored)
    assert ready is not None
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "Deleting", f"{IN_USE} (1 remain)")
    assert (await world.events()) == [("Warning", "Deleting", "FakeIPPool", "net")]
    assert world.backend.calls == [], "a deleted pool is not reported"

    assert await world.pools.reconcile(FAKE_POOL.ref(NS, "net")) == 15.0
    assert len(await world.events()) == 1

    assert await world.kube.delete(ADDRESSES, "a1", NS)
    assert await world.pools.reconcile(FAKE_POOL.ref(NS, "net")) is None
    assert world.kube.stored(POOLS, "net", NS) is None, "its last finalizer removed, the pool is gone"
    assert world.ctx.caches.pool(REF) is None


async def test_a_deleted_cluster_scoped_pool_counts_ipaddresses_in_every_namespace(world: World) -> None:
    global_pools = pool_resource(GLOBAL_FAKE_POOL)
    world.add(
        global_pools, pool("g", kind=GLOBAL_FAKE_POOL, finalizers=[FINALIZER_PROTECT_POOL], deletionTimestamp=DELETING)
    )
    for namespace in ("a", "b"):
        world.kube.put(ADDRESSES, address("x", "x", "g", kind=GLOBAL_FAKE_POOL, namespace=namespace))
    assert await world.pools.reconcile(GLOBAL_FAKE_POOL.ref(None, "g")) == 15.0
    stored = world.kube.stored(global_pools, "g")
    assert stored is not None
    ready = ready_of(stored)
    assert ready is not None and ready["message"] == f"{IN_USE} (2 remain)"


async def test_the_skip_validate_annotation_lets_a_deleted_pool_go_at_once(world: World) -> None:
    annotations = {ANNOTATION_SKIP_DELETE_VALIDATION: ""}
    world.add(POOLS, pool(finalizers=[FINALIZER_PROTECT_POOL], deletionTimestamp=DELETING, annotations=annotations))
    world.add(ADDRESSES, address("a1", "c1"))
    assert await world.pools.reconcile(FAKE_POOL.ref(NS, "net")) is None
    assert world.kube.stored(POOLS, "net", NS) is None
    assert world.journal == ["patch FakeIPPool net"], "no IPAddress is even looked for"


async def test_clusterctls_delete_for_move_lets_a_deleted_pool_go_at_once(world: World) -> None:
    """clusterctl's patch replaces the annotations, so the skip-validate annotation is gone by the delete."""
    annotations = {ANNOTATION_DELETE_FOR_MOVE: ""}
    world.add(POOLS, pool(finalizers=[FINALIZER_PROTECT_POOL], deletionTimestamp=DELETING, annotations=annotations))
    world.add(ADDRESSES, address("a1", "c1"))
    assert await world.pools.reconcile(FAKE_POOL.ref(NS, "net")) is None
    assert world.kube.stored(POOLS, "net", NS) is None
    assert world.journal == ["patch FakeIPPool net"], "no IPAddress is looked for, no status written"


async def test_a_pool_being_moved_is_not_reported(world: World) -> None:
    before = world.add(POOLS, pool(finalizers=[FINALIZER_PROTECT_POOL], annotations={ANNOTATION_DELETE_FOR_MOVE: ""}))
    await world.forget_requests()
    assert await world.pools.reconcile(FAKE_POOL.ref(NS, "net")) is None
    assert world.kube.requests == [] and world.backend.calls == []
    assert stored_pool(world) == before


async def test_a_deleted_pool_keeps_finalizers_that_are_not_ours(world: World) -> None:
    world.add(POOLS, pool(finalizers=["example.com/keep", FINALIZER_PROTECT_POOL], deletionTimestamp=DELETING))
    assert await world.pools.reconcile(FAKE_POOL.ref(NS, "net")) is None
    assert stored_pool(world)["metadata"]["finalizers"] == ["example.com/keep"]
    world.sync()
    await world.forget_requests()
    assert await world.pools.reconcile(FAKE_POOL.ref(NS, "net")) is None
    assert world.kube.requests == [], "without our finalizer a deleted pool is none of our business"


@pytest.mark.parametrize("deleting", [False, True], ids=["live", "deleted"])
async def test_a_paused_pool_is_left_alone(world: World, deleting: bool) -> None:
    meta: Object = {"annotations": PAUSED}
    if deleting:
        meta.update(finalizers=[FINALIZER_PROTECT_POOL], deletionTimestamp=DELETING)
        world.add(ADDRESSES, address("a1", "c1"))
    before = world.add(POOLS, pool(**meta))
    await world.forget_requests()
    assert await world.pools.reconcile(FAKE_POOL.ref(NS, "net")) is None
    assert world.kube.requests == [] and world.backend.calls == []
    assert stored_pool(world) == before


async def test_pools_not_cached_or_of_kinds_no_backend_serves_are_ignored(world: World) -> None:
    assert await world.pools.reconcile(FAKE_POOL.ref(NS, "missing")) is None
    other = PoolKind("ipam.other.example", "v1", "OtherPool", "otherpools", namespaced=True)
    assert await world.pools.reconcile(other.ref(NS, "net")) is None
    assert world.kube.requests == [] and world.backend.calls == []


async def test_a_deleted_pool_waits_for_the_allocations_under_way_in_this_process(world: World) -> None:
    """A claim's allocation started before the pool's deletion was seen: its IPAddress is not written yet, so the
    API server's count cannot see it; the pool keeps its finalizer until the allocation is done."""
    world.add(POOLS, pool(finalizers=[FINALIZER_PROTECT_POOL], deletionTimestamp=DELETING))
    with world.ctx.allocating(REF):
        assert await world.pools.reconcile(REF) == RETRY_ALLOCATING
        assert stored_pool(world)["metadata"]["finalizers"] == [FINALIZER_PROTECT_POOL]
        world.kube.put(ADDRESSES, address("a1", "c1"))  # the allocation writes its IPAddress, then ends
    assert world.ctx.allocations_under_way(REF) == 0
    assert await world.pools.reconcile(REF) == 15.0, "now held by the IPAddress, as any pool in use"


async def test_a_claim_that_sees_its_pool_deleted_mid_reconcile_does_not_allocate(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's deletion reaches the cache while the claim's finalizer is being written (after the claim's
    reconcile read the pool): the claim must not start an allocation the pool's reconcile cannot see."""
    world.add(POOLS, pool(finalizers=[FINALIZER_PROTECT_POOL]))
    world.add(CLAIMS, claim("m1"))
    patch = world.kube.patch

    async def patch_then_delete_pool(*args: Any, **kwargs: Any) -> Object:
        answer = await patch(*args, **kwargs)
        now = stored_pool(world)
        meta = {**now["metadata"], "deletionTimestamp": DELETING}
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1000)
        world.ctx.caches.pools[(REF.group, REF.kind)].upsert({**now, "metadata": meta})
        return answer

    monkeypatch.setattr(world.kube, "patch", patch_then_delete_pool)
    assert await world.claims.reconcile(NS, "m1") == 0.0
    assert world.backend.calls_of("allocate") == [], "no allocation once the deletion is seen"
    assert world.address("m1") is None


def condition_of(obj: Object, type: str) -> Object | None:
    return next((c for c in obj["status"]["conditions"] if c["type"] == type), None)


async def test_a_report_writes_its_other_conditions_with_a_warning_event_as_one_enters(world: World) -> None:
    world.add(POOLS, pool())
    other = PoolRef(GROUP, "FakeIPPool", NS, "other")
    overlapping = ReportCondition("Overlap", True, "Overlapping", "shares addresses with other", warning=True)
    world.backend.report_with = PoolReport(True, "PoolReady", "ok", conditions=[overlapping], related=[other])

    await world.pools.reconcile(REF)
    stored = stored_pool(world)
    written = condition_of(stored, "Overlap")
    assert written is not None
    assert (written["status"], written["reason"], written["message"]) == ("True", "Overlapping", overlapping.message)
    assert condition_of(stored, "Ready") is not None
    assert await world.events() == [("Warning", "Overlapping", "FakeIPPool", "net")]
    assert world.pool_changes == [other], "the related pool is looked at again: this pool's status changed"

    await world.pools.reconcile(REF)
    assert await world.events() == [("Warning", "Overlapping", "FakeIPPool", "net")], "no second Event"
    assert world.pool_changes == [other], "nothing changed: the related pool is left alone"

    cleared = ReportCondition("Overlap", False, "Clear", "", warning=False)
    world.backend.report_with = PoolReport(True, "PoolReady", "ok", conditions=[cleared])
    await world.pools.reconcile(REF)
    written = condition_of(stored_pool(world), "Overlap")
    assert written is not None and (written["status"], written["reason"]) == ("False", "Clear")
    world.backend.report_with = PoolReport(True, "PoolReady", "ok", conditions=[overlapping])
    await world.pools.reconcile(REF)
    await world.ctx.recorder.flush()
    (event,) = world.kube.stored_all(EVENTS, NS)
    assert (event["reason"], event["count"]) == ("Overlapping", 2), "entered again: the Event once more"

    world.backend.report_with = PoolReport(True, "PoolReady", "ok")
    await world.pools.reconcile(REF)
    assert condition_of(stored_pool(world), "Overlap") is not None, "a condition the report leaves out stays"


async def test_a_backend_that_follows_an_external_system_is_reported_at_its_own_interval() -> None:
    world = make_world(FakeBackend(report_interval=60.0))
    world.add(POOLS, pool())
    assert resynced(await world.pools.reconcile(FAKE_POOL.ref(NS, "net")), 60.0)
