"""Which Kubernetes Event a recorded occurrence becomes, in the manner of client-go's EventCorrelator.

Pure state, no I/O: `EventCorrelator.observe` takes one occurrence and marks the Event it lands in as dirty; the
recorder takes dirty Events with `due()` and writes them. The clock is injected.

- Dedup: an occurrence with the same involved object, type, reason and message as an Event seen within `window`
  seconds of its previous occurrence adds 1 to that Event's `count` (a PATCH) instead of making a new Event.
- Aggregation: occurrences similar by (type, reason, source component, the related object if one is given, else the
  involved object) are written one by one up to `individual` per `window` (counted from the first of the window);
  beyond that they are counted into ONE combined Event on that related (or involved) object, its message the
  latest one prefixed with `COMBINED_PREFIX`, its `count` the number of occurrences it stands for.
- Writes: an Event is taken for writing at most once per `interval` seconds (unless forced); occurrences in
  between only change what the next write sends.
- Bounds: the dedup and aggregation caches keep the `cache_entries` most recently used entries each; `forget`
  drops the entries naming an object that is gone (by kind, namespace and name), so that they do not wait for
  eviction. New Events of their own wait to be written while fewer than `capacity` Events wait; beyond that an
  occurrence is counted into its combined Event instead. Updates of waiting Events take no room; combined Events
  and updates of written ones may wait up to twice `capacity`, and only beyond that is an occurrence dropped (the
  outcome says so).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ipam_provider.runtime.kube.bounds import EVENT_MESSAGE_LENGTH, cut_message
from ipam_provider.runtime.kube.resources import SUBDOMAIN_LENGTH, Object, now_rfc3339

WINDOW = 600.0
INDIVIDUAL = 10
CACHE_ENTRIES = 4096
CAPACITY = 1024
INTERVAL = 1.0
COMBINED_PREFIX = "(combined from similar events): "

CREATED = "created"  # a new Event of its own
PATCHED = "patched"  # a repeat: one more in the count of an Event of its own
COMBINED = "combined"  # counted into the combined Event of its related object
DROPPED = "dropped"  # no room in the buffer: not written

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A mapping that keeps its `size` most recently used entries."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


class GroupedLRU(LRU[K, V]):
    """An LRU whose keys fall into groups (`group_of`), so that a group's entries can go at once."""

    def __init__(self, size: int, group_of: Callable[[K], Hashable]) -> None:
        super().__init__(size)
        self.group_of = group_of
        self._groups: dict[Hashable, set[K]] = {}

    def put(self, key: K, value: V) -> None:
        self._groups.setdefault(self.group_of(key), set()).add(key)
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._ungroup(self._entries.popitem(last=False)[0])

    def pop(self, key: K) -> V | None:
        self._ungroup(key)
        return self._entries.pop(key, None)

    def pop_group(self, group: Hashable) -> None:
        for key in self._groups.pop(group, ()):
            self._entries.pop(key, None)

    def _ungroup(self, key: K) -> None:
        group = self.group_of(key)
        keys = self._groups.get(group)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._groups[group]


