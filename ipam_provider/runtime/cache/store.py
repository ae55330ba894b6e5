"""A local cache of one resource, with secondary indexes.

The cache is fed by its informer and by the controller's own writes (read-your-writes). An object is never
replaced by an older resourceVersion of itself, so a lagging watch cannot undo what the controller just wrote;
and a deleted object leaves a tombstone, so a late answer to one of our own writes cannot bring it back. A tombstone
is needed only while such a write may be in flight and until the watch has shown the deletion: `forget_tombstone`,
called once the object's reconcile has finished, drops one the watch has shown (`remove(..., watched=True)`).

Whatever enters the store, from the informer or from a write's answer, is first reduced by the store's projection
(`runtime/cache/projection.py`): the API server's bookkeeping (managedFields, ...) is never kept.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

from ipam_provider.runtime.cache.projection import Projection, strip_bookkeeping
from ipam_provider.runtime.kube.resources import Object

Key = tuple[str | None, str]
IndexFunc = Callable[[Object], Iterable[Hashable]]


def object_key(obj: Object) -> Key:
    meta = obj.get("metadata", {})
    return meta.get("namespace"), meta["name"]


def resource_version(obj: Object) -> int | None:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion", ""))
    except ValueError:
        return None


class Store:
    """Objects by (namespace, name), plus named indexes from a computed value to keys. Each object is stored as
    `projection` makes it (by default: without managedFields and the last-applied annotation). `synced`: whether
    the informer feeding the store has listed each of its scopes once."""

    def __init__(self, projection: Projection = strip_bookkeeping) -> None:
        self._project = projection
        self._objects: dict[Key, Object] = {}
        self._index_funcs: dict[str, IndexFunc] = {}
        self._indexes: dict[str, dict[Hashable, set[Key]]] = {}
        self._tombstones: dict[Key, int] = {}
        self._watched: set[Key] = set()  # tombstones whose deletion the watch has shown
        self.synced = False

    def add_index(self, name: str, func: IndexFunc) -> None:
        self._index_funcs[name] = func
        self._indexes[name] = {}
        for key, obj in self._objects.items():
            self._index(name, key, obj)

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, namespace: str | None, name: str) -> Object | None:
        return self._objects.get((namespace, name))

    def items(self) -> list[Object]:
        return list(self._objects.values())

    def keys(self) -> list[Key]:
        return list(self._objects)

    def by_index(self, index: str, value: Hashable) -> list[Object]:
        return [self._objects[key] for key in self._indexes[index].get(value, ())]

    def upsert(self, obj: Object) -> bool:
        """Store the projection of `obj` unless the cache holds this version of it already or a newer one, or a
        tombstone at least as new. Returns whether it was stored (then `get` answers the projection). `obj` itself
        is left unchanged.

        The same version is not stored again: the watch echoes each of the controller's own writes, whose answer
        is cached already, and a re-list repeats every unchanged object."""
        key = object_key(obj)
        previous = self._objects.get(key)
        new_version = resource_version(obj)
        tombstone = self._tombstones.get(key)
        if tombstone is not None and new_version is not None:
            if new_version <= tombstone:
                return False
            del self._tombstones[key]
            self._watched.discard(key)
        if previous is not None:
            old_version = resource_version(previous)
            if new_version is not None and old_version is not None and new_version <= old_version:
                return False
            self._unindex(key, previous)
        obj = self._project(obj)
        self._objects[key] = obj
        for name in self._index_funcs:
            self._index(name, key, obj)
        return True

    def remove(self, key: Key, deleted: Object | None = None, *, watched: bool = False) -> Object | None:
        """Forget the object; `deleted` (its last state, e.g. from a DELETED event) leaves a tombstone so that
        no version up to that one is stored again; `watched`: the watch (or a list) has shown the deletion."""
        version = resource_version(deleted or self._objects.get(key) or {})
        if version is not None:
            self._tombstones[key] = max(version, self._tombstones.get(key, 0))
            if watched:
                self._watched.add(key)
            while len(self._tombstones) > 10_000:
                oldest = next(iter(self._tombstones))
                del self._tombstones[oldest]
                self._watched.discard(oldest)
        previous = self._objects.pop(key, None)
        if previous is not None:
            self._unindex(key, previous)
        return previous

    def forget_tombstone(self, key: Key) -> None:
        """No write to the object is in flight any more (its reconcile finished): its tombstone goes if the watch
        has shown the deletion, for then no older version can come back from the watch either."""
        if key in self._watched:
            self._watched.discard(key)
            self._tombstones.pop(key, None)

    def _index(self, name: str, key: Key, obj: Object) -> None:
        try:
            values = list(self._index_funcs[name](obj))
        except (KeyError, TypeError, AttributeError, ValueError):
            values = []  # malformed objects are kept but not indexed
        for value in values:
            self._indexes[name].setdefault(value, set()).add(key)

    def _unindex(self, key: Key, obj: Object) -> None:
        for name, func in self._index_funcs.items():
            try:
                values = list(func(obj))
            except (KeyError, TypeError, AttributeError, ValueError):
                continue
            for value in values:
                bucket = self._indexes[name].get(value)
                if bucket is not None:
                    bucket.discard(key)
                    if not bucket:
                        del self._indexes[name][value]
