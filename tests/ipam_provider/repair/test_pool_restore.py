"""The repair loop's other half against the fake world: a live IPAddress whose address the backend no longer holds
is recorded again, or reported as a duplicate (Events, the pool's AddressesRecorded condition, a gauge) when
something else holds it; addresses outside the pool are reported once per change."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ipam_provider.api.capi import ADDRESSES, ANNOTATION_PAUSED, CLAIMS, CLUSTERS, LABEL_WATCH_FILTER
from ipam_provider.backend.contract import PoolRef
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.repair.compare import Scope
from ipam_provider.repair.pool import RECORDED_MESSAGE
from ipam_provider.runtime.kube.resources import EVENTS
from ipam_provider.watch import ClaimKey
from tests.support.fake_backend import GLOBAL_FAKE_POOL
from tests.support.repair_world import RepairWorld, make_repair_world, sample
from tests.support.world import NS, POOLS, Object, address, claim, cluster, pool

RESTORED = "ipam_provider_repair_restored_total"
DUPLICATES = "ipam_provider_repair_duplicates"
OUTSIDE = "ipam_provider_repair_outside_pool"


async def fulfilled(rw: RepairWorld, name: str) -> Object:
    """A claim the controller fulfilled; answers its IPAddress."""
    rw.world.add(CLAIMS, claim(name))
    await rw.world.claims.reconcile(NS, name)
    rw.world.sync()
    found = rw.world.address(name)
    assert found is not None
    return found


def forget_in_backend(rw: RepairWorld, address_text: str) -> None:
    """The backend's record of the address is deleted behind the controller's back."""
    rw.backend.records = {h: r for h, r in rw.backend.records.items() if r.address != address_text}


async def recorded_condition(rw: RepairWorld) -> tuple[str, str, str] | None:
    """The pool's AddressesRecorded condition, once the pool reconciler wrote it."""
    await rw.world.pools.reconcile(rw.ref)
    stored = rw.world.kube.stored(POOLS, "net", NS)
    assert stored is not None
    for condition in (stored.get("status") or {}).get("conditions") or []:
        if condition["type"] == "AddressesRecorded":
            return condition["status"], condition["reason"], condition["message"]
    return None


async def test_an_address_deleted_in_the_backend_is_recorded_again_for_its_claim() -> None:
    rw = make_repair_world()
    ip = (await fulfilled(rw, "m1"))["spec"]["address"]
    forget_in_backend(rw, ip)
    restored_before = sample(RESTORED)
    await rw.world.forget_requests()

    await rw.run_pass()

    (holding,) = rw.backend.holdings(rw.ref)
    assert (holding.address, holding.claim, holding.claim_uid) == (
        ip,
        f"{NS}/m1",
        rw.world.claim("m1")["metadata"]["uid"],
    )
    assert sample(RESTORED) == restored_before + 1
    events = await rw.world.events()
    assert ("Normal", "RepairRestoredAllocation", "IPAddressClaim", "m1") in events
    assert ("Normal", "RepairRestoredAllocation", "FakeIPPool", "net") in events
    assert await recorded_condition(rw) == ("True", "Recorded", RECORDED_MESSAGE)
    assert rw.ref in rw.world.pool_changes, "the pool is looked at again to write the condition"

    await rw.run_pass(advance=1.0)
    assert [c.method for c in rw.backend.calls].count("restore") == 1, "held now: nothing more to restore"


async def test_an_address_someone_else_took_is_a_duplicate_never_handed_out_again() -> None:
    rw = make_repair_world()
    ip = (await fulfilled(rw, "m1"))["spec"]["address"]
    forget_in_backend(rw, ip)
    rw.backend.foreign[ip] = "an object outside Kubernetes (id 12)"

    await rw.run_pass()
    await rw.run_pass(advance=1.0)

    assert rw.backend.holdings(rw.ref) == [], "nothing recorded, nothing taken"
    assert sample(DUPLICATES) == 1
    warnings = [e for e in await rw.world.events() if e[1] == "DuplicateAddress"]
    assert warnings == [
        ("Warning", "DuplicateAddress", "IPAddressClaim", "m1"),
        ("Warning", "DuplicateAddress", "FakeIPPool", "net"),
    ], "once per change, on the claim and on the pool"
    status, reason, message = await recorded_condition(rw) or ("", "", "")
    assert (status, reason) == ("False", "DuplicateAddress")
    assert f"IPAddress {NS}/m1" in message and "an object outside Kubernetes (id 12)" in message and ip in message

    del rw.backend.foreign[ip]  # the other holder let it go
    await rw.run_pass(advance=1.0)
    assert sample(DUPLICATES) == 0
    assert [h.address for h in rw.backend.holdings(rw.ref)] == [ip]
    assert (await recorded_condition(rw) or ("",))[0] == "True"


async def test_a_duplicate_held_by_another_claims_record() -> None:
    rw = make_repair_world()
    ip = (await fulfilled(rw, "m1"))["spec"]["address"]
    forget_in_backend(rw, ip)
    other = rw.world.add(CLAIMS, claim("m2"))
    rw.world.add(ADDRESSES, address("m2", "m2", ip="10.0.0.77"))
    rw.backend.hold(rw.ref, "10.0.0.77", f"{NS}/m2", other["metadata"]["uid"])
    rw.backend.hold(rw.ref, ip, f"{NS}/m2", other["metadata"]["uid"])  # a stray record of m2 holds m1's address

    await rw.run_pass()

    assert sample(DUPLICATES) == 1
    _, reason, message = await recorded_condition(rw) or ("", "", "")
    assert reason == "DuplicateAddress" and f"claim {NS}/m2" in message