def reference(obj: Object) -> Object:
    """The ObjectReference of `obj` (the Event's `involvedObject` or `related`)."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
    }


def event_name(involved: str) -> str:
    """A new Event's name: the involved object's, cut so that with its random suffix it stays a DNS subdomain (an
    object's name may take all of SUBDOMAIN_LENGTH), then a dot and 16 hex digits."""
    suffix = f".{secrets.token_hex(8)}"
    return (involved[: SUBDOMAIN_LENGTH - len(suffix)].rstrip(".-") or "object") + suffix


def identity(ref: Object) -> tuple[str | None, ...]:
    """What tells one object from another in a reference (its resourceVersion does not)."""
    return (ref.get("apiVersion"), ref.get("kind"), ref.get("namespace"), ref.get("name"), ref.get("uid"))


@dataclass(eq=False)
class Series:
    """One Event object: its body as first made, what it counts now, and the count the API server holds."""

    body: Object
    message: str
    last_timestamp: str
    last_seen: float  # the correlator's clock at the latest occurrence
    count: int = 1
    written: int = 0  # the count the API server holds; 0 until it is created
    not_before: float = 0.0  # not taken for writing again before this (the correlator's clock)

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    def creation(self) -> Object:
        """The Event to POST, as it stands now."""
        return {**self.body, "count": self.count, "message": self.message, "lastTimestamp": self.last_timestamp}

    def update(self) -> Object:
        """The merge patch that brings the Event up to date."""
        return {"count": self.count, "message": self.message, "lastTimestamp": self.last_timestamp}


@dataclass
class _Aggregate:
    window_start: float
    seen: int = 0
    combined: Series | None = None


DedupKey = tuple[tuple[str | None, ...], str, str, str]
AggregateKey = tuple[str, str, str, tuple[str | None, ...]]


@dataclass
class EventCorrelator:
    """Correlation state of one recorder (one source component). Not thread-safe: one event loop uses it."""

    component: str
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], str] = now_rfc3339
    window: float = WINDOW
    individual: int = INDIVIDUAL
    cache_entries: int = CACHE_ENTRIES
    capacity: int = CAPACITY
    interval: float = INTERVAL
    _series: GroupedLRU[DedupKey, Series] = field(init=False)
    _aggregates: GroupedLRU[AggregateKey, _Aggregate] = field(init=False)
    _dirty: dict[Series, None] = field(init=False, default_factory=dict)  # an ordered set: oldest first

    def __post_init__(self) -> None:
        self._series = GroupedLRU(self.cache_entries, lambda key: key[0][1:4])  # by the involved object
        self._aggregates = GroupedLRU(self.cache_entries, lambda key: key[3][1:4])  # by the related (or involved) one

    def forget(self, kind: str, namespace: str | None, name: str) -> None:
        """The object is gone: the dedup and aggregation entries naming it go, whatever its uid (Events waiting to
        be written stay)."""
        self._series.pop_group((kind, namespace, name))
        self._aggregates.pop_group((kind, namespace, name))

    @property
    def pending(self) -> int:
        """Events waiting to be written."""
        return len(self._dirty)

    def observe(self, obj: Object, type: str, reason: str, message: str, related: Object | None = None) -> str:
        """Count one occurrence; returns its outcome: CREATED, PATCHED, COMBINED or DROPPED."""
        now = self.clock()
        message = cut_message(message, EVENT_MESSAGE_LENGTH)
        involved = reference(obj)
        dedup_key: DedupKey = (identity(involved), type, reason, message)
        series = self._series.get(dedup_key)
        if series is not None and now - series.last_seen <= self.window:
            return self._count(series, message, now, PATCHED)
        related_ref = reference(related) if related is not None else None
        target = related_ref or involved
        aggregate_key: AggregateKey = (type, reason, self.component, identity(target))
        aggregate = self._aggregates.get(aggregate_key)
        if aggregate is None or now - aggregate.window_start > self.window:
            aggregate = _Aggregate(window_start=now)
            self._aggregates.put(aggregate_key, aggregate)
        aggregate.seen += 1
        if aggregate.seen <= self.individual and len(self._dirty) < self.capacity:
            series = self._new(involved, related_ref, type, reason, message, now)
            self._series.put(dedup_key, series)
            self._dirty[series] = None
            return CREATED
        combined_message = cut_message(COMBINED_PREFIX + message, EVENT_MESSAGE_LENGTH)
        if aggregate.combined is None:
            if not self._room_for_update():
                return DROPPED
            aggregate.combined = self._new(target, None, type, reason, combined_message, now)
            self._dirty[aggregate.combined] = None
            return COMBINED
        return self._count(aggregate.combined, combined_message, now, COMBINED)

    def due(self, *, force: bool = False) -> list[Series]:
        """Take the Events to write now, oldest first: every waiting one with `force`, else those whose last
        write was at least `interval` ago. Each taken Event is not due again for `interval` seconds."""
        now = self.clock()
        taken = [series for series in self._dirty if force or series.not_before <= now]
        for series in taken:
            del self._dirty[series]
            series.not_before = now + self.interval
        return taken

    def next_due(self) -> float | None:
        """Seconds until a waiting Event is due (0: now), None when none waits."""
        if not self._dirty:
            return None
        return max(0.0, min(series.not_before for series in self._dirty) - self.clock())

    def _room_for_update(self) -> bool:
        return len(self._dirty) < 2 * self.capacity

    def _count(self, series: Series, message: str, now: float, outcome: str) -> str:
        if series not in self._dirty and not self._room_for_update():
            return DROPPED
        series.count += 1
        series.message = message
        series.last_timestamp = self.wall()
        series.last_seen = now
        self._dirty[series] = None
        return outcome

    def _new(
        self, involved: Object, related: Object | None, type: str, reason: str, message: str, now: float
    ) -> Series:
        stamp = self.wall()
        body: Object = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": event_name(involved.get("name") or "object"),
                "namespace": involved.get("namespace") or "default",
            },
            "involvedObject": involved,
            "type": type,
            "reason": reason,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": stamp,
        }
        if related is not None:
            body["related"] = related
        return Series(body=body, message=message, last_timestamp=stamp, last_seen=now)
