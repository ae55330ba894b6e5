"""The repair loop's leak rules against the fake world: a holding no live IPAddress or claim accounts for is
released only after two consecutive passes spanning the grace period, never in report-only mode, never while its
claim is in the work queue, never while its claim is being allocated, and never outside the watched namespaces."""

from __future__ import annotations

import pytest
import structlog
from prometheus_client import REGISTRY

from ipam_provider.api.capi import ADDRESSES, CLAIMS, FINALIZER_PROTECT_ADDRESS, LABEL_WATCH_FILTER
from ipam_provider.backend.contract import PoolNotReadyError, PoolRef
from ipam_provider.backend.repair import Holding
from ipam_provider.common import Object
from ipam_provider.repair import RepairSettings
from ipam_provider.repair.compare import Scope
from ipam_provider.runtime.kube.resources import Resource
from ipam_provider.watch import ClaimKey
from tests.support.repair_world import BACKEND, make_repair_world, passes, sample
from tests.support.world import NS, address, claim

RELEASES = "ipam_provider_repair_releases_total"
SUSPECTED = "ipam_provider_repair_suspected_leaks"


async def test_a_leak_is_released_after_two_passes_spanning_the_grace_period() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=10.0))
    ghost = rw.ghost()
    released_before = sample(RELEASES)

    await rw.run_pass()
    assert ghost.handle in rw.backend.records, "one sighting is not enough"
    assert sample(SUSPECTED) == 1
    assert await rw.reasons() == [], "nor to report it: it may be a release racing the pass"

    await rw.run_pass(advance=5.0)
    assert ghost.handle in rw.backend.records, "two passes, but the first only 5 s ago (grace 10 s)"
    assert await rw.reasons() == ["RepairSuspectedLeak"], "reported on its second sighting"

    await rw.run_pass(advance=5.0)
    assert ghost.handle not in rw.backend.records
    assert sample(RELEASES) == released_before + 1
    assert sample(SUSPECTED) == 0
    assert await rw.reasons() == ["RepairSuspectedLeak", "RepairReleasedLeak"]
    assert [c.method for c in rw.backend.calls].count("release_holding") == 1


async def test_the_grace_period_alone_is_not_enough_two_passes_are() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    ghost = rw.ghost()

    await rw.run_pass(advance=100.0)
    assert ghost.handle in rw.backend.records

    await rw.run_pass(advance=1.0)
    assert ghost.handle not in rw.backend.records


async def test_a_suspect_found_accounted_for_starts_afresh() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    ghost = rw.ghost()
    await rw.run_pass()
    rw.busy.add(ClaimKey(NS, "ghost"))  # one pass where it is not a suspect: its claim is being reconciled
    await rw.run_pass(advance=1.0)
    rw.busy.clear()

    await rw.run_pass(advance=1.0)
    assert ghost.handle in rw.backend.records, "only consecutive sightings count"
    await rw.run_pass(advance=1.0)
    assert ghost.handle not in rw.backend.records


async def test_report_only_never_releases() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0, report_only=True))
    ghost = rw.ghost()
    for _ in range(4):
        await rw.run_pass(advance=100.0)

    assert ghost.handle in rw.backend.records
    assert sample(SUSPECTED) == 1
    assert await rw.reasons() == ["RepairSuspectedLeak"], "reported once"
    assert rw.backend.sweeps == [], "no orphan sweep either"


async def test_the_orphan_sweep_runs_once_per_pass_when_releasing() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=42.0))
    await rw.run_pass()
    await rw.run_pass()
    assert rw.backend.sweeps == [42.0, 42.0]


async def test_a_claim_in_the_work_queue_is_left_to_its_reconcile() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    ghost = rw.ghost()
    rw.busy.add(ClaimKey(NS, "ghost"))
    for _ in range(3):
        await rw.run_pass(advance=10.0)
    assert ghost.handle in rw.backend.records
    assert await rw.reasons() == []


async def test_a_claim_being_allocated_is_never_a_leak() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    live = rw.world.add(CLAIMS, claim("m1"))  # no IPAddress yet: its allocation is under way
    holding = rw.backend.hold(rw.ref, "10.0.0.60", f"{NS}/m1", live["metadata"]["uid"])
    for _ in range(3):
        await rw.run_pass(advance=10.0)
    assert holding.handle in rw.backend.records
    assert await rw.reasons() == []


