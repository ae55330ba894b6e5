"""ClaimReconciler against the in-memory API server and the fake backend: the CAPI IPAM contract step by step,
failures, pauses, release order, re-creation and adoption, and what a lagging cache must not do."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ipam_provider.api.capi import (
    ADDRESSES,
    ANNOTATION_DELETE_FOR_MOVE,
    ANNOTATION_PAUSED,
    CLAIMS,
    CLUSTERS,
    FINALIZER_PROTECT_ADDRESS,
    FINALIZER_PROTECT_POOL,
    FINALIZER_RELEASE_ADDRESS,
    LABEL_CLUSTER_NAME,
)
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    BackendError,
    ClaimContext,
    PoolExhaustedError,
    PoolNotReadyError,
    PoolRef,
    ReleaseImpossibleError,
)
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.fake_backend import GLOBAL_FAKE_POOL, GROUP, HANDLE
from tests.support.fake_repair import RepairableFakeBackend
from tests.support.world import (
    NS,
    POOLS,
    Object,
    World,
    address,
    claim,
    cluster,
    make_world,
    pool,
    ready_of,
    ready_state,
)

REF = PoolRef(GROUP, "FakeIPPool", NS, "net")
FIRST = Allocation("10.0.0.10", 24, "10.0.0.1", {HANDLE: "h-10"})  # what the fake backend hands out first
ALLOCATED = ("True", "AddressAllocated")


def owners(claim_obj: Object, pool_obj: Object) -> list[Object]:
    """The owner references of a claim's IPAddress: the claim as controller, the pool, both blocking deletion."""
    return [
        {
            "apiVersion": CLAIMS.api_version,
            "kind": "IPAddressClaim",
            "name": claim_obj["metadata"]["name"],
            "uid": claim_obj["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        },
        {
            "apiVersion": pool_obj["apiVersion"],
            "kind": pool_obj["kind"],
            "name": pool_obj["metadata"]["name"],
            "uid": pool_obj["metadata"]["uid"],
            "controller": False,
            "blockOwnerDeletion": True,
        },
    ]


async def fulfilled(world: World, name: str = "m1", **meta: Any) -> Object:
    """A pool and a claim, reconciled once: the claim holds 10.0.0.10. Returns the pool."""
    created = world.add(POOLS, pool())
    world.add(CLAIMS, claim(name, **meta))
    assert await world.claims.reconcile(NS, name) is None
    assert ready_state(world.claim(name)) == ALLOCATED
    world.sync()
    return created


async def delete_claim(world: World, name: str = "m1") -> None:
    """The user deletes the claim: its finalizer keeps it, with a deletionTimestamp, and the watch delivers that."""
    assert await world.kube.delete(CLAIMS, name, NS)
    world.sync()
    await world.forget_requests()


# --- the contract --------------------------------------------------------------------------------------------


async def test_a_claim_is_fulfilled_as_the_contract_says(world: World) -> None:
    created_pool = world.add(POOLS, pool())
    world.add(CLUSTERS, cluster("c1"))
    machine = {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": "m", "uid": "u", "controller": True}
    created = world.add(
        CLAIMS,
        claim("m1", cluster="c1", labels={"role": "worker"}, annotations={"note": "n"}, ownerReferences=[machine]),
    )

    assert await world.claims.reconcile(NS, "m1") is None

    (call,) = world.backend.calls
    assert call.method == "allocate" and call.pool_ref == REF and call.allocation is None
    assert call.pool == created_pool
    assert call.claim == ClaimContext(
        namespace=NS,
        name="m1",
        uid=created["metadata"]["uid"],
        cluster_name="c1",
        labels={"role": "worker"},
        annotations={"note": "n"},
        owner_references=[machine],
    )
    ip = world.address("m1")
    assert ip is not None
    assert ip["spec"] == {
        "claimRef": {"name": "m1"},
        "poolRef": {"apiGroup": GROUP, "kind": "FakeIPPool", "name": "net"},
        "address": "10.0.0.10",
        "prefix": 24,
        "gateway": "10.0.0.1",
    }
    assert ip["metadata"]["finalizers"] == [FINALIZER_PROTECT_ADDRESS]
    assert ip["metadata"]["labels"] == {LABEL_CLUSTER_NAME: "c1"}
    assert ip["metadata"]["annotations"] == {HANDLE: "h-10"}, "the backend's bookkeeping is kept on the IPAddress"
    assert ip["metadata"]["ownerReferences"] == owners(created, created_pool)

    stored = world.claim("m1")
    assert stored["metadata"]["finalizers"] == [FINALIZER_RELEASE_ADDRESS]
    assert stored["status"]["addressRef"] == {"name": "m1"}
    ready = ready_of(stored)
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ALLOCATED
    assert ready["message"] == "10.0.0.10/24 allocated from FakeIPPool/ns/net"
    assert ready["observedGeneration"] == 1
    assert (await world.events()) == [("Normal", "AddressAllocated", "IPAddressClaim", "m1")]
    related = world.kube.stored_all(EVENTS, NS)[0]["related"]
    assert (related["kind"], related["name"], related["uid"]) == ("FakeIPPool", "net", created_pool["metadata"]["uid"])
    assert world.pool_changes == [REF]

    journal = world.journal
    finalizer, allocate = journal.index("patch IPAddressClaim m1"), journal.index("backend allocate m1")
    created_address, status = journal.index("create IPAddress m1"), journal.index("patch IPAddressClaim/status m1")
    assert finalizer < allocate < created_address < status, journal
    caches = world.ctx.caches
    assert caches.claims.get(NS, "m1") == stored, "the cache holds what the reconciler wrote"
    assert caches.addresses.get(NS, "m1") == ip


async def test_a_fulfilled_claim_is_left_as_it_is_and_its_address_confirmed(world: World) -> None:
    await fulfilled(world)
    await world.forget_requests()
    assert await world.claims.reconcile(NS, "m1") is None
    assert world.kube.writes() == [], "nothing changed, nothing written"
    assert world.backend.calls[-1].method == "allocate" and world.backend.calls[-1].allocation == FIRST
    assert (await world.events()) == [("Normal", "AddressAllocated", "IPAddressClaim", "m1")]


async def test_the_cluster_label_names_the_cluster(world: World) -> None:
    world.add(CLUSTERS, cluster("c2"))
    await fulfilled(world, labels={LABEL_CLUSTER_NAME: "c2"})
    assert world.backend.calls[0].claim is not None and world.backend.calls[0].claim.cluster_name == "c2"
    ip = world.address("m1")
    assert ip is not None and ip["metadata"]["labels"] == {LABEL_CLUSTER_NAME: "c2"}


async def test_a_cluster_scoped_pool(world: World) -> None:
    global_pools = pool_resource(GLOBAL_FAKE_POOL)
    created_pool = world.add(global_pools, pool("global", kind=GLOBAL_FAKE_POOL))
    created = world.add(CLAIMS, claim("m1", "global", kind=GLOBAL_FAKE_POOL))
    assert await world.claims.reconcile(NS, "m1") is None
    assert world.backend.calls[0].pool_ref == PoolRef(GROUP, "GlobalFakeIPPool", None, "global")
    ip = world.address("m1")
    assert ip is not None
    assert ip["spec"]["poolRef"] == {"apiGroup": GROUP, "kind": "GlobalFakeIPPool", "name": "global"}
    assert ip["metadata"]["ownerReferences"] == owners(created, created_pool)
    assert ip["metadata"]["labels"] == {}, "no cluster, no cluster label"


# --- failures ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "delay"),
    [
        (PoolExhaustedError("no free address in net"), 60.0),
        (PoolNotReadyError("net is not valid"), 30.0),
        (AllocationFailedError("the external system said no"), 30.0),
        (PoolNotReadyError("the external system is down", retry_after=5.0), 5.0),
    ],
    ids=["exhausted", "not-ready", "failed", "retry-after"],
)
async def test_an_allocation_failure_is_shown_on_the_claim(world: World, error: BackendError, delay: float) -> None:
    world.add(POOLS, pool())
    world.add(CLAIMS, claim())
    world.backend.fail("allocate", error)

    assert await world.claims.reconcile(NS, "m1") == delay
    stored = world.claim("m1")
    assert stored["metadata"]["finalizers"] == [FINALIZER_RELEASE_ADDRESS], "the finalizer comes before the backend"
    ready = ready_of(stored)
    assert ready is not None
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", error.reason, error.message)
    assert "addressRef" not in stored["status"]
    assert world.address("m1") is None
    assert (await world.events()) == [("Warning", error.reason, "IPAddressClaim", "m1")]

    await world.forget_requests()
    assert await world.claims.reconcile(NS, "m1") == delay
    assert world.kube.writes() == [], "the same failure again: no status write"
    assert len(await world.events()) == 1, "an Event on transitions only"

    world.backend.fail("allocate", None)
    assert await world.claims.reconcile(NS, "m1") is None
    assert ready_state(world.claim("m1")) == ALLOCATED
    assert (await world.events())[-1] == ("Normal", "AddressAllocated", "IPAddressClaim", "m1")


async def test_an_unexpected_allocation_error_propagates_and_writes_no_status(world: World) -> None:
    world.add(POOLS, pool())
    world.add(CLAIMS, claim())
    world.backend.fail("allocate", RuntimeError("a bug in the backend"))
    with pytest.raises(RuntimeError, match="a bug in the backend"):
        await world.claims.reconcile(NS, "m1")
    stored = world.claim("m1")
    assert stored["metadata"]["finalizers"] == [FINALIZER_RELEASE_ADDRESS]
    assert "status" not in stored and world.address("m1") is None and (await world.events()) == []


# --- pauses --------------------------------------------------------------------------------------------------


async def annotate_claim(world: World) -> None:
    await world.kube.patch(CLAIMS, "m1", {"metadata": {"annotations": {ANNOTATION_PAUSED: ""}}}, NS)


async def pause_cluster_spec(world: World) -> None:
    await world.kube.patch(CLUSTERS, "c1", {"spec": {"paused": True}}, NS)


async def annotate_cluster(world: World) -> None:
    await world.kube.patch(CLUSTERS, "c1", {"metadata": {"annotations": {ANNOTATION_PAUSED: ""}}}, NS)


async def annotate_pool(world: World) -> None:
    await world.kube.patch(POOLS, "net", {"metadata": {"annotations": {ANNOTATION_PAUSED: ""}}}, NS)


PAUSES: list[Callable[[World], Awaitable[None]]] = [annotate_claim, pause_cluster_spec, annotate_cluster, annotate_pool]
PAUSE_IDS = ["claim-annotation", "cluster-spec", "cluster-annotation", "pool-annotation"]


@pytest.mark.parametrize("pause", PAUSES, ids=PAUSE_IDS)
async def test_a_paused_claim_gets_nothing(world: World, pause: Callable[[World], Awaitable[None]]) -> None:
    world.add(POOLS, pool())
    world.add(CLUSTERS, cluster("c1"))
    world.add(CLAIMS, claim(cluster="c1"))
    await pause(world)
    world.sync()
    before = world.claim("m1")
    await world.forget_requests()

    assert await world.claims.reconcile(NS, "m1") is None
    assert world.kube.requests == [] and world.backend.calls == []
    assert world.claim("m1") == before and world.address("m1") is None


@pytest.mark.parametrize("pause", PAUSES, ids=PAUSE_IDS)
async def test_a_paused_claim_is_not_released(world: World, pause: Callable[[World], Awaitable[None]]) -> None:
    world.add(CLUSTERS, cluster("c1"))
    await fulfilled(world, cluster="c1")
    await pause(world)
    await delete_claim(world)

    assert await world.claims.reconcile(NS, "m1") is None
    assert world.kube.requests == [] and world.backend.calls_of("release") == []
    assert world.claim("m1")["metadata"]["finalizers"] == [FINALIZER_RELEASE_ADDRESS]
    assert world.address("m1") is not None


async def test_a_claim_waits_for_its_cluster_to_exist(world: World) -> None:
    world.add(POOLS, pool())
    world.add(CLAIMS, claim(cluster="ghost"))
    assert await world.claims.reconcile(NS, "m1") is None
    stored = world.claim("m1")
    ready = ready_of(stored)
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "AllocationFailed")
    assert "Cluster ns/ghost was not found" in ready["message"]
    assert "finalizers" not in stored["metadata"], "no finalizer before it is known whether the Cluster is paused"
    assert world.backend.calls == []
    assert (await world.events()) == [("Warning", "AllocationFailed", "IPAddressClaim", "m1")]

    world.add(CLUSTERS, cluster("ghost"))
    assert await world.claims.reconcile(NS, "m1") is None
    assert ready_state(world.claim("m1")) == ALLOCATED


# --- release -------------------------------------------------------------------------------------------------


async def test_release_lets_the_ipaddress_go_first_then_the_backend_then_the_claim(world: World) -> None:
    created_pool = await fulfilled(world)
    claim_uid = world.claim("m1")["metadata"]["uid"]
    ip = world.address("m1")
    assert ip is not None
    await delete_claim(world)

    assert await world.claims.reconcile(NS, "m1") is None

    journal = world.journal
    let_go, deleted = journal.index("patch IPAddress m1"), journal.index("delete IPAddress m1")
    released, claim_let_go = journal.index("backend release m1"), journal.index("patch IPAddressClaim m1")
    assert let_go < deleted < released < claim_let_go, journal
    assert journal.index("get IPAddress m1") < let_go, "the IPAddress is read from the API server, not the cache"
    delete = next(r for r in world.kube.requests if r.verb == "delete")
    assert delete.body == {"preconditions": {"uid": ip["metadata"]["uid"]}}
    (release,) = world.backend.calls_of("release")
    assert release.pool_ref == REF and release.pool == world.ctx.caches.pool(REF) == created_pool
    assert release.claim is not None and release.claim.uid == claim_uid
    assert release.allocation == FIRST, "the allocation recorded on the IPAddress is handed back"
    assert world.kube.stored(CLAIMS, "m1", NS) is None and world.address("m1") is None
    assert world.ctx.caches.claims.get(NS, "m1") is None and world.ctx.caches.addresses.get(NS, "m1") is None
    assert world.pool_changes[-1] == REF
    assert world.backend.held == {}


async def test_release_finds_an_ipaddress_the_cache_has_not_seen(world: World) -> None:
    await fulfilled(world)
    await delete_claim(world)
    world.ctx.caches.addresses.remove((NS, "m1"))  # a lagging watch
    assert await world.claims.reconcile(NS, "m1") is None
    assert world.address("m1") is None
    assert world.backend.calls_of("release")[0].allocation == FIRST


async def test_release_leaves_other_finalizers_and_other_claims_addresses(world: World) -> None:
    await fulfilled(world, finalizers=["example.com/keep"])
    stored = world.claim("m1")
    assert stored["metadata"]["finalizers"] == ["example.com/keep", FINALIZER_RELEASE_ADDRESS]
    await world.kube.patch(ADDRESSES, "m1", {"spec": {"claimRef": {"name": "someone-else"}}}, NS)
    await delete_claim(world)

    assert await world.claims.reconcile(NS, "m1") is None
    assert world.address("m1") is not None, "an IPAddress naming another claim is not ours to delete"
    (release,) = world.backend.calls_of("release")
    assert release.allocation is None
    remaining = world.claim("m1")
    assert remaining["metadata"]["finalizers"] == ["example.com/keep"]
    assert remaining["metadata"]["deletionTimestamp"]


async def test_release_waits_while_another_finalizer_keeps_the_ipaddress(world: World) -> None:
    """The address is never free in the backend while an IPAddress still names it: with someone else's
    finalizer on the deleted IPAddress, the backend is not asked to release and the claim keeps its finalizer;
    once the IPAddress is gone, the release goes on."""
    await fulfilled(world)
    await world.kube.patch(
        ADDRESSES, "m1", {"metadata": {"finalizers": [FINALIZER_PROTECT_ADDRESS, "example.com/hold"]}}, NS
    )
    await delete_claim(world)

    assert await world.claims.reconcile(NS, "m1") == 30.0
    ip = world.address("m1")
    assert ip is not None and ip["metadata"]["deletionTimestamp"]
    assert ip["metadata"]["finalizers"] == ["example.com/hold"]
    assert world.backend.calls_of("release") == []
    assert world.claim("m1")["metadata"]["finalizers"] == [FINALIZER_RELEASE_ADDRESS]

    await world.kube.patch(ADDRESSES, "m1", {"metadata": {"finalizers": []}}, NS)
    world.sync()
    assert await world.claims.reconcile(NS, "m1") is None
    assert world.backend.calls_of("release")[0].allocation is None
    assert world.kube.stored(CLAIMS, "m1", NS) is None


async def test_a_release_that_can_never_succeed_lets_the_claim_go_with_a_warning() -> None:
    world = make_world(RepairableFakeBackend())
    await fulfilled(world)
    await delete_claim(world)
    world.backend.fail("release", ReleaseImpossibleError("the pool and its credentials are gone"))

    assert await world.claims.reconcile(NS, "m1") is None
    assert world.kube.stored(CLAIMS, "m1", NS) is None and world.address("m1") is None
    assert (await world.events())[-1] == ("Warning", "ReleaseFailed", "IPAddressClaim", "m1")
    event = world.kube.stored_all(EVENTS, NS)[-1]
    assert event["message"] == (
        "the pool and its credentials are gone; the repair loop releases the address once the pool's backend can be "
        "reached again"
    )


async def test_a_release_that_can_never_succeed_says_when_the_repair_loop_does_not_release() -> None:
    world = make_world(RepairableFakeBackend())
    world.ctx.repair_releases = False  # --repair-interval=0 or --repair-report-only
    await fulfilled(world)
    await delete_claim(world)
    world.backend.fail("release", ReleaseImpossibleError("the pool and its credentials are gone"))

    assert await world.claims.reconcile(NS, "m1") is None
    assert (await world.events())[-1] == ("Warning", "ReleaseFailed", "IPAddressClaim", "m1")
    message = world.kube.stored_all(EVENTS, NS)[-1]["message"]
    assert message.startswith("the pool and its credentials are gone; ") and "--repair-report-only" in message


async def test_a_release_that_can_never_succeed_says_by_hand_without_a_repairable_backend(world: World) -> None:
    await fulfilled(world)
    await delete_claim(world)
    world.backend.fail("release", ReleaseImpossibleError("the pool and its credentials are gone"))

    assert await world.claims.reconcile(NS, "m1") is None
    assert (await world.events())[-1] == ("Warning", "ReleaseFailed", "IPAddressClaim", "m1")
    message = world.kube.stored_all(EVENTS, NS)[-1]["message"]
    assert "repair loop releases" not in message and message.endswith("release the address in the backend by hand")


@pytest.mark.parametrize("sweeps", [True, False], ids=["sweeps-gone-pools", "no-sweep"])
async def test_a_release_impossible_after_the_pool_went_relies_on_the_loop_only_with_a_sweep(sweeps: bool) -> None:
    backend = RepairableFakeBackend()
    if not sweeps:
        setattr(backend, "sweep_orphaned", None)  # noqa: B010  (a repairable backend without the optional sweep)
    world = make_world(backend)
    await fulfilled(world)
    await delete_claim(world)
    assert await world.kube.delete(POOLS, "net", NS)
    world.sync()
    backend.fail("release", ReleaseImpossibleError("the pool and its credentials are gone"))

    assert await world.claims.reconcile(NS, "m1") is None
    assert (await world.events())[-1] == ("Warning", "ReleaseFailed", "IPAddressClaim", "m1")
    message = world.kube.stored_all(EVENTS, NS)[-1]["message"]
    assert ("the repair loop releases the address" in message) is sweeps
    assert message.endswith("release the address in the backend by hand") is not sweeps


@pytest.mark.parametrize(
    "error", [RuntimeError("connection reset"), PoolNotReadyError("the grid is down")], ids=["exception", "backend"]
)
async def test_a_failed_release_keeps_the_finalizer_and_is_retried(world: World, error: Exception) -> None:
    await fulfilled(world)
    await delete_claim(world)
    world.backend.fail("release", error)

    with pytest.raises(type(error)):
        await world.claims.reconcile(NS, "m1")
    stored = world.claim("m1")
    assert stored["metadata"]["finalizers"] == [FINALIZER_RELEASE_ADDRESS] and stored["metadata"]["deletionTimestamp"]
    assert world.address("m1") is None, "the IPAddress went first"
    assert [e for e in (await world.events()) if e[0] == "Warning"] == []

    world.backend.fail("release", None)
    assert await world.claims.reconcile(NS, "m1") is None
    assert world.backend.calls_of("release")[-1].allocation is None, "the retry releases by the claim's uid"
    assert world.kube.stored(CLAIMS, "m1", NS) is None


# --- clusterctl move ------------------------------------------------------------------------------------------
# At the source, clusterctl v1.13 (cmd/clusterctl/client/cluster/mover.go, deleteSourceObject) handles each moved
# object, deepest first (IPAddresses, then claims, then pools and the Cluster): a JSON patch that sets the
# annotations to {delete-for-move: ""}, a DELETE, then a merge patch removing every finalizer. The Cluster is
# paused first, but a claim need not name a Cluster, so the annotation alone must keep the backend from releasing.

MOVING = {ANNOTATION_DELETE_FOR_MOVE: ""}


async def clusterctl_deletes(world: World, resource: Any, name: str = "m1") -> None:
    """What clusterctl does to a source object before its finalizer patch: annotate, then delete."""
    await world.kube.patch(resource, name, {"metadata": {"annotations": MOVING}}, NS)
    assert await world.kube.delete(resource, name, NS)
    world.sync()
    await world.forget_requests()


@pytest.mark.parametrize("paused", [False, True], ids=["no-cluster", "cluster-paused"])
async def test_a_claim_deleted_for_a_move_is_not_released(world: World, paused: bool) -> None:
    if paused:
        world.add(CLUSTERS, cluster("c1", paused=True))
        world.add(POOLS, pool())
        world.add(CLAIMS, claim(cluster="c1"))
        await world.pools.reconcile(REF)  # nothing allocated while paused: give the claim what a move carries
        world.add(ADDRESSES, address("m1", "m1", finalizers=[FINALIZER_PROTECT_ADDRESS]))
        await world.kube.patch(CLAIMS, "m1", {"metadata": {"finalizers": [FINALIZER_RELEASE_ADDRESS]}}, NS)
        world.sync()
    else:
        await fulfilled(world)
    ip_before = world.address("m1")
    await clusterctl_deletes(world, CLAIMS)
    calls_before = len(world.backend.calls)

    assert await world.claims.reconcile(NS, "m1") is None
    assert world.backend.calls[calls_before:] == [], "no release, no allocation"
    assert world.kube.stored(CLAIMS, "m1", NS) is None, "our finalizer removed, the claim is gone"
    assert world.journal == ["patch IPAddressClaim m1"], "the claim's finalizer, nothing else"
    assert world.address("m1") == ip_before, "the IPAddress is clusterctl's to delete"
    if not paused:
        assert world.backend.held, "the backend still holds the address, for the claim's copy at the target"


async def test_a_claim_annotated_for_a_move_gets_nothing(world: World) -> None:
    world.add(POOLS, pool())
    world.add(CLAIMS, claim(annotations=MOVING))
    await world.forget_requests()
    assert await world.claims.reconcile(NS, "m1") is None
    assert world.kube.requests == [] and world.backend.calls == []


async def test_an_ipaddress_deleted_for_a_move_is_let_go_and_not_recreated(world: World) -> None:
    await fulfilled(world)
    claim_before = world.claim("m1")
    await clusterctl_deletes(world, ADDRESSES)
    calls_before = len(world.backend.calls)

    assert await world.claims.reconcile(NS, "m1") is None
    assert world.address("m1") is None, "our finalizer is removed, so the IPAddress goes"
    assert world.backend.calls[calls_before:] == []
    world.sync()
    await world.forget_requests()
    assert await world.claims.reconcile(NS, "m1") is None
    assert world.address("m1") is None, "not re-created: clusterctl deletes the claim next"
    assert world.kube.requests == [] and world.backend.calls[calls_before:] == []
    assert world.claim("m1") == claim_before

    # clusterctl deletes the claim: it goes without a release.
    await clusterctl_deletes(world, CLAIMS)
    assert await world.claims.reconcile(NS, "m1") is None
    assert world.kube.stored(CLAIMS, "m1", NS) is None and world.backend.calls_of("release") == []

    # A new claim of the same name later is served as any other.
    world.sync()
    assert await world.claims.reconcile(NS, "m1") is None
    world.add(CLAIMS, claim())
    assert await world.claims.reconcile(NS, "m1") is None
    assert ready_state(world.claim("m1")) == ALLOCATED and world.address("m1") is not None


# --- re-creation and adoption --------------------------------------------------------------------------------


async def test_an_ipaddress_deleted_while_its_claim_lives_is_recreated_identical(world: World) -> None:
    await fulfilled(world)
    before = world.address("m1")
    assert before is not None
    assert await world.kube.delete(ADDRESSES, "m1", NS)  # kept by ProtectAddress, now deleting
    world.sync()
    await world.forget_requests()

    assert await world.claims.reconcile(NS, "m1") is None
    assert world.address("m1") is None, "our finalizer is removed, so the deleted IPAddress goes"
    assert "backend allocate m1" not in world.journal

    world.sync()
    assert await world.claims.reconcile(NS, "m1") is None
    again = world.address("m1")
    assert again is not None and again["metadata"]["uid"] != before["metadata"]["uid"]
    assert again["spec"] == before["spec"]
    for field in ("labels", "annotations", "finalizers", "ownerReferences"):
        assert again["metadata"].get(field) == before["metadata"].get(field), field
    assert world.backend.calls[-1].allocation is None, "the backend holds the address for the claim's uid"
    assert ready_state(world.claim("m1")) == ALLOCATED
    assert len(await world.events()) == 1, "the claim never stopped being Ready"


async def test_an_existing_ipaddress_of_the_claim_is_adopted_with_its_spec_untouched(world: World) -> None:
    created_pool = world.add(POOLS, pool())
    world.add(CLUSTERS, cluster("c1"))
    created = world.add(CLAIMS, claim(cluster="c1"))
    existing = world.add(ADDRESSES, address("m1", "m1", ip="10.0.0.99", annotations={HANDLE: "restored"}))

    assert await world.claims.reconcile(NS, "m1") is None
    (call,) = world.backend.calls
    assert call.allocation == Allocation("10.0.0.99", 24, "10.0.0.1", {HANDLE: "restored"})
    adopted = world.address("m1")
    assert adopted is not None
    assert adopted["spec"] == existing["spec"]
    assert adopted["metadata"]["ownerReferences"] == owners(created, created_pool)
    assert adopted["metadata"]["finalizers"] == [FINALIZER_PROTECT_ADDRESS]
    assert adopted["metadata"]["labels"] == {LABEL_CLUSTER_NAME: "c1"}
    assert adopted["metadata"]["annotations"] == {HANDLE: "restored"}
    assert "create IPAddress m1" not in world.journal
    ready = ready_of(world.claim("m1"))
    assert ready is not None and ready["message"] == "10.0.0.99/24 allocated from FakeIPPool/ns/net"
    assert world.claim("m1")["status"]["addressRef"] == {"name": "m1"}
    assert world.pool_changes == [REF]


async def test_adoption_keeps_another_controller_owner(world: World) -> None:
    created_pool = world.add(POOLS, pool())
    world.add(CLAIMS, claim())
    stale = {
        "apiVersion": CLAIMS.api_version,
        "kind": "IPAddressClaim",
        "name": "m1",
        "uid": "before-a-restore",
        "controller": True,
    }
    world.add(ADDRESSES, address("m1", "m1", ownerReferences=[stale]))
    assert await world.claims.reconcile(NS, "m1") is None
    adopted = world.address("m1")
    assert adopted is not None
    assert adopted["metadata"]["ownerReferences"] == [stale, owners(world.claim("m1"), created_pool)[1]]


async def test_an_ipaddress_of_the_same_name_for_another_claim_fails_the_claim(world: World) -> None:
    world.add(POOLS, pool())
    world.add(CLAIMS, claim())
    other = world.add(ADDRESSES, address("m1", "other-claim"))

    assert await world.claims.reconcile(NS, "m1") == 15.0
    ready = ready_of(world.claim("m1"))
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "AllocationFailed")
    assert "already exists for claim other-claim" in ready["message"]
    assert world.backend.calls == []
    assert world.address("m1") == other
    assert (await world.events()) == [("Warning", "AllocationFailed", "IPAddressClaim", "m1")]


