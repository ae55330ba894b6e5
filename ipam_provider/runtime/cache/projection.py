"""What the caches keep of each object (`Store.upsert` projects every object before keeping it):

- claims and IPAddresses (`project_claim`, `project_address`): apiVersion, kind, the metadata in `KEPT_METADATA`,
  spec and status whole;
- Clusters (`project_cluster`): apiVersion, kind, the metadata in `KEPT_METADATA` and `spec.paused`;
- pools (`project_pool`) and anything else (`strip_bookkeeping`, a `Store`'s default): the whole object less
  `metadata.managedFields`, `selfLink` and the last-applied annotation, which the controller never reads.

Every projection but `strip_bookkeeping` interns its keys and short strings (`shared`), so that the names every
object repeats exist once (docs/performance.md). A projection builds a new object; the one given is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from sys import intern
from typing import Any

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


def shared(value: Any) -> Any:
    """A copy of the JSON value with every key and every string of at most SHARED_LENGTH characters interned."""
    kind = type(value)
    if kind is dict:
        return {
            intern(key): intern(item) if type(item) is str and len(item) <= SHARED_LENGTH else shared(item)
            for key, item in value.items()
        }
    if kind is list:
        return [intern(item) if type(item) is str and len(item) <= SHARED_LENGTH else shared(item) for item in value]
    if kind is str and len(value) <= SHARED_LENGTH:
        return intern(value)
    return value


def _annotations(meta: Object, kept: Object) -> None:
    """Drop the last-applied annotation from `kept`'s annotations (a copy; `meta`'s are left alone)."""
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        kept["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}


def kept_metadata(meta: Object) -> Object:
    """The metadata fields in KEPT_METADATA, without the last-applied annotation, their strings shared."""
    kept = {key: meta[key] for key in KEPT_METADATA if key in meta}
    _annotations(meta, kept)
    return {key: shared(value) for key, value in kept.items()}


def _projected(obj: Object, *whole: str) -> Object:
    """apiVersion, kind, the kept metadata and the fields `whole` (as they are) of `obj`, strings shared."""
    projected: Object = {key: shared(obj[key]) for key in ("apiVersion", "kind") if key in obj}
    projected["metadata"] = kept_metadata(obj.get("metadata") or {})
    return projected | {key: shared(obj[key]) for key in whole if key in obj}


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
