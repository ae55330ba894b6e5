"""How much per-object state the controller holds, measured without any component registering anything.

`footprint(root)` walks the object graph from `root` (the running `Controller`), breadth first, through:

- the instance attributes (`__dict__` and `__slots__`) of every object whose class is defined in an `ipam_provider`
  or `backends` module ("owned" objects);
- containers: dicts (keys and values), lists, tuples, sets, frozensets, deques, weak containers;
- partials, bound methods and the closures of functions defined in owned modules;

plus every loaded owned module's module-level containers, owned objects and functools caches (and those of its
classes; only unbounded ones of owned functions: one with a `maxsize` is bounded by design), the count of live
asyncio tasks and the number of series in the Prometheus registry.

It answers a map from a stable path to an element count: each mutable container's length, added up over every
container reached by the same path, where a container's elements are named `[*]` (`Controller.queue._entries`,
`Controller.caches.pools[*]._objects`). So the set of paths does not grow with the number of objects, and a path
whose count grows after churn names state kept for objects that are gone. Each object is visited once (the first,
shortest path wins), so cycles end. An API object (a dict with `metadata`) is counted as an element of its
container, not walked into.

`footprint_growth(before, after)` names the paths that grew, with their counts before and after.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import re
import sys
import time
import types
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from sortedcontainers import SortedDict, SortedList, SortedSet

OWNED_PREFIXES = ("ipam_provider", "backends")
MAX_PLAIN_NESTING = 4  # plain containers nested below one owned object, at most (JSON values go deeper)
LEAVES = (str, bytes, int, float, complex, bool, type(None), type, types.ModuleType)
COUNTED = (
    dict,
    list,
    set,
    frozenset,
    collections.deque,
    weakref.WeakValueDictionary,
    weakref.WeakKeyDictionary,
    weakref.WeakSet,
    SortedDict,
    SortedList,
    SortedSet,
)


def is_owned_module(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in OWNED_PREFIXES)


def is_owned(value: object) -> bool:
    """Whether `value`'s class is defined in an `ipam_provider`/`backends` module."""
    return is_owned_module(getattr(type(value), "__module__", "") or "")


def footprint(root: object, registry: CollectorRegistry = REGISTRY) -> dict[str, int]:
    """Path -> element count of the state reachable from `root` and the owned modules (see the module's doc)."""
    walk = _Walk()
    walk.add(root, type(root).__name__, 0)
    for name in sorted(name for name in list(sys.modules) if is_owned_module(name)):
        module = sys.modules[name]
        for attribute, value in sorted(vars(module).items()):
            if attribute.startswith("__"):
                continue
            if isinstance(value, type) and value.__module__ == name:
                _add_class(walk, value, f"{name}.{attribute}")
            elif _is_state(value):
                walk.add(value, f"{name}.{attribute}", 0)
    walk.run()
    counts = walk.counts
    with contextlib.suppress(RuntimeError):  # no running loop: no tasks counted
        counts["asyncio.all_tasks"] = len(asyncio.all_tasks())
    for family in registry.collect():
        counts[f"prometheus.{family.name}"] = len(family.samples)
    return dict(sorted(counts.items()))


BOUNDED_BY_DESIGN: dict[str, str] = {
    # A label value first met late (a 404, a pass that met a refused credential) adds a series, once.
    "prometheus.rest_client_requests": "per status code, host and method of API requests, not per object",
    "ipam_provider.runtime.telemetry.clients._COUNTERS": "the same series, looked up once each",
    "ipam_provider.runtime.telemetry.clients._DURATIONS": "per host and method, not per object",
    "prometheus.ipam_provider_events": "per Event type and outcome, such as the first combined one",
    "prometheus.ipam_provider_repair_passes": "per backend and result (ok, backend_error, error)",
    # NetBoxClient makes a thread's session on the thread's first call; the executor starts threads lazily. A client
    # is reached by whichever of the resolver's maps the walk meets first.
    "Controller.registry._backends[*].resolver.**._sessions": "one per thread, at most workers",
}
"""Patterns (`**`: any run of characters; all else literal) of the paths whose count may grow between two
footprints without any per-object state: their keys come from fixed sets."""


