"""The repair loop when parts of a pass fail or the backend and the API server disagree in harder ways: one failed
restore or one pool that cannot be listed does not stop the others; an address named by two claims is a
duplicate even when the backend holds it for both; the condition is left alone by controllers sharded by a watch
filter; restores and releases are paced; outside-pool findings are keyed by canonical address."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ipam_provider.api.capi import ADDRESSES, ANNOTATION_PAUSED, CLAIMS, LABEL_WATCH_FILTER
from ipam_provider.backend.contract import Allocation, ClaimContext, PoolNotReadyError, PoolRef
from ipam_provider.backend.repair import Holding, Pacer, Restore
from ipam_provider.common import Object
from ipam_provider.repair import RepairSettings
from ipam_provider.repair.compare import Scope
from ipam_provider.watch import ClaimKey
from tests.ipam_provider.repair.test_pool_restore import forget_in_backend, fulfilled, recorded_condition
from tests.support.fake_backend import FAKE_POOL
from tests.support.repair_world import make_repair_world, passes, sample
from tests.support.world import NS, POOLS, address, claim, pool

DUPLICATES = "ipam_provider_repair_duplicates"
OUTSIDE = "ipam_provider_repair_outside_pool"


async def test_a_failed_restore_does_not_stop_the_others_and_keeps_its_duplicate() -> None:
    rw = make_repair_world()
    first = (await fulfilled(rw, "m1"))["spec"]["address"]
    second = (await fulfilled(rw, "m2"))["spec"]["address"]
    forget_in_backend(rw, first)
    rw.backend.foreign[first] = "an object outside Kubernetes"
    await rw.run_pass()
    assert sample(DUPLICATES) == 1

    forget_in_backend(rw, second)
    rw.backend.outside["10.0.0.99"] = "never named"  # outside_pool is still asked
    original = rw.backend.restore

    async def failing_for_m1(pool_ref: PoolRef, pool: Object, claim: ClaimContext, allocation: Allocation) -> Restore:
        if claim.name == "m1":
            raise PoolNotReadyError("the backend is down for this one")
        return await original(pool_ref, pool, claim, allocation)

    rw.backend.restore = failing_for_m1  # type: ignore[method-assign]
    for _ in range(2):
        await rw.run_pass(advance=1.0)

    assert second in rw.backend.addresses_held(rw.ref), "the other IPAddress was restored"
    assert sample(DUPLICATES) == 1, "the failed one keeps its duplicate finding"
    assert (await recorded_condition(rw) or ("",))[0] == "False"
    failed = [e for e in await rw.world.events() if e[1] == "RepairRestoreFailed"]
    assert failed == [("Warning", "RepairRestoreFailed", "IPAddressClaim", "m1")], "once per change"


async def test_an_unexpected_listing_error_of_one_pool_does_not_stop_the_others() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    rw.world.add(POOLS, pool("other"))
    other = FAKE_POOL.ref(NS, "other")
    ghost = rw.backend.hold(other, "10.0.0.50", f"{NS}/ghost", "uid-ghost")
    original = rw.backend.list_holdings

    async def broken_for_net(pool_ref: PoolRef, pool: Object, pacer: Pacer) -> Sequence[Holding]:
        if pool_ref.name == "net":
            raise RuntimeError("its Secret could not be read")
        return await original(pool_ref, pool, pacer)

    rw.backend.list_holdings = broken_for_net  # type: ignore[method-assign]
    errors_before = passes("error")
    await rw.run_pass()
    await rw.run_pass(advance=1.0)

    assert ghost.handle not in rw.backend.records, "the other pool's leak was released"
    assert passes("error") == errors_before + 2


async def test_an_address_named_by_two_claims_is_a_duplicate_even_when_held_for_both() -> None:
    rw = make_repair_world()
    ip = "10.0.0.42"
    for name, marks in (("m1", {}), ("m2", {ANNOTATION_PAUSED: ""})):
        live = rw.world.add(CLAIMS, claim(name, annotations=marks))
        rw.world.add(ADDRESSES, address(name, name, ip=ip))
        rw.backend.hold(rw.ref, ip, f"{NS}/{name}", live["metadata"]["uid"])

    await rw.run_pass()
    await rw.run_pass(advance=1.0)

    assert sample(DUPLICATES) == 2
    warnings = sorted(e for e in await rw.world.events() if e[1] == "DuplicateAddress")
    assert warnings == [
        ("Warning", "DuplicateAddress", "FakeIPPool", "net"),
        ("Warning", "DuplicateAddress", "IPAddressClaim", "m1"),
        ("Warning", "DuplicateAddress", "IPAddressClaim", "m2"),
    ], "on each claim and the pool, once"
    status, reason, message = await recorded_condition(rw) or ("", "", "")
    assert (status, reason) == ("False", "DuplicateAddress")
    assert f"IPAddress {NS}/m1" in message and f"claim {NS}/m2" in message
    assert [c for c in rw.backend.calls if c.method == "restore"] == []


async def test_a_claim_whose_holding_shares_an_address_of_another_claims_ipaddress_is_a_duplicate() -> None:
    rw = make_repair_world()
    ip = (await fulfilled(rw, "m1"))["spec"]["address"]
    late = rw.world.add(CLAIMS, claim("m2"))  # no IPAddress yet, but the backend gave it m1's address
    rw.backend.hold(rw.ref, ip, f"{NS}/m2", late["metadata"]["uid"])

    await rw.run_pass()

    assert sample(DUPLICATES) == 2
    claims = sorted(e[3] for e in await rw.world.events() if e[1] == "DuplicateAddress" and e[2] == "IPAddressClaim")
    assert claims == ["m1", "m2"]


async def test_with_a_watch_filter_the_condition_is_left_as_it_is() -> None:
    rw = make_repair_world(scope=Scope([NS], watch_filter="mine"))
    rw.world.add(CLAIMS, claim("m1", labels={LABEL_WATCH_FILTER: "mine"}))
    rw.world.add(ADDRESSES, address("m1", "m1", ip="10.0.0.42"))
    rw.backend.foreign["10.0.0.42"] = "an object outside Kubernetes"

    await rw.run_pass()

    assert sample(DUPLICATES) == 1, "still found and counted"
    assert rw.ref not in rw.world.ctx.repair_conditions
    assert await recorded_condition(rw) is None


async def test_restores_releases_and_their_reads_wait_for_the_pacer() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    ip = (await fulfilled(rw, "m1"))["spec"]["address"]
    rw.ghost()
    await rw.run_pass()  # the ghost is a suspect now
    forget_in_backend(rw, ip)
    await rw.world.forget_requests()

    await rw.run_pass(advance=1.0)

    journal = rw.world.journal
    paced = [i for i, entry in enumerate(journal) if entry.startswith(("get ", "backend restore", "backend release"))]
    assert len(paced) == 2 + 1 + 2 + 1, journal
    assert all(journal[i - 1] == "pacer wait" for i in paced), journal


async def test_outside_findings_are_keyed_by_canonical_address_and_kept_while_skipped() -> None:
    rw = make_repair_world()
    raw_ip, ip = "2001:DB8::0001", "2001:db8::1"
    rw.world.add(CLAIMS, claim("m1"))
    rw.world.add(ADDRESSES, address("m1", "m1", ip=raw_ip))
    rw.backend.outside[raw_ip] = "excluded"

    async def answers_canonical(pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> Mapping[str, str]:
        return {a: "excluded" for a in addresses if a == ip}

    rw.backend.outside_pool = answers_canonical  # type: ignore[method-assign]
    await rw.run_pass()
    assert sample(OUTSIDE) == 1, "one address, counted once"

    rw.backend.outside_pool = _answers_nothing  # type: ignore[method-assign]
    rw.busy.add(ClaimKey(NS, "m1"))
    await rw.run_pass(advance=1.0)
    assert sample(OUTSIDE) == 1, "a restore skipped this pass keeps what the last one found"


async def _answers_nothing(pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> Mapping[str, str]:
    return {}