# --- the pool ------------------------------------------------------------------------------------------------


async def test_a_claim_without_its_pool_waits_with_pool_not_ready(world: World) -> None:
    world.add(CLAIMS, claim())
    assert await world.claims.reconcile(NS, "m1") is None
    stored = world.claim("m1")
    assert stored["metadata"]["finalizers"] == [FINALIZER_RELEASE_ADDRESS]
    ready = ready_of(stored)
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "PoolNotReady")
    assert (
        ready["message"]
        == "FakeIPPool/ns/net was not found; create it or point the claim's spec.poolRef at another pool"
    )
    assert world.backend.calls == []
    assert (await world.events()) == [("Warning", "PoolNotReady", "IPAddressClaim", "m1")]


async def test_a_claim_of_a_pool_being_deleted_waits_with_pool_not_ready(world: World) -> None:
    world.add(POOLS, pool(finalizers=[FINALIZER_PROTECT_POOL], deletionTimestamp="2026-01-01T00:00:00Z"))
    world.add(CLAIMS, claim())
    assert await world.claims.reconcile(NS, "m1") is None
    ready = ready_of(world.claim("m1"))
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "PoolNotReady")
    assert ready["message"].startswith("FakeIPPool/ns/net is being deleted;")
    assert world.backend.calls == []


