"""Repair passes racing ordinary churn: a claim released between a pass's holdings read and its live read is no
suspected leak worth an Event (only a second sighting in a row is reported), and a pool deleted during a pass gets
no more backend call from it (a call would bring back what the backend forgot of the pool)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.backend.contract import PoolRef
from ipam_provider.backend.repair import Holding, Pacer
from ipam_provider.common import Object
from ipam_provider.repair import RepairSettings
from tests.support.repair_world import RepairWorld, make_repair_world
from tests.support.world import NS, POOLS, address, claim, pool

SUSPECTED = "RepairSuspectedLeak"
Listing = Callable[[PoolRef, Object, Pacer], Awaitable[Sequence[Holding]]]


def held_claim(rw: RepairWorld, name: str = "c1", ip: str = "10.0.0.99") -> Holding:
    """A claim with its IPAddress, held by the backend for it: nothing to repair."""
    stored = rw.world.add(CLAIMS, claim(name, status={"addressRef": {"name": name}}))
    rw.world.add(ADDRESSES, address(name, name, ip=ip))
    return rw.backend.hold(rw.ref, ip, f"{NS}/{name}", stored["metadata"]["uid"])


def after_listing(rw: RepairWorld, then: Callable[[PoolRef], Awaitable[None]]) -> None:
    """Run `then(pool)` once, right after the backend's first listing of a pool (before the pass reads live)."""
    listing: Listing = rw.backend.list_holdings
    done: list[bool] = []

    async def list_then(pool_ref: PoolRef, raw: Object, pacer: Pacer) -> Sequence[Holding]:
        found = await listing(pool_ref, raw, pacer)
        if not done:
            done.append(True)
            await then(pool_ref)
        return found

    rw.backend.list_holdings = list_then  # type: ignore[method-assign, assignment]


async def gone(rw: RepairWorld, *objects: tuple[str, str]) -> None:
    """Delete the claims ("claim", name) and IPAddresses ("address", name) named, as their watch tells the caches."""
    for what, name in objects:
        await rw.world.kube.delete(CLAIMS if what == "claim" else ADDRESSES, name, NS)
    rw.world.sync()


async def test_a_claim_gone_between_the_two_reads_is_reported_only_when_the_next_pass_finds_it_again() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=60.0))
    held = held_claim(rw)
    after_listing(rw, lambda _: gone(rw, ("address", "c1"), ("claim", "c1")))  # the record stays: a real leak

    await rw.run_pass()
    assert len(rw.loop.pools.book) == 1, "a suspect"
    assert await rw.reasons() == [], "one sighting is not reported: it may be a release racing the pass"

    await rw.run_pass(advance=1.0)
    assert await rw.reasons() == [SUSPECTED], "still unaccounted for by the next pass: reported"
    assert held.handle in rw.backend.records, "the grace period is not over"
    await rw.run_pass(advance=1.0)
    assert await rw.reasons() == [SUSPECTED], "once"


async def test_a_release_racing_the_pass_gives_no_event_and_nothing_is_kept_of_it() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    held = held_claim(rw)

    async def released(_: PoolRef) -> None:
        del rw.backend.records[held.handle]  # the claim's release, done meanwhile
        await gone(rw, ("address", "c1"), ("claim", "c1"))

    after_listing(rw, released)
    for _ in range(3):
        await rw.run_pass(advance=1.0)
    assert await rw.reasons() == []
    assert len(rw.loop.pools.book) == 0
    assert [c.method for c in rw.backend.calls].count("release_holding") == 0


def calls_for(rw: RepairWorld, ref: PoolRef, since: int) -> list[str]:
    return [c.method for c in rw.backend.calls[since:] if c.pool_ref == ref]


async def test_a_pool_deleted_after_its_listing_gets_no_more_backend_call() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    rw.ghost()  # a suspect, so that the pass reads live and compares
    rw.world.add(CLAIMS, claim("lost", status={"addressRef": {"name": "lost"}}))
    rw.world.add(ADDRESSES, address("lost", "lost", ip="10.0.0.60"))  # unrecorded: a restore is due
    deleted_at: list[int] = []

    async def delete_pool(ref: PoolRef) -> None:
        await rw.world.kube.delete(POOLS, ref.name, NS)
        rw.world.sync()
        deleted_at.append(len(rw.backend.calls))

    after_listing(rw, delete_pool)
    await rw.run_pass()
    assert calls_for(rw, rw.ref, deleted_at[0]) == [], "no outside_pool, restore nor release for a deleted pool"
    assert rw.ref not in rw.loop.pools.findings and rw.ref not in rw.world.ctx.repair_conditions
    assert len(rw.loop.pools.book) == 0, "nothing kept of it"


async def test_a_pool_deleted_before_its_listing_is_not_listed() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    rw.world.add(POOLS, pool("other"))

    async def delete_the_other(listed: PoolRef) -> None:
        await rw.world.kube.delete(POOLS, "net" if listed.name == "other" else "other", NS)
        rw.world.sync()

    after_listing(rw, delete_the_other)
    await rw.run_pass()
    assert [c.method for c in rw.backend.calls].count("list_holdings") == 1, "the deleted pool was not listed"


async def test_a_pool_deleted_during_a_release_gets_neither_the_release_nor_the_rest() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    rw.ghost()
    await rw.run_pass()  # a suspect now
    get = rw.world.kube.get
    deleted_at: list[int] = []

    async def get_then_delete(resource: object, name: str, namespace: str | None = None) -> Object | None:
        found = await get(resource, name, namespace)  # type: ignore[arg-type]
        if name == "ghost" and not deleted_at:  # the release's fresh read: the pool goes meanwhile
            await rw.world.kube.delete(POOLS, "net", NS)
            rw.world.sync()
            deleted_at.append(len(rw.backend.calls))
        return found

    rw.world.kube.get = get_then_delete  # type: ignore[method-assign]
    await rw.run_pass(advance=1.0)
    assert deleted_at, "the release's fresh reads were made"
    assert calls_for(rw, rw.ref, deleted_at[0]) == []
    assert len(rw.backend.records) == 1, "the ghost stays for the backend's sweep of deleted pools"