async def test_outside_answers_are_reported_once_per_change() -> None:
    rw = make_repair_world()
    ip = (await fulfilled(rw, "m1"))["spec"]["address"]
    rw.backend.outside[ip] = "beyond the pool's end (10.0.0.5)"

    await rw.run_pass()
    await rw.run_pass(advance=1.0)
    assert sample(OUTSIDE) == 1
    outside = [e for e in await rw.world.events() if e[1] == "AddressOutsidePool"]
    assert outside == [("Warning", "AddressOutsidePool", "FakeIPPool", "net")]

    await fulfilled(rw, "m2")
    rw.backend.outside["10.0.0.11"] = "beyond the pool's end (10.0.0.5)"
    await rw.run_pass(advance=1.0)
    assert sample(OUTSIDE) == 2
    assert len([e for e in await rw.world.events() if e[1] == "AddressOutsidePool"]) == 2, "the set changed"

    rw.backend.outside.clear()
    await rw.run_pass(advance=1.0)
    assert sample(OUTSIDE) == 0


async def test_a_restore_that_finds_the_address_outside_the_pool_counts_it_outside() -> None:
    rw = make_repair_world()
    ip = (await fulfilled(rw, "m1"))["spec"]["address"]
    forget_in_backend(rw, ip)
    rw.backend.outside[ip] = "excluded"
    rw.backend.outside_pool = _answers_nothing  # type: ignore[method-assign]

    await rw.run_pass()
    assert sample(OUTSIDE) == 1
    assert rw.backend.holdings(rw.ref) == []


async def _answers_nothing(pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> Mapping[str, str]:
    return {}


async def test_claims_that_are_busy_paused_unserved_or_another_are_not_restored() -> None:
    """Not restored: a claim in the work queue (until it leaves it), a paused claim, a claim of a paused Cluster, a
    claim of another controller's watch filter, and an IPAddress owned by an older claim of the same name."""
    rw = make_repair_world(scope=Scope([NS], watch_filter="mine"))
    mine = {LABEL_WATCH_FILTER: "mine"}
    rw.world.add(CLAIMS, claim("busy", labels=mine))
    rw.world.add(CLAIMS, claim("paused", labels=mine, annotations={ANNOTATION_PAUSED: ""}))
    rw.world.add(CLAIMS, claim("unserved", labels={LABEL_WATCH_FILTER: "theirs"}))
    rw.world.add(CLAIMS, claim("replaced", labels=mine))
    rw.world.add(CLUSTERS, cluster("c1", paused=True))
    rw.world.add(CLAIMS, claim("cluster-paused", cluster="c1", labels=mine))
    for number, name in enumerate(["busy", "paused", "unserved", "cluster-paused"]):
        rw.world.add(ADDRESSES, address(name, name, ip=f"10.0.0.{30 + number}"))
    owner = {"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim", "name": "replaced"}
    rw.world.add(
        ADDRESSES,
        address("replaced", "replaced", ip="10.0.0.40", ownerReferences=[{**owner, "uid": "an-older-claim"}]),
    )
    rw.busy.add(ClaimKey(NS, "busy"))

    await rw.run_pass()
    assert [c for c in rw.backend.calls if c.method == "restore"] == []

    rw.busy.clear()
    await rw.run_pass(advance=1.0)
    assert [c.claim.name for c in rw.backend.calls if c.method == "restore" and c.claim] == ["busy"]


def event_messages(rw: RepairWorld, kind: str, namespace: str | None = None) -> list[str]:
    """The messages of the Events about objects of `kind` (in `namespace`, or any)."""
    events = rw.world.kube.stored_all(EVENTS, namespace)
    return [str(event["message"]) for event in events if event["involvedObject"]["kind"] == kind]


async def test_a_shared_pools_claims_are_not_told_other_namespaces_holders() -> None:
    """Claims of team-a and team-b name one address of a Global pool: each claim's Event counts the claim of the
    other namespace without naming it; the pool's names both; a taken restore does not name the holder."""
    rw = make_repair_world(scope=Scope())
    rw.world.add(pool_resource(GLOBAL_FAKE_POOL), pool("shared", kind=GLOBAL_FAKE_POOL))
    for namespace in ("team-a", "team-b"):
        made = rw.world.add(CLAIMS, claim("m1", "shared", kind=GLOBAL_FAKE_POOL, namespace=namespace))
        rw.world.add(ADDRESSES, address("m1", "m1", "shared", "10.0.0.70", kind=GLOBAL_FAKE_POOL, namespace=namespace))
        rw.backend.hold(GLOBAL_FAKE_POOL.ref(None, "shared"), "10.0.0.70", f"{namespace}/m1", made["metadata"]["uid"])
    rw.world.add(CLAIMS, claim("m2", "shared", kind=GLOBAL_FAKE_POOL, namespace="team-a"))
    rw.world.add(ADDRESSES, address("m2", "m2", "shared", "10.0.0.71", kind=GLOBAL_FAKE_POOL, namespace="team-a"))
    rw.backend.foreign["10.0.0.71"] = "claim team-b/hidden"

    await rw.run_pass()
    await rw.world.ctx.recorder.flush()

    for namespace, other in (("team-a", "team-b"), ("team-b", "team-a")):
        messages = event_messages(rw, "IPAddressClaim", namespace)
        assert messages and all(other not in message for message in messages), messages
        assert any("1 of another namespace" in message for message in messages), messages
    pool_messages = event_messages(rw, GLOBAL_FAKE_POOL.kind)
    assert any("team-a/m1" in m and "team-b/m1" in m for m in pool_messages), pool_messages
    assert any("claim team-b/hidden" in m for m in pool_messages), pool_messages