async def test_a_claim_whose_ipaddress_names_another_address_leaks_the_other_one() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    rw.world.add(CLAIMS, claim("m1"))
    await rw.world.claims.reconcile(NS, "m1")  # holds 10.0.0.10, IPAddress m1 names it
    rw.world.sync()
    uid = rw.world.claim("m1")["metadata"]["uid"]
    stray = rw.backend.hold(rw.ref, "10.0.0.61", f"{NS}/m1", uid)

    await rw.run_pass()
    await rw.run_pass(advance=1.0)

    assert stray.handle not in rw.backend.records
    assert rw.backend.addresses_held(rw.ref) == ["10.0.0.10"], "the claim's own address stays held"


async def test_a_claim_that_comes_back_before_the_release_keeps_its_address() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    ghost = rw.ghost(uid="uid-late")
    await rw.run_pass()
    # Between the second pass's lists and its release, the claim and its IPAddress appear: the fresh GETs see them.
    original = rw.loop.pools._still_unaccounted

    async def late_arrival(ref: PoolRef, holding: Holding) -> bool:
        rw.world.kube.put(CLAIMS, claim("ghost", uid="uid-late"))
        rw.world.kube.put(ADDRESSES, address("ghost", "ghost", ip="10.0.0.50"))
        return await original(ref, holding)

    rw.loop.pools._still_unaccounted = late_arrival  # type: ignore[method-assign]
    await rw.run_pass(advance=1.0)
    assert ghost.handle in rw.backend.records
    assert [c.method for c in rw.backend.calls].count("release_holding") == 0


async def test_holdings_of_unwatched_namespaces_and_unserved_claims_are_left_alone() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0), Scope([NS], watch_filter="mine"))
    elsewhere = rw.ghost(claim="other/ghost")
    unserved = rw.world.add(CLAIMS, claim("theirs", labels={LABEL_WATCH_FILTER: "theirs"}))
    rw.world.add(ADDRESSES, address("theirs", "theirs", ip="10.0.0.70"))
    theirs = rw.backend.hold(rw.ref, "10.0.0.71", f"{NS}/theirs", unserved["metadata"]["uid"])
    nameless = rw.backend.hold(rw.ref, "10.0.0.72", "", "uid-nameless")
    for _ in range(3):
        await rw.run_pass(advance=10.0)
    assert {elsewhere.handle, theirs.handle, nameless.handle} <= set(rw.backend.records)
    assert await rw.reasons() == []


async def test_a_backend_error_skips_the_pool_and_the_loop_goes_on() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    ghost = rw.ghost()
    failed_before = passes("backend_error")
    rw.backend.fail("list_holdings", PoolNotReadyError("NetBox is down"))
    await rw.run_pass()
    assert passes("backend_error") == failed_before + 1

    rw.backend.fail("list_holdings", None)
    ok_before = passes("ok")
    await rw.run_pass(advance=1.0)
    await rw.run_pass(advance=1.0)
    assert ghost.handle not in rw.backend.records
    assert passes("ok") == ok_before + 2


async def test_an_unexpected_error_is_logged_and_the_next_pass_works() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    ghost = rw.ghost()
    errors_before = passes("error")
    rw.backend.fail("list_holdings", RuntimeError("a bug"))
    await rw.run_pass()  # does not raise
    assert passes("error") == errors_before + 1

    rw.backend.fail("list_holdings", None)
    await rw.run_pass(advance=1.0)
    await rw.run_pass(advance=1.0)
    assert ghost.handle not in rw.backend.records


async def test_every_listing_request_waits_for_the_pacer_first() -> None:
    rw = make_repair_world()
    for number in range(5):  # three pages of two
        rw.ghost(address=f"10.0.0.{80 + number}", claim=f"{NS}/g{number}", uid=f"uid-g{number}")
    await rw.world.forget_requests()

    await rw.run_pass()

    pages = [i for i, entry in enumerate(rw.world.journal) if entry.startswith(("backend page", "list "))]
    assert len(pages) == 3 + 2, "three backend pages, one page each of IPAddresses and claims"
    assert all(rw.world.journal[i - 1] == "pacer wait" for i in pages), rw.world.journal
    assert rw.pacer.waits == len(pages)


