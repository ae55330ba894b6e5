"""A work queue in the manner of client-go's, with shards and tenants for fairness and two priorities.

Contract:
- A key waits in the queue at most once (adding it again is a no-op, except that it may raise the key's
  priority), and is never handed to two workers at once.
- Every key belongs to a tenant (`tenants.of(key)`; by default all keys to one) and to a shard (such as the object
  the key's object draws from; a waiting key keeps the shard of its first add). Tenants are served round-robin, and
  within a tenant its shards, so that neither a busy tenant nor a busy shard starves the others. At most
  `shard_limit(shard)` keys of one shard are processed at a time, whatever their tenants (None: no limit but the
  number of workers); `shard_limit` may also be one number for every shard.
- A tenant holding `tenants.limit` keys or more (None: no limit) is handed another only while more than
  `tenants.limit` of the queue's `tenants.workers` would stay idle (without `workers`: never). A tenant whose keys stall
  thus never holds the workers another tenant needs: that tenant finds up to `tenants.limit` idle workers, or
  the next one any other tenant's key gives back.
- Keys have a priority: NORMAL or LOW. A LOW key is handed out only when no NORMAL key is ready (the keys a
  cache's initial list brings, for objects that need no work, wait behind live changes). Within a priority, a
  tenant and a shard, keys are handed out in the order they were added.
- `add_rate_limited` re-adds a failed key after a per-key exponential backoff; `forget` resets it.
- `add_after` re-adds a key after a delay; the earliest pending delay wins.
- `busy(key)` tells whether a key is waiting, being processed or due after a delay (a sweep can leave
  such keys to their reconcile).
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


@dataclass(frozen=True)
class Tenants(Generic[K]):
    """How a queue shares its workers among tenants (see the module's contract)."""

    of: Callable[[K], Hashable]
    limit: int | None = None
    workers: int | None = None


Lane = tuple[Hashable, Hashable]  # (tenant, shard)


class WorkQueue(Generic[K]):
    def __init__(
        self,
        *,
        base_delay: float = 0.05,
        max_delay: float = 120.0,
        name: str | None = None,
        shard_limit: int | Callable[[Hashable], int | None] | None = 1,
        tenants: Tenants[K] | None = None,
    ) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._shard_limit = shard_limit if callable(shard_limit) else (lambda shard: shard_limit)
        self._tenants = tenants if tenants is not None else Tenants(lambda key: None)
        self._queued: dict[K, _Entry] = {}
        # Per shard, per tenant, one deque per priority. A key whose priority was raised also stays in its old
        # deque; that stale copy is skipped when it comes up (its entry no longer matches).
        self._waiting: dict[Hashable, dict[Hashable, tuple[deque[K], deque[K]]]] = {}
        self._processing: dict[K, Hashable] = {}  # key being processed → its tenant
        self._requeue_when_done: dict[K, _Entry] = {}  # key being processed → how to add it again when done
        self._active: dict[Hashable, int] = {}  # shard → keys of it being processed
        self._held: dict[Hashable, int] = {}  # tenant → keys of it being processed
        # Per priority: the tenants to serve, and per tenant its shards to serve (lanes: (tenant, shard)).
        self._ready: tuple[deque[Hashable], deque[Hashable]] = (deque(), deque())
        self._in_ready: tuple[set[Hashable], set[Hashable]] = (set(), set())
        self._lines: tuple[dict[Hashable, deque[Hashable]], dict[Hashable, deque[Hashable]]] = ({}, {})
        self._in_lines: tuple[set[Lane], set[Lane]] = (set(), set())
        self._held_back: set[Hashable] = set()  # tenants left out of line for holding their share
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

    def holding(self, tenant: Hashable) -> int:
        """How many keys of `tenant` are being processed."""
        return self._held.get(tenant, 0)

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
                tenant = self._tenants.of(key)
                self._waiting_of(tenant, queued.shard)[priority].append(key)
                self._mark_ready(tenant, queued.shard)
            return
        self._queued[key] = _Entry(shard, priority)
        self._metrics.added(key)
        tenant = self._tenants.of(key)
        self._waiting_of(tenant, shard)[priority].append(key)
        self._mark_ready(tenant, shard)

    def _waiting_of(self, tenant: Hashable, shard: Hashable) -> tuple[deque[K], deque[K]]:
        by_tenant = self._waiting.get(shard)
        if by_tenant is None:
            by_tenant = self._waiting[shard] = {}
        waiting = by_tenant.get(tenant)
        if waiting is None:
            waiting = by_tenant[tenant] = (deque(), deque())
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

    def _may_take(self, tenant: Hashable) -> bool:
        """Whether the tenant may be handed one more key now: below its share, or with enough workers idle."""
        limit = self._tenants.limit
        if limit is None or self._held.get(tenant, 0) < limit:
            return True
        workers = self._tenants.workers
        return workers is not None and workers - len(self._processing) > limit

    def _mark_ready(self, tenant: Hashable, shard: Hashable) -> None:
        """Put the lane in its tenant's line for each priority it has keys waiting at, if its shard may take one
        more now, and the tenant in line."""
        waiting = self._waiting.get(shard, {}).get(tenant)
        if waiting is None or not self._has_room(shard):
            return
        lane = (tenant, shard)
        for priority in Priority:
            if waiting[priority] and lane not in self._in_lines[priority]:
                line = self._lines[priority].get(tenant)
                if line is None:
                    line = self._lines[priority][tenant] = deque()
                line.append(shard)
                self._in_lines[priority].add(lane)
                self._mark_tenant(tenant, priority)

    def _mark_tenant(self, tenant: Hashable, priority: Priority) -> None:
        """Put the tenant in line for `priority` if it has a lane there; held back while it holds its share."""
        if tenant in self._in_ready[priority] or not self._lines[priority].get(tenant):
            return
        if not self._may_take(tenant):
            self._held_back.add(tenant)
            return
        self._ready[priority].append(tenant)
        self._in_ready[priority].add(tenant)
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
        """Hand out the first ready key, NORMAL before LOW, tenants round-robin; None if nothing is ready."""
        for priority in Priority:
            ready, in_ready = self._ready[priority], self._in_ready[priority]
            while ready:
                tenant = ready.popleft()
                in_ready.discard(tenant)
                if not self._may_take(tenant):
                    self._held_back.add(tenant)  # back in line when a key is done
                    continue
                item = self._take_from(tenant, priority)
                if item is not None:
                    self._mark_tenant(tenant, priority)  # round-robin: the tenant goes to the back of the line
                    return item
        return None

    def _take_from(self, tenant: Hashable, priority: Priority) -> tuple[K, Hashable] | None:
        """The tenant's next key of this priority, its shards round-robin; None if none may be handed out."""
        lines, in_lines = self._lines[priority], self._in_lines[priority]
        line = lines.get(tenant)
        while line:
            shard = line.popleft()
            in_lines.discard((tenant, shard))
            if not self._has_room(shard):
                continue  # back in line when one of its keys is done
            key = self._pop_waiting(tenant, shard, priority)
            if key is None:
                continue
            if key in self._processing:  # cannot happen by the invariants; never run a key twice at once
                self._requeue_when_done[key] = _Entry(shard, priority)
                self._mark_ready(tenant, shard)
                continue
            self._processing[key] = tenant
            self._active[shard] = self._active.get(shard, 0) + 1
            self._held[tenant] = self._held.get(tenant, 0) + 1
            self._metrics.taken(key)
            self._mark_ready(tenant, shard)  # round-robin: the shard goes to the back of the tenant's line
            if not line:
                del lines[tenant]
            return key, shard
        lines.pop(tenant, None)
        return None

    def _pop_waiting(self, tenant: Hashable, shard: Hashable, priority: Priority) -> K | None:
        """The lane's next key of this priority, skipping stale copies; cleans up an empty lane."""
        by_tenant = self._waiting.get(shard)
        waiting = by_tenant.get(tenant) if by_tenant is not None else None
        if by_tenant is None or waiting is None:
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
            del by_tenant[tenant]
            if not by_tenant:
                del self._waiting[shard]
        return found

    def done(self, key: K, shard: Hashable) -> None:
        self._metrics.done(key)
        tenant = self._processing.pop(key, None)
        limit = self._shard_limit(shard)
        was_full = limit is not None and self._active.get(shard, 0) >= limit
        _decrement(self._active, shard)
        _decrement(self._held, tenant)
        again = self._requeue_when_done.pop(key, None)
        if again is not None and not self._shutting_down:
            self.add(key, again.shard, again.priority)
        # The shard has room again: its lanes of every tenant may be served (lanes of full shards leave the lines).
        for other in list(self._waiting.get(shard, ())) if was_full else (tenant,):
            self._mark_ready(other, shard)
        for held_back in list(self._held_back):  # a worker came free: tenants held back may be served again
            if self._may_take(held_back):
                self._held_back.discard(held_back)
                for priority in Priority:
                    self._mark_tenant(held_back, priority)
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
            self._lines[priority].clear()
            self._in_lines[priority].clear()
        self._held_back.clear()
        self._queued.clear()
        self._metrics.cleared()
        self._wake_all()


def _decrement(counts: dict[Hashable, int], name: Hashable) -> None:
    count = counts.get(name, 0) - 1
    if count > 0:
        counts[name] = count
    else:
        counts.pop(name, None)
