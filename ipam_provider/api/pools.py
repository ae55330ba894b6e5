"""How Cluster API objects name pools: the pool an IPAddressClaim or IPAddress references, and whether an
IPAddress names a given pool. Every place that needs either asks here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ipam_provider.backend.contract import PoolKind, PoolRef

KindLookup = Callable[[str, str], PoolKind | None]
"""(apiGroup, kind) → the registered pool kind, or None when no backend serves it."""


def referenced_pool(obj: Mapping[str, Any], kind_of: KindLookup) -> PoolRef | None:
    """The pool an IPAddressClaim or IPAddress names in `spec.poolRef`; None when its kind is not served (or the
    reference is incomplete). A namespaced pool is looked for in the object's own namespace."""
    pool = (obj.get("spec") or {}).get("poolRef") or {}
    name = pool.get("name")
    kind = kind_of(pool.get("apiGroup") or "", pool.get("kind") or "")
    if kind is None or not name:
        return None
    return kind.ref(obj["metadata"].get("namespace"), name)


def names_pool(address: Mapping[str, Any], ref: PoolRef) -> bool:
    """Whether the IPAddress's `spec.poolRef` names the pool `ref` (by group, kind and name: uids may predate a
    restore). A namespaced pool is named only by IPAddresses of its own namespace."""
    pool = (address.get("spec") or {}).get("poolRef") or {}
    if (pool.get("apiGroup") or "", pool.get("kind"), pool.get("name")) != (ref.group, ref.kind, ref.name):
        return False
    return ref.namespace is None or address["metadata"].get("namespace") == ref.namespace