def footprint_growth(before: dict[str, int], after: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The paths whose count in `after` exceeds the one in `before` (a path absent counts 0), but those
    `BOUNDED_BY_DESIGN`: path -> (before, after)."""
    return {
        path: (before.get(path, 0), count)
        for path, count in sorted(after.items())
        if count > before.get(path, 0) and not _bounded_by_design(path)
    }


def _bounded_by_design(path: str) -> bool:
    patterns = (".*".join(map(re.escape, pattern.split("**"))) for pattern in BOUNDED_BY_DESIGN)
    return any(re.fullmatch(pattern, path) for pattern in patterns)


def _is_state(value: object) -> bool:
    """Whether a module-level value may hold state: a container, an owned object or a functools cache."""
    return isinstance(value, COUNTED) or is_owned(value) or _cache_of(value) is not None


def _add_class(walk: _Walk, cls: type, path: str) -> None:
    """A class's own mutable containers, caches (also under staticmethod/classmethod) and owned singletons."""
    for attribute, value in sorted(vars(cls).items()):
        if attribute.startswith("__"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if (isinstance(value, COUNTED) or _cache_of(value) is not None or is_owned(value)) and not isinstance(
            value, type
        ):
            walk.add(value, f"{path}.{attribute}", 0)


def _cache_of(value: object) -> Any:
    """The functools cache wrapper `value` is (it has `cache_info`) if it wraps an owned function and has no
    `maxsize` (a bounded cache is bounded by design), else None."""
    info = getattr(value, "cache_info", None)
    if not (callable(info) and callable(value)) or not is_owned_module(getattr(value, "__module__", "") or ""):
        return None
    return value if info().maxsize is None else None


class _Walk:
    """A breadth-first walk: `add` queues a value under a path, `run` visits them all once each."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._seen: set[int] = set()
        self._queue: collections.deque[tuple[object, str, int]] = collections.deque()
        self._keep: list[object] = []  # what was visited stays alive during the walk: its id is not reused

    def add(self, value: object, path: str, nesting: int) -> None:
        if isinstance(value, LEAVES) or id(value) in self._seen:
            return
        self._seen.add(id(value))
        self._keep.append(value)
        self._queue.append((value, path, nesting))

    def run(self) -> None:
        while self._queue:
            value, path, nesting = self._queue.popleft()
            for child, child_path, child_nesting in self._children(value, path, nesting):
                self.add(child, child_path, child_nesting)

    def _count(self, path: str, count: int) -> None:
        self.counts[path] = self.counts.get(path, 0) + count

    def _children(self, value: object, path: str, nesting: int) -> Iterator[tuple[object, str, int]]:
        cache = _cache_of(value)
        if cache is not None:
            self._count(f"{path}.cache", cache.cache_info().currsize)
            return
        if _is_api_object(value):
            return
        if isinstance(value, COUNTED):
            self._count(path, len(value))
        if is_owned(value):
            yield from _attributes(value, path)
        elif nesting >= MAX_PLAIN_NESTING:
            return
        yield from ((child, child_path, nesting + 1) for child, child_path in _elements(value, path))


def _is_api_object(value: object) -> bool:
    return isinstance(value, dict) and isinstance(value.get("metadata"), dict) and "name" in value["metadata"]


def _attributes(value: object, path: str) -> Iterator[tuple[object, str, int]]:
    """An owned object's instance attributes (`__dict__`, then `__slots__` along its class's MRO)."""
    attributes: dict[str, object] = dict(getattr(value, "__dict__", {}))
    for cls in type(value).__mro__:
        slots = vars(cls).get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                attributes.setdefault(slot, getattr(value, slot))
    for name, child in sorted(attributes.items()):
        yield child, f"{path}.{name}", 0


def _elements(value: object, path: str) -> Iterator[tuple[object, str]]:
    """A container's elements (a dict's keys as `<key>`, its values as `[*]`), or what a partial, a bound method
    or an owned function's closure holds."""
    if isinstance(value, (dict, weakref.WeakValueDictionary, weakref.WeakKeyDictionary)):
        for key, item in list(value.items()):
            yield key, f"{path}<key>"
            yield item, f"{path}[*]"
    elif isinstance(value, (list, tuple, set, frozenset, collections.deque, weakref.WeakSet, SortedList, SortedSet)):
        yield from ((item, f"{path}[*]") for item in list(value))
    elif isinstance(value, functools.partial):
        yield from _named(path, func=value.func, args=value.args, keywords=value.keywords)
    elif isinstance(value, types.MethodType):
        yield from _named(path, __self__=value.__self__, __func__=value.__func__)
    elif isinstance(value, types.FunctionType) and is_owned_module(value.__module__ or ""):
        cells: Iterable[types.CellType] = value.__closure__ or ()
        names = value.__code__.co_freevars
        for name, cell in zip(names, cells, strict=True):
            try:
                yield cell.cell_contents, f"{path}.<{name}>"
            except ValueError:  # an empty cell
                continue


def _named(path: str, **children: object) -> Iterator[tuple[object, str]]:
    for name, child in children.items():
        yield child, f"{path}.{name}"


QUIET = 1.5  # seconds without queued or in-flight work (above the pool-status delay and the Event interval)


async def settled(controller: Any, timeout: float = 30) -> None:
    """Wait until the controller has nothing queued, processed or waiting to be written for QUIET seconds, so that
    a footprint taken then holds no work in flight; fail after `timeout` seconds."""
    queue, recorder = controller.queue, controller.context.recorder
    quiet_since = time.monotonic()
    deadline = quiet_since + timeout
    while time.monotonic() - quiet_since < QUIET:
        if len(queue) or queue.processing or recorder.correlator.pending:
            quiet_since = time.monotonic()
        assert time.monotonic() < deadline, f"the controller did not settle within {timeout:g} s"
        await asyncio.sleep(0.1)