@pytest.mark.parametrize("gone", ["missing", "deleting"])
async def test_a_fulfilled_claim_stays_ready_while_its_pool_goes(world: World, gone: str) -> None:
    await fulfilled(world)
    if gone == "missing":
        await world.kube.delete(POOLS, "net", NS)
    else:
        await world.kube.patch(POOLS, "net", {"metadata": {"finalizers": [FINALIZER_PROTECT_POOL]}}, NS)
        await world.kube.delete(POOLS, "net", NS)
    world.sync()
    await world.forget_requests()

    assert await world.claims.reconcile(NS, "m1") is None
    assert ready_state(world.claim("m1")) == ALLOCATED
    assert world.kube.writes() == [] and world.backend.calls[1:] == []


# --- what is not ours, and a cache that lags -----------------------------------------------------------------


async def test_claims_of_pool_kinds_no_backend_serves_are_ignored(world: World) -> None:
    other = claim()
    other["spec"]["poolRef"] = {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "net"}
    world.add(CLAIMS, other)
    before = world.claim("m1")
    await world.forget_requests()
    assert await world.claims.reconcile(NS, "m1") is None
    assert world.kube.requests == [] and world.backend.calls == [] and world.claim("m1") == before


async def test_a_claim_missing_from_the_cache_or_malformed_is_ignored(world: World) -> None:
    assert await world.claims.reconcile(NS, "nothing") is None
    broken = claim()
    del broken["spec"]["poolRef"]
    world.add(CLAIMS, broken)
    await world.forget_requests()
    assert await world.claims.reconcile(NS, "m1") is None
    assert world.kube.requests == [] and world.backend.calls == []


