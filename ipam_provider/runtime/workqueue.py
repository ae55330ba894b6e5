"""A work queue in the manner of client-go's, with shards for fairness and two priorities.

Contract:
- A key waits in the queue at most once (adding it again is a no-op, except that it may raise the key's
  priority), and is never handed to two workers at once.
- Every key belongs to a shard (for claims: their pool). Shards are served round-robin, so that one busy pool
  cannot starve the others. At most `shard_limit(shard)` keys of one shard are processed at a time (None: no
  limit but the number of workers); `shard_limit` may also be one number for every shard.
- Keys have a priority: NORMAL or LOW. A LOW key is handed out only when no NORMAL key is ready (the keys a
  cache's initial list brings, for objects that need no work, wait behind live changes). Within a priority and
  a shard, keys are handed out in the order they were added.
- `add_rate_limited` re-adds a failed key after a per-key exponential backoff; `forget` resets it.
- `add_after` re-adds a key after a delay; the earliest pending delay wins.
- `busy(key)` tells whether a key is waiting, being processed or due after a delay (the repair loop leaves
  such claims to their reconcile).
- After `shutdown`, `get` returns None once no key is ready; keys being processed are finished by their workers.
- A queue given a `name` reports the `workqueue_*` series under it (`ipam_provider.runtime.telemetry.controller`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import IntEnum
from typing import Generic, TypeVar

from ipam_provider.runtime.telemetry.controller import queue_metrics

K = TypeVar("K", bound=Hashable)


class Priority(IntEnum):
    """Lower values are served first."""

    NORMAL = 0
    LOW = 1


@dataclass(frozen=True)
class _Entry:
    shard: Hashable
    priority: Priority


class WorkQueue(Generic[K]):
    def __init__(
        self,
        *,
        base_delay: float = 0.05,
        max_delay: float = 120.0,
        name: str | None = None,
        shard_limit: int | Callable[[Hashable], int | None] | None = 1,
    ) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._shard_limit = shard_limit if callable(shard_limit) else (lambda shard: shard_limit)
        self._queued: dict[K, _Entry] = {}
        # Per shard, one deque per priority. A key whose priority was raised also stays in its old deque; that
        # stale copy is skipped when it comes up (its entry no longer matches).
        self._waiting: dict[Hashable, tuple[deque[K], deque[K]]] = {}
        self._processing: set[K] = set()
        self._requeue_when_done: dict[K, _Entry] = {}  # key being processed → how to add it again when done
        self._active: dict[Hashable, int] = {}  # shard → keys of it being processed
        self._ready: tuple[deque[Hashable], deque[Hashable]] = (deque(), deque())  # shards to serve, per priority
        self._in_ready: tuple[set[Hashable], set[Hashable]] = (set(), set())
        self._getters: deque[asyncio.Future[None]] = deque()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._shutting_down = False
        self._metrics = queue_metrics(name)

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def processing(self) -> int:
        return len(self._processing)

    def add(self, key: K, shard: Hashable = None, priority: Priority = Priority.NORMAL) -> None:
        if self._shutting_down:
            return
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        if key in self._processing:
            again = self._requeue_when_done.get(key)
            if again is None or priority < again.priority:
                self._requeue_when_done[key] = _Entry(shard, priority)
            self._metrics.added(key)
            return
        queued = self._queued.get(key)
        if queued is not None:
            if priority < queued.priority:  # raised: queue it again at the new priority, under its shard
                self._queued[key] = _Entry(queued.shard, priority)
                self._waiting_of(queued.shard)[priority].append(key)
                self._mark_ready(queued.shard)
            return
        self._queued[key] = _Entry(shard, priority)
        self._metrics.added(key)
        self._waiting_of(shard)[priority].append(key)
        self._mark_ready(shard)

    def _waiting_of(self, shard: Hashable) -> tuple[deque[K], deque[K]]:
        waiting = self._waiting.get(shard)
        if waiting is None:
            waiting = self._waiting[shard] = (deque(), deque())
        return waiting

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

    def busy(self, key: K) -> bool:
        """Whether `key` is waiting, being processed, or due to be added again after a delay."""
        return key in self._queued or key in self._processing or key in self._timers

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def _has_room(self, shard: Hashable) -> bool:
        limit = self._shard_limit(shard)
        return limit is None or self._active.get(shard, 0) < limit

    def _mark_ready(self, shard: Hashable) -> None:
        """Put the shard in line for each priority it has keys waiting at, if it may take one more now."""
        waiting = self._waiting.get(shard)
        if waiting is None or not self._has_room(shard):
            return
        for priority in Priority:
            if waiting[priority] and shard not in self._in_ready[priority]:
                self._ready[priority].append(shard)
                self._in_ready[priority].add(shard)
                self._wake_one()

    def _wake_one(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _wake_all(self) -> None:
        while self._getters:
            self._wake_one()

    async def get(self) -> tuple[K, Hashable] | None:
        """The next key and its shard; None after shutdown when nothing is ready."""
        while True:
            item = self._take()
            if item is not None:
                return item
            if self._shutting_down:
                return None
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except asyncio.CancelledError:
                if getter.done() and not getter.cancelled():
                    self._wake_one()  # pass the wake-up this getter got on to another one
                raise

    def _take(self) -> tuple[K, Hashable] | None:
        """Hand out the first ready key, NORMAL before LOW, shards round-robin; None if nothing is ready."""
        for priority in Priority:
            ready, in_ready = self._ready[priority], self._in_ready[priority]
            while ready:
                shard = ready.popleft()
                in_ready.discard(shard)
                if not self._has_room(shard):
                    continue  # back in line when one of its keys is done
                key = self._pop_waiting(shard, priority)
                if key is None:
                    continue
                if key in self._processing:  # cannot happen by the invariants; never run a key twice at once
                    self._requeue_when_done[key] = _Entry(shard, priority)
                    self._mark_ready(shard)
                    continue
                self._processing.add(key)
                self._active[shard] = self._active.get(shard, 0) + 1
                self._metrics.taken(key)
                self._mark_ready(shard)  # round-robin: the shard goes to the back of the line
                return key, shard
        return None

    def _pop_waiting(self, shard: Hashable, priority: Priority) -> K | None:
        """The shard's next key of this priority, skipping stale copies; cleans up an empty shard."""
        waiting = self._waiting.get(shard)
        if waiting is None:
            return None
        found: K | None = None
        keys = waiting[priority]
        while keys:
            key = keys.popleft()
            entry = self._queued.get(key)
            if entry is not None and entry.shard == shard and entry.priority == priority:
                del self._queued[key]
                found = key
                break
        if not waiting[Priority.NORMAL] and not waiting[Priority.LOW]:
            del self._waiting[shard]
        return found

    def done(self, key: K, shard: Hashable) -> None:
        self._metrics.done(key)
        self._processing.discard(key)
        active = self._active.get(shard, 0) - 1
        if active > 0:
            self._active[shard] = active
        else:
            self._active.pop(shard, None)
        again = self._requeue_when_done.pop(key, None)
        if again is not None and not self._shutting_down:
            self.add(key, again.shard, again.priority)
        self._mark_ready(shard)
        if self._shutting_down:
            self._wake_all()

    def shutdown(self) -> None:
        self._shutting_down = True
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._waiting.clear()
        for priority in Priority:
            self._ready[priority].clear()
            self._in_ready[priority].clear()
        self._queued.clear()
        self._metrics.cleared()
        self._wake_all()
