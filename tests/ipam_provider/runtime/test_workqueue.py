"""The work queue's contract: dedup, shard limits, parallel shards, tenants, priorities, backoff, delays, shutdown."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Hashable

from ipam_provider.runtime.workqueue import Priority, Tenants, WorkQueue


async def drain(queue: WorkQueue[str], count: int) -> list[tuple[str, Hashable]]:
    taken = []
    for _ in range(count):
        item = await asyncio.wait_for(queue.get(), 1)
        assert item is not None
        taken.append(item)
        queue.done(*item)
    return taken


async def test_a_key_waits_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        queue.add("a", "pool-1")
    queue.add("b", "pool-1")
    assert len(queue) == 2
    assert [key for key, _ in await drain(queue, 2)] == ["a", "b"]
    assert len(queue) == 0


async def test_one_key_per_shard_at_a_time_and_shards_in_parallel() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for key, shard in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")]:
        queue.add(key, shard)
    first = await asyncio.wait_for(queue.get(), 1)
    second = await asyncio.wait_for(queue.get(), 1)
    assert first is not None and second is not None
    assert {first[1], second[1]} == {"A", "B"}, "two shards are handed out at once"
    third = asyncio.create_task(queue.get())
    await asyncio.sleep(0.05)
    assert not third.done(), "a shard with a key in progress hands out nothing else"
    queue.done(*first)
    item = await asyncio.wait_for(third, 1)
    assert item is not None and item[1] == first[1]


async def test_a_key_readded_while_processing_runs_again_afterwards_never_concurrently() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a", "A")
    item = await queue.get()
    assert item == ("a", "A")
    queue.add("a", "B")  # even under another shard it must not run twice at once
    waiting = asyncio.create_task(queue.get())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    queue.done("a", "A")
    again = await asyncio.wait_for(waiting, 1)
    assert again is not None and again[0] == "a"


async def test_round_robin_between_shards() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for index in range(3):
        queue.add(f"a{index}", "A")
    queue.add("b0", "B")
    order = [key for key, _ in await drain(queue, 4)]
    assert order.index("b0") <= 1, f"a busy shard must not starve another: {order}"


async def test_rate_limited_backoff_grows_and_forget_resets() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.04)
    delays = [queue.add_rate_limited("k") for _ in range(4)]
    assert delays == [0.01, 0.02, 0.04, 0.04]
    queue.forget("k")
    assert queue.failures("k") == 0
    assert queue.add_rate_limited("k") == 0.01


async def test_add_after_fires_once_and_the_earliest_delay_wins() -> None:
    queue: WorkQueue[str] = WorkQueue()
    # Delays far apart, so that a loaded machine cannot make a later timer look like the earliest.
    queue.add_after("k", 30)
    queue.add_after("k", 0.05)
    queue.add_after("k", 20)
    item = await asyncio.wait_for(queue.get(), 10)
    assert item is not None
    queue.done(*item)
    queue.add_after("j", 0.3)
    queue.add_after("j", 0.05)
    item = await asyncio.wait_for(queue.get(), 10)
    assert item is not None
    queue.done(*item)
    await asyncio.sleep(0.35)
    assert len(queue) == 0, "superseded timers must not fire"


async def test_shutdown_releases_waiting_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    waiting = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    queue.shutdown()
    assert await asyncio.wait_for(waiting, 1) is None
    queue.add("late")
    assert len(queue) == 0


def take_ready(queue: WorkQueue[str]) -> list[tuple[str, Hashable]]:
    """Every key `get` hands out without waiting (none of them marked done)."""
    taken: list[tuple[str, Hashable]] = []
    while True:
        item = queue._take()
        if item is None:
            return taken
        taken.append(item)


async def test_without_a_shard_limit_keys_of_one_shard_run_at_once_but_each_key_once() -> None:
    queue: WorkQueue[str] = WorkQueue(shard_limit=None)
    for index in range(5):
        queue.add(f"a{index}", "A")
    taken = take_ready(queue)
    assert [key for key, _ in taken] == ["a0", "a1", "a2", "a3", "a4"], "in the order added, all at once"
    queue.add("a0", "A")  # being processed: it must wait until its worker is done
    assert take_ready(queue) == []
    queue.done("a0", "A")
    assert take_ready(queue) == [("a0", "A")]


async def test_a_shard_limit_caps_the_keys_of_a_shard_in_process() -> None:
    queue: WorkQueue[str] = WorkQueue(shard_limit=2)
    for index in range(4):
        queue.add(f"a{index}", "A")
    queue.add("b0", "B")
    assert sorted(key for key, _ in take_ready(queue)) == ["a0", "a1", "b0"]
    queue.done("a1", "A")
    assert take_ready(queue) == [("a2", "A")]


async def test_shards_take_turns_without_a_limit() -> None:
    queue: WorkQueue[str] = WorkQueue(shard_limit=None)
    for index in range(3):
        queue.add(f"a{index}", "A")
    queue.add("b0", "B")
    order = [key for key, _ in take_ready(queue)]
    assert order == ["a0", "b0", "a1", "a2"], "one busy shard must not starve another"


async def test_low_priority_keys_wait_behind_normal_ones_of_every_shard() -> None:
    queue: WorkQueue[str] = WorkQueue(shard_limit=None)
    for index in range(3):
        queue.add(f"listed{index}", "A", Priority.LOW)
    queue.add("new", "B")
    queue.add("changed", "A")
    order = [key for key, _ in take_ready(queue)]
    assert order == ["new", "changed", "listed0", "listed1", "listed2"]


async def test_adding_at_normal_priority_raises_a_waiting_low_key_once() -> None:
    queue: WorkQueue[str] = WorkQueue(shard_limit=None)
    queue.add("x", "A", Priority.LOW)
    queue.add("y", "A", Priority.LOW)
    queue.add("y", "A")  # raised
    queue.add("y", "A", Priority.LOW)  # a later low add does not lower it again
    assert len(queue) == 2
    order = [key for key, _ in take_ready(queue)]
    assert order == ["y", "x"], "raised first, and the stale low copy is never handed out"


async def test_a_key_added_while_processing_keeps_the_most_urgent_priority() -> None:
    queue: WorkQueue[str] = WorkQueue(shard_limit=None)
    queue.add("k", "A")
    assert take_ready(queue) == [("k", "A")]
    queue.add("k", "A", Priority.LOW)
    queue.add("k", "A")
    queue.add("other", "A", Priority.LOW)
    queue.done("k", "A")
    assert [key for key, _ in take_ready(queue)] == ["k", "other"]


async def test_a_cancelled_getter_passes_its_wake_up_on() -> None:
    queue: WorkQueue[str] = WorkQueue()
    first = asyncio.create_task(queue.get())
    second = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.add("k", "A")  # wakes `first`
    first.cancel()
    item = await asyncio.wait_for(second, 1)
    assert item == ("k", "A")


async def test_a_shard_limit_per_shard() -> None:
    queue: WorkQueue[str] = WorkQueue(shard_limit=lambda shard: 1 if shard == "serial" else None)
    for index in range(3):
        queue.add(f"s{index}", "serial")
        queue.add(f"c{index}", "concurrent")
    assert sorted(key for key, _ in take_ready(queue)) == ["c0", "c1", "c2", "s0"]
    queue.done("s0", "serial")
    assert take_ready(queue) == [("s1", "serial")]


async def test_busy_while_waiting_processing_or_due_after_a_delay() -> None:
    queue: WorkQueue[str] = WorkQueue()
    assert not queue.busy("a")
    queue.add("a", "pool-1")
    assert queue.busy("a")
    item = await queue.get()
    assert item == ("a", "pool-1") and queue.busy("a"), "being processed"
    queue.done("a", "pool-1")
    assert not queue.busy("a")
    queue.add_after("a", 3600.0, "pool-1")
    assert queue.busy("a"), "due after a delay"
    queue.shutdown()
    assert not queue.busy("a")


def by_prefix(key: str) -> str:
    """The tenant of a test key "tenant/name"."""
    return key.split("/")[0]


async def pending(getter: asyncio.Task[tuple[str, Hashable] | None]) -> bool:
    """Whether `getter` is still waiting once every ready callback has run."""
    for _ in range(5):
        await asyncio.sleep(0)
    return not getter.done()


async def test_tenants_are_served_in_turn_before_their_shards() -> None:
    queue: WorkQueue[str] = WorkQueue(tenants=Tenants(by_prefix))
    for number in range(1, 5):
        queue.add(f"a/{number}", f"a-pool-{number}")
    queue.add("b/1", "b-pool")
    order = [key for key, _ in await drain(queue, 5)]
    assert order == ["a/1", "b/1", "a/2", "a/3", "a/4"], "a tenant with many pools gets no more turns than one"


async def test_a_tenant_at_its_limit_waits_without_a_worker_count() -> None:
    queue: WorkQueue[str] = WorkQueue(tenants=Tenants(by_prefix, limit=1))
    queue.add("a/1", "A1")
    queue.add("a/2", "A2")
    first = await asyncio.wait_for(queue.get(), 1)
    assert first == ("a/1", "A1")
    second = asyncio.create_task(queue.get())
    assert await pending(second), "the tenant holds its one key"
    queue.done("a/1", "A1")
    assert await asyncio.wait_for(second, 1) == ("a/2", "A2")


async def test_stalled_tenant_keys_leave_workers_for_another_tenant() -> None:
    """Eight workers, a share of two: a tenant's stalling keys hold at most six workers, another tenant's key
    is handed out at once, and a worker one of them gives back goes to a tenant below its share."""
    queue: WorkQueue[str] = WorkQueue(tenants=Tenants(by_prefix, limit=2, workers=8))
    for number in range(100):
        queue.add(f"evil/{number}", f"evil-pool-{number}")
    held = [await asyncio.wait_for(queue.get(), 1) for _ in range(6)]
    stalled = held[0]
    assert stalled is not None
    getter = asyncio.create_task(queue.get())
    assert await pending(getter), "a seventh worker is kept from the stalling tenant"
    assert queue.holding("evil") == 6
    queue.add("good/1", "good-pool")
    assert await asyncio.wait_for(getter, 1) == ("good/1", "good-pool")
    queue.add("good/2", "good-pool-2")
    queue.add("other/1", "other-pool")
    assert await asyncio.wait_for(queue.get(), 1) == ("good/2", "good-pool-2")
    assert queue.processing == 8  # every worker is busy
    queue.done(*stalled)  # a stalled key gives its worker back: the tenant waiting gets it, not the stalling one
    assert await asyncio.wait_for(queue.get(), 1) == ("other/1", "other-pool")
    assert queue.holding("evil") == 5


async def test_a_shard_limit_holds_across_tenants() -> None:
    queue: WorkQueue[str] = WorkQueue(tenants=Tenants(by_prefix))
    queue.add("a/1", "shared-pool")
    queue.add("b/1", "shared-pool")
    first = await asyncio.wait_for(queue.get(), 1)
    assert first == ("a/1", "shared-pool")
    second = asyncio.create_task(queue.get())
    assert await pending(second), "one key of the pool at a time, whatever its tenant"
    queue.done(*first)
    assert await asyncio.wait_for(second, 1) == ("b/1", "shared-pool")


async def test_random_adds_keep_every_limit_and_lose_no_key() -> None:
    """Eight workers holding keys for random turns of the loop, keys of 5 tenants in 12 shards added at random: no
    key twice at once, one key of a shard at a time, no tenant beyond its share while workers are scarce, and
    every key added is handed out afterwards."""
    generator = random.Random(31)
    queue: WorkQueue[str] = WorkQueue(tenants=Tenants(by_prefix, limit=2, workers=8))
    shard_of = {f"t{t}/k{k}": f"s{(t * 7 + k) % 12}" for t in range(5) for k in range(20)}
    pending_since: dict[str, int] = {}  # key → the step of an add not yet followed by a hand-out
    active_shards: set[Hashable] = set()

    async def worker() -> None:
        while (item := await queue.get()) is not None:
            key, shard = item
            assert shard not in active_shards, "one key of a shard at a time"
            assert queue.holding(by_prefix(key)) <= 2 or queue.processing <= 8 - 2
            active_shards.add(shard)
            pending_since.pop(key, None)
            for _ in range(generator.randrange(1, 30)):
                await asyncio.sleep(0)
            active_shards.discard(shard)
            queue.done(key, shard)

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    for step in range(3000):
        key = generator.choice(sorted(shard_of))
        pending_since.setdefault(key, step)
        queue.add(key, shard_of[key])
        await asyncio.sleep(0)
    for _ in range(3000):
        if not pending_since and queue.processing == 0:
            break
        await asyncio.sleep(0)
    for task in workers:
        if task.done():
            task.result()  # a worker's failed assertion
    assert pending_since == {}, "every key added is handed out"
    queue.shutdown()
    await asyncio.wait_for(asyncio.gather(*workers), 1)
