"""What the caches keep of each object (`Store.upsert` projects every object before keeping it):

- claims and IPAddresses (`project_claim`, `project_address`): apiVersion, kind, the metadata in `KEPT_METADATA`,
  spec and status whole;
- Clusters (`project_cluster`): apiVersion, kind, the metadata in `KEPT_METADATA` and `spec.paused`;
- pools (`project_pool`) and anything else (`strip_bookkeeping`, a `Store`'s default): the whole object less
  `metadata.managedFields`, `selfLink` and the last-applied annotation, which the controller never reads.

Every projection but `strip_bookkeeping` interns its keys and short strings (`shared`), so that the names every
object repeats exist once (docs/performance.md), and keeps containers nested at most MAX_DEPTH levels deep (deeper
ones become DEEP_MARKER: `runtime/kube/bounds.py`), so that no walk of a cached object can exhaust the stack. A
projection builds a new object; the one given is left as it is.
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


def kept_metadata(meta: Object) -> Object:
    """The metadata fields in KEPT_METADATA, without the last-applied annotation, their strings shared."""
    kept = {key: meta[key] for key in KEPT_METADATA if key in meta}
    _annotations(meta, kept)
    return {key: shared(value, 3) for key, value in kept.items()}  # metadata is level 2


def _projected(obj: Object, *whole: str) -> Object:
    """apiVersion, kind, the kept metadata and the fields `whole` (as they are) of `obj`, strings shared."""
    projected: Object = {key: shared(obj[key], 2) for key in ("apiVersion", "kind") if key in obj}
    projected["metadata"] = kept_metadata(obj.get("metadata") or {})
    return projected | {key: shared(obj[key], 2) for key in whole if key in obj}


def project_claim(obj: Object) -> Object:
    """An IPAddressClaim or IPAddress as the caches keep it: KEPT_METADATA, spec and status, strings shared."""
    return _projected(obj, "spec", "status")


project_address = project_claim


def project_cluster(obj: Object) -> Object:
    """A Cluster as the caches keep it: KEPT_METADATA and `spec.paused`."""
    projected = _projected(obj)
    spec = obj.get("spec") or {}
    projected["spec"] = {"paused": spec["paused"]} if "paused" in spec else {}  # a bool: nothing to share
    return projected


def project_pool(obj: Object) -> Object:
    """A pool as the caches keep it: the whole object less the bookkeeping, strings shared."""
    projected: Object = shared(strip_bookkeeping(obj))
    return projected


def strip_bookkeeping(obj: Object) -> Object:
    """The whole object less `metadata.managedFields`, `selfLink` and the last-applied annotation."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return obj
    kept = {key: value for key, value in meta.items() if key not in DROPPED_METADATA}
    _annotations(meta, kept)
    return {**obj, "metadata": kept}