async def test_a_deleted_ipaddress_whose_claim_is_gone_loses_our_finalizer() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    gone = address(
        "forced",
        "forced",
        ip="10.0.0.90",
        finalizers=[FINALIZER_PROTECT_ADDRESS, "example.com/other"],
        deletionTimestamp="2026-01-01T00:00:00Z",
    )
    rw.world.add(ADDRESSES, gone)
    holding = rw.backend.hold(rw.ref, "10.0.0.90", f"{NS}/forced", "uid-forced")

    await rw.run_pass()
    stored = rw.world.address("forced")
    assert stored is not None and stored["metadata"]["finalizers"] == ["example.com/other"]
    assert holding.handle in rw.backend.records, "its IPAddress still exists: the address stays held"


async def test_a_pool_that_goes_loses_its_suspects_condition_and_series() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    ghost = rw.ghost()
    await rw.run_pass()
    labels = {"backend": BACKEND, "kind": "FakeIPPool", "namespace": NS, "name": "net"}
    assert REGISTRY.get_sample_value(SUSPECTED, labels) == 1
    assert rw.ref in rw.world.ctx.repair_conditions

    rw.world.kube._objects.clear()  # the pool (and everything else) is gone
    rw.world.sync()
    await rw.run_pass(advance=1.0)

    assert REGISTRY.get_sample_value(SUSPECTED, labels) is None
    assert rw.ref not in rw.world.ctx.repair_conditions
    assert len(rw.loop.pools.book) == 0
    assert ghost.handle in rw.backend.records, "a gone pool's holdings are the orphan sweep's, not the pool pass's"


async def test_a_holding_whose_claim_has_an_ipaddress_of_another_pool_at_its_address_is_accounted_for() -> None:
    # Two pools over the same source: pool "net" lists a holding recorded for claim m1 under an older uid (a
    # re-key pending after a move or restore), while m1's live IPAddress names pool "other" at that address.
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    rw.world.add(CLAIMS, claim("m1", "other"))
    rw.world.add(ADDRESSES, address("m1", "m1", "other", "10.0.0.70"))
    holding = rw.backend.hold(rw.ref, "10.0.0.70", f"{NS}/m1", "uid-before-the-move")

    for _ in range(3):
        await rw.run_pass(advance=10.0)

    assert holding.handle in rw.backend.records, "the other pool's live address is never released"
    assert sample(SUSPECTED) == 0
    assert "RepairSuspectedLeak" not in await rw.reasons()


async def test_the_fresh_check_before_a_release_accepts_an_ipaddress_of_another_pool_at_the_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The comparison found the holding unaccounted for; by the fresh GETs just before its release, its claim was
    # moved and its IPAddress names pool "other" at the holding's address (the claim's uid still differs).
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    ghost = rw.ghost(address="10.0.0.71", claim=f"{NS}/m1", uid="uid-before-the-move")
    await rw.run_pass()
    real_get = rw.world.kube.get

    async def moved_meanwhile(resource: Resource, name: str, namespace: str | None = None) -> Object | None:
        if resource == CLAIMS and name == "m1" and rw.world.address("m1") is None:
            rw.world.add(CLAIMS, claim("m1", "other"))
            rw.world.add(ADDRESSES, address("m1", "m1", "other", "10.0.0.71"))
        return await real_get(resource, name, namespace)

    monkeypatch.setattr(rw.world.kube, "get", moved_meanwhile)
    await rw.run_pass(advance=1.0)

    assert ghost.handle in rw.backend.records, "accounted for by the fresh read: never released"
    assert "RepairReleasedLeak" not in await rw.reasons()


async def test_a_namespaced_pools_record_of_another_namespaces_claim_is_never_followed() -> None:
    """A namespaced pool's backend is the tenant's choice (a NetBox it may control): a record naming a claim of
    another namespace (victim/x) is counted, never looked up there nor reported by name, never released."""
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0), Scope([NS, "victim"]))
    rw.world.add(CLAIMS, claim("x", namespace="victim"))
    forged = rw.ghost(address="10.0.0.60", claim="victim/x", uid="uid-forged")
    with structlog.testing.capture_logs() as logs:
        for advance in (0.0, 1.0, 1.0):
            await rw.run_pass(advance=advance)
    assert forged.handle in rw.backend.records, "never released"
    assert await rw.reasons() == [] and await rw.world.events("victim") == []
    looked_up = [request for request in rw.world.kube.requests if request.namespace == "victim"]
    assert [r for r in looked_up if r.verb == "get"] == [], looked_up
    (counted,) = [entry for entry in logs if "other namespaces" in entry["event"]]
    assert counted["count"] == 1 and "victim" not in str(counted)
