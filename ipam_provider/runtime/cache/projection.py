"""What a `Store` keeps of an object (`Store.upsert` projects every object before keeping it).

`strip_bookkeeping`, a store's default, keeps the whole object less `metadata.managedFields`, `selfLink` and the
last-applied annotation. `projected` keeps apiVersion, kind, the metadata in `KEPT_METADATA` and the fields named.
Both build a new object and leave the one given as it is. `shared` interns keys and short strings, so that the names
every object repeats exist once (docs/performance.md), and keeps containers nested at most MAX_DEPTH levels deep
(deeper ones become DEEP_MARKER: `runtime/kube/bounds.py`), so that no walk of a cached object exhausts the stack.
"""

from __future__ import annotations

from collections.abc import Callable
from sys import intern
from typing import Any

from ipam_provider.runtime.kube.bounds import DEEP_MARKER, MAX_DEPTH
from ipam_provider.runtime.kube.resources import Object

Projection = Callable[[Object], Object]
"""A function from an object as the API server sent it to what a cache keeps of it."""

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
DROPPED_METADATA = frozenset({"managedFields", "selfLink"})
KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "deletionTimestamp",
    "creationTimestamp",
)
SHARED_LENGTH = 64  # longer strings (messages, JSON in annotations) are seldom repeated: not interned


def shared(value: Any, level: int = 1) -> Any:
    """A copy of the JSON value with every key and every string of at most SHARED_LENGTH characters interned, and
    every container nested deeper than MAX_DEPTH (`value` being at `level`) replaced by DEEP_MARKER. Its recursion
    is bounded by MAX_DEPTH, whatever the value's depth."""
    kind = type(value)
    if kind is dict:
        return _shared_dict(value, level)
    if kind is list:
        return _shared_list(value, level)
    if kind is str and len(value) <= SHARED_LENGTH:
        return intern(value)
    return value


def _shared_dict(value: dict[str, Any], level: int) -> Any:
    """`shared` of a dict (explicit loops: a third faster than comprehensions calling `shared` for every item)."""
    if level > MAX_DEPTH:
        return DEEP_MARKER
    level += 1
    copy = {}
    for key, item in value.items():
        kind = type(item)
        if kind is str:
            copy[intern(key)] = intern(item) if len(item) <= SHARED_LENGTH else item
        elif kind is dict:
            copy[intern(key)] = _shared_dict(item, level)
        elif kind is list:
            copy[intern(key)] = _shared_list(item, level)
        else:
            copy[intern(key)] = item
    return copy


def _shared_list(value: list[Any], level: int) -> Any:
    """`shared` of a list."""
    if level > MAX_DEPTH:
        return DEEP_MARKER
    level += 1
    copy = []
    for item in value:
        kind = type(item)
        if kind is str:
            copy.append(intern(item) if len(item) <= SHARED_LENGTH else item)
        elif kind is dict:
            copy.append(_shared_dict(item, level))
        elif kind is list:
            copy.append(_shared_list(item, level))
        else:
            copy.append(item)
    return copy


def _annotations(meta: Object, kept: Object) -> None:
    """Drop the last-applied annotation from `kept`'s annotations (a copy; `meta`'s are left alone)."""
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        kept["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}


def projected(obj: Object, *whole: str) -> Object:
    """apiVersion, kind, the metadata in KEPT_METADATA (without the last-applied annotation) and the fields `whole`
    of `obj`, strings shared."""
    meta = obj.get("metadata") or {}
    kept_meta = {key: meta[key] for key in KEPT_METADATA if key in meta}
    _annotations(meta, kept_meta)
    kept: Object = {key: shared(obj[key], 2) for key in ("apiVersion", "kind") if key in obj}
    kept["metadata"] = {key: shared(value, 3) for key, value in kept_meta.items()}  # metadata is level 2
    return kept | {key: shared(obj[key], 2) for key in whole if key in obj}


def strip_bookkeeping(obj: Object) -> Object:
    """The whole object less `metadata.managedFields`, `selfLink` and the last-applied annotation."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return obj
    kept = {key: value for key, value in meta.items() if key not in DROPPED_METADATA}
    _annotations(meta, kept)
    return {**obj, "metadata": kept}