@pytest.mark.parametrize("server", ["deleted", "replaced"])
async def test_a_lagging_cache_never_allocates_for_a_claim_that_is_gone(world: World, server: str) -> None:
    world.add(POOLS, pool())
    world.add(CLAIMS, claim(finalizers=[FINALIZER_RELEASE_ADDRESS]))
    await world.kube.patch(CLAIMS, "m1", {"metadata": {"finalizers": None}}, NS)
    assert await world.kube.delete(CLAIMS, "m1", NS)
    if server == "replaced":
        await world.kube.create(CLAIMS, claim(), NS)  # same name, another uid
    await world.forget_requests()  # the cache still holds the old claim

    assert await world.claims.reconcile(NS, "m1") is None
    assert world.journal == ["get IPAddressClaim m1"], "the claim is confirmed from the API server first"
    assert world.backend.calls == [] and world.address("m1") is None


async def test_a_lagging_cache_hands_a_claim_being_deleted_to_the_release_path(world: World) -> None:
    world.add(POOLS, pool())
    world.add(CLAIMS, claim(finalizers=[FINALIZER_RELEASE_ADDRESS]))
    assert await world.kube.delete(CLAIMS, "m1", NS)  # another replica sees the deletion first

    assert await world.claims.reconcile(NS, "m1") == 0.0
    assert world.backend.calls == [] and world.address("m1") is None
    cached = world.ctx.caches.claims.get(NS, "m1")
    assert cached is not None and cached["metadata"]["deletionTimestamp"]
    assert await world.claims.reconcile(NS, "m1") is None
    assert [c.method for c in world.backend.calls] == ["release"]
    assert world.kube.stored(CLAIMS, "m1", NS) is None


