"""A repair pass yields to new work (docs/performance.md, "one more pool"): its loops over pools give the event loop's
other tasks their turn, and the pools whose `AddressesRecorded` condition it changed reach the pool reconciler a
few at a time, the next ones only once the cache shows the last ones written, so that whatever is queued meanwhile
waits behind a few of them at most."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from ipam_provider.backend.contract import PoolRef
from ipam_provider.repair import loop as repair_loop
from ipam_provider.repair.loop import HAND_OVER_AT_ONCE
from ipam_provider.repair.pacer import Turns
from tests.support.repair_world import RepairWorld, make_repair_world
from tests.support.world import POOLS, pool

POOL_COUNT = 3 * HAND_OVER_AT_ONCE + 2  # four slices, the last one short


def many_pools(count: int = POOL_COUNT) -> RepairWorld:
    rw = make_repair_world()
    for index in range(1, count):
        rw.world.add(POOLS, pool(f"net-{index}"))
    return rw


async def until(check: Callable[[], bool], what: str) -> None:
    """Give the other tasks turns until `check()` holds (a bound on turns, not on time)."""
    for _ in range(100_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never: {what}")


def at_least(items: list[PoolRef], count: int) -> Callable[[], bool]:
    return lambda: len(items) >= count


async def test_a_pass_over_many_pools_gives_other_tasks_their_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repair_loop, "HAND_OVER_WAIT", 0.0)  # nothing writes the conditions here: no waiting for it
    rw = many_pools()
    rw.loop.pools.turns = Turns(0.0)  # a turn at every pool, however fast the machine
    ticks = 0
    passing = asyncio.create_task(rw.run_pass())

    while not passing.done():
        ticks += 1
        await asyncio.sleep(0)
    await passing

    # two loops over the pools (the look at the caches, then the repairs) each give a turn per pool
    assert ticks >= 2 * POOL_COUNT
    assert rw.loop.pools.turns.given >= 2 * POOL_COUNT


async def test_changed_conditions_are_handed_over_a_slice_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repair_loop, "HAND_OVER_WAIT", 3600.0)  # only the written status lets the next slice go
    rw = many_pools()
    passing = asyncio.create_task(rw.run_pass())
    handed = rw.world.pool_changes

    for slice_end in (HAND_OVER_AT_ONCE, 2 * HAND_OVER_AT_ONCE, 3 * HAND_OVER_AT_ONCE):
        await until(at_least(handed, slice_end), f"{slice_end} pools handed over")
        for _ in range(50):
            await asyncio.sleep(0)
        assert len(handed) == slice_end, "the next slice waits for this one's status"
        assert not passing.done()
        for ref in handed[slice_end - HAND_OVER_AT_ONCE :]:
            await rw.world.pools.reconcile(ref)  # the pool reconciler writes the condition into the cache

    await until(passing.done, "the pass to end")
    await passing
    assert len(handed) == POOL_COUNT
    assert len(set(handed)) == POOL_COUNT
    assert rw.loop.pools.changed == {}


async def test_a_pass_with_one_slice_or_less_waits_for_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repair_loop, "HAND_OVER_WAIT", 3600.0)
    rw = many_pools(HAND_OVER_AT_ONCE)

    await asyncio.wait_for(rw.run_pass(), timeout=60)

    assert len(rw.world.pool_changes) == HAND_OVER_AT_ONCE
    await rw.run_pass()
    assert len(rw.world.pool_changes) == HAND_OVER_AT_ONCE, "an unchanged condition is not handed over again"


async def test_a_slice_never_seen_written_lets_the_rest_go_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repair_loop, "HAND_OVER_WAIT", 0.05)  # nothing writes the conditions: each wait runs out
    rw = many_pools()
    waits: list[bool] = []
    written = repair_loop.RepairLoop._written

    async def counted(loop: repair_loop.RepairLoop, handed: list[tuple[PoolRef, object]]) -> bool:
        waits.append(await written(loop, handed))  # type: ignore[arg-type]
        return waits[-1]

    monkeypatch.setattr(repair_loop.RepairLoop, "_written", counted)
    await rw.run_pass()

    assert waits == [True, False]  # nothing to wait for before the first slice; the second waits once, in vain
    assert len(rw.world.pool_changes) == POOL_COUNT
    assert rw.loop.pools.changed == {}


async def test_a_pass_cancelled_in_its_hand_over_keeps_the_rest_for_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repair_loop, "HAND_OVER_WAIT", 3600.0)
    rw = many_pools()
    passing = asyncio.create_task(rw.run_pass())
    await until(at_least(rw.world.pool_changes, HAND_OVER_AT_ONCE), "the first slice handed over")
    passing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await passing

    assert len(rw.loop.pools.changed) == POOL_COUNT - HAND_OVER_AT_ONCE
    assert not set(rw.loop.pools.changed) & set(rw.world.pool_changes)
