"""A work queue in the manner of client-go's, with per-shard serialisation.

Contract:
- A key waits in the queue at most once (adding it again is a no-op), and is never handed to two workers at once.
- Every key belongs to a shard (for claims: their pool). At most one key of a shard is processed at a time;
  different shards are processed in parallel, taken round-robin so that one busy pool cannot starve the others.
- `add_rate_limited` re-adds a failed key after a per-key exponential backoff; `forget` resets it.
- `add_after` re-adds a key after a delay; the earliest pending delay wins.
- After `shutdown`, `get` returns None once no key is ready; keys being processed are finished by their workers.
- A queue given a `name` reports the `workqueue_*` series under it (`ipam_provider.telemetry.controller`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from ipam_provider.telemetry.controller import queue_metrics

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay: float = 0.05, max_delay: float = 120.0, name: str | None = None) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._waiting: dict[Hashable, deque[K]] = {}
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._requeue_when_done: dict[K, Hashable] = {}  # key being processed → its shard when added again
        self._busy_shards: set[Hashable] = set()
        self._ready_shards: deque[Hashable] = deque()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._wakeup = asyncio.Condition()
        self._shutting_down = False
        self._metrics = queue_metrics(name)

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def processing(self) -> int:
        return len(self._processing)

    def add(self, key: K, shard: Hashable = None) -> None:
        if self._shutting_down:
            return
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        if key in self._processing:
            self._requeue_when_done[key] = shard
            self._metrics.added(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._metrics.added(key)
        self._waiting.setdefault(shard, deque()).append(key)
        self._mark_ready(shard)

    def add_after(self, key: K, delay: float, shard: Hashable = None) -> None:
        if delay <= 0:
            self.add(key, shard)
            return
        if self._shutting_down or key in self._queued:
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        existing = self._timers.get(key)
        if existing is not None:
            if existing[0] <= when:
                return
            existing[1].cancel()
        self._timers[key] = (when, loop.call_at(when, self._fire, key, shard))

    def _fire(self, key: K, shard: Hashable) -> None:
        self._timers.pop(key, None)
        self.add(key, shard)

    def add_rate_limited(self, key: K, shard: Hashable = None) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        self._metrics.retried()
        delay = float(min(self.max_delay, self.base_delay * (2**failures)))
        self.add_after(key, delay, shard)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def _mark_ready(self, shard: Hashable) -> None:
        if shard not in self._busy_shards and shard not in self._ready_shards and self._waiting.get(shard):
            self._ready_shards.append(shard)
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._wakeup:
            self._wakeup.notify()

    async def get(self) -> tuple[K, Hashable] | None:
        """The next key and its shard; None after shutdown when nothing is ready."""
        async with self._wakeup:
            while True:
                while self._ready_shards:
                    shard = self._ready_shards.popleft()
                    waiting = self._waiting.get(shard)
                    if not waiting or shard in self._busy_shards:
                        continue
                    key = waiting.popleft()
                    if not waiting:
                        del self._waiting[shard]
                    self._queued.discard(key)
                    if key in self._processing:
                        self._requeue_when_done[key] = shard
                        self._mark_ready(shard)
                        continue
                    self._processing.add(key)
                    self._busy_shards.add(shard)
                    self._metrics.taken(key)
                    return key, shard
                if self._shutting_down:
                    return None
                await self._wakeup.wait()

    def done(self, key: K, shard: Hashable) -> None:
        self._metrics.done(key)
        self._processing.discard(key)
        self._busy_shards.discard(shard)
        if key in self._requeue_when_done:
            shard_again = self._requeue_when_done.pop(key)
            if not self._shutting_down:
                self.add(key, shard_again)
        self._mark_ready(shard)
        if self._shutting_down:
            asyncio.get_running_loop().create_task(self._notify_all())

    def shutdown(self) -> None:
        self._shutting_down = True
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._waiting.clear()
        self._ready_shards.clear()
        self._queued.clear()
        self._metrics.cleared()
        asyncio.get_running_loop().create_task(self._notify_all())

    async def _notify_all(self) -> None:
        async with self._wakeup:
            self._wakeup.notify_all()