async def test_an_ipaddress_the_cache_has_not_seen_yet_is_looked_at_again(world: World) -> None:
    world.add(POOLS, pool())
    world.add(CLAIMS, claim())
    world.kube.put(ADDRESSES, address("m1", "m1", ip="10.0.0.99"))  # created elsewhere; not in the cache yet

    assert await world.claims.reconcile(NS, "m1") == 0.0
    assert world.journal[-2:] == ["create IPAddress m1", "get IPAddress m1"]
    cached = world.ctx.caches.addresses.get(NS, "m1")
    assert cached is not None and cached["spec"]["address"] == "10.0.0.99"
    assert "status" not in world.claim("m1")

    assert await world.claims.reconcile(NS, "m1") is None
    ip = world.address("m1")
    assert ip is not None and ip["spec"]["address"] == "10.0.0.99", "the existing IPAddress is adopted"
    assert ready_state(world.claim("m1")) == ALLOCATED


async def test_a_stale_cached_claim_fails_with_a_conflict_and_the_cache_is_refreshed(world: World) -> None:
    world.add(POOLS, pool())
    world.add(CLAIMS, claim())
    changed = await world.kube.patch(CLAIMS, "m1", {"metadata": {"labels": {"changed": "yes"}}}, NS)

    with pytest.raises(ApiError) as raised:
        await world.claims.reconcile(NS, "m1")
    assert raised.value.conflict
    assert world.backend.calls == []
    assert world.ctx.caches.claims.get(NS, "m1") == changed, "read again, so that the retry works from fresh data"
    assert await world.claims.reconcile(NS, "m1") is None
    assert ready_state(world.claim("m1")) == ALLOCATED
