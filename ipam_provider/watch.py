"""Step 1 of a claim's path: the work queue's keys, and which keys a watch event enqueues (controller-runtime's
predicates and map functions). The caches and their indexes: `cache.py`.

Claim and IPAddress events enqueue the claim (an IPAddress's also its pool, a little later); deletions also the
claims waiting on the pool; a claim holding a Cluster's endpoint also enqueues its Cluster. A Cluster event enqueues
its claims when its pause state may have changed, and the Cluster itself when it asks for an endpoint (or did). A
pool event
goes to its backend's observer first (the other pools it answers are enqueued later, not for the initial list), then
enqueues the pool and its claims; a status-only change only the waiting claims, once the pool became usable. Claims
are sharded by pool and grouped by namespace (`tenant_of`); a fulfilled claim of an initial list gets the low priority.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ipam_provider.api.capi import ANNOTATION_PAUSED, KindLookup, referenced_pool
from ipam_provider.backend.contract import PoolKind, PoolObserver, PoolRef, reported_free
from ipam_provider.cache import CLUSTER, POOL, Caches
from ipam_provider.common import Object
from ipam_provider.endpoint import ANNOTATION_POOL_NAME, endpoint_claim_of
from ipam_provider.runtime.cache.informer import EventHandler, in_initial_list
from ipam_provider.runtime.workqueue import Priority, WorkQueue

POOL_STATUS_DELAY = 0.5  # an IPAddress change reaches its pool's status counts after this many seconds


@dataclass(frozen=True)
class _NamespacedKey:
    namespace: str
    name: str
    KIND: ClassVar[str] = ""

    def __str__(self) -> str:
        return f"{self.KIND}/{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ClaimKey(_NamespacedKey):
    """An IPAddressClaim, reconciled by the claim reconciler."""

    KIND: ClassVar[str] = "claim"


@dataclass(frozen=True)
class ClusterKey(_NamespacedKey):
    """A Cluster, reconciled by the endpoint reconciler."""

    KIND: ClassVar[str] = "cluster"


@dataclass(frozen=True)
class PoolKey:
    """A pool, reconciled by the pool reconciler."""

    ref: PoolRef

    def __str__(self) -> str:
        return f"pool/{self.ref}"


QueueKey = ClaimKey | PoolKey | ClusterKey
Shard = PoolRef | None  # a key's pool: the queue serves pools in turn; None for a claim whose pool is not served


def tenant_of(key: QueueKey) -> str | None:
    """A key's tenant, which the queue serves in turn before pools: its namespace; None (one tenant of their
    own) for the cluster-scoped pools."""
    return key.ref.namespace if isinstance(key, PoolKey) else key.namespace


class EventHandlers:
    """Maps watch events of claims, IPAddresses, Clusters and pools to queue keys."""

    def __init__(
        self, caches: Caches, queue: WorkQueue[QueueKey], kind_of: KindLookup, observe: PoolObserver = lambda *_: ()
    ) -> None:
        self.caches = caches
        self.queue = queue
        self.kind_of = kind_of
        self.observe_pool = observe  # a pool's backend's observer (`Controller._observe_pool`)

    def enqueue_claim(self, namespace: str, name: str) -> None:
        key = ClaimKey(namespace, name)
        claim = self.caches.claims.get(namespace, name)
        shard: Shard = referenced_pool(claim, self.kind_of) if claim is not None else None
        low = claim is not None and in_initial_list() and fulfilled(claim)
        self.queue.add(key, shard, Priority.LOW if low else Priority.NORMAL)

    def enqueue_pool(self, ref: PoolRef, delay: float = 0.0) -> None:
        self.queue.add_after(PoolKey(ref), delay, ref)

    def pool_changed(self, ref: PoolRef) -> None:
        """A reconciler changed what the pool's status counts: look at the pool soon."""
        self.enqueue_pool(ref, POOL_STATUS_DELAY)

    def _enqueue_claims(self, claims: list[Object], *, waiting_only: bool = False) -> None:
        for claim in claims:
            if waiting_only and (claim.get("status") or {}).get("addressRef"):
                continue
            self.enqueue_claim(claim["metadata"]["namespace"], claim["metadata"]["name"])

    def on_claim(self, type: str, old: Object | None, new: Object | None) -> None:
        obj = new or old
        if obj is None:
            return
        self.enqueue_claim(obj["metadata"]["namespace"], obj["metadata"]["name"])
        self.claim_reconciled(obj)
        ref = referenced_pool(obj, self.kind_of) if type == "DELETED" else None
        if ref is not None:  # released: its address is free now, for claims waiting on the pool
            self._enqueue_claims(self.caches.claims.by_index(POOL, ref), waiting_only=True)

    def claim_reconciled(self, claim: Object | None) -> None:
        """A claim changed (by its watch or its reconcile): a claim holding a Cluster's endpoint enqueues the
        Cluster."""
        if claim is None or not endpoint_claim_of(claim["metadata"].get("labels")):
            return
        if cluster := (claim.get("spec") or {}).get("clusterName"):
            self.queue.add(ClusterKey(claim["metadata"]["namespace"], str(cluster)), None)

    def on_address(self, type: str, old: Object | None, new: Object | None) -> None:
        obj = new or old
        if obj is None:
            return
        claim_name = (obj.get("spec", {}).get("claimRef") or {}).get("name") or obj["metadata"]["name"]
        self.enqueue_claim(obj["metadata"]["namespace"], claim_name)
        ref = referenced_pool(obj, self.kind_of)
        if ref is None:
            return
        self.pool_changed(ref)
        if type == "DELETED":  # an address came free: claims waiting on this pool may now be served
            self._enqueue_claims(self.caches.claims.by_index(POOL, ref), waiting_only=True)

    def on_cluster(self, type: str, old: Object | None, new: Object | None) -> None:
        obj = new or old
        if obj is None:
            return
        meta = obj["metadata"]
        if any(ANNOTATION_POOL_NAME in (o["metadata"].get("annotations") or {}) for o in (old, new) if o is not None):
            self.queue.add(ClusterKey(meta["namespace"], meta["name"]), None)
        if type == "MODIFIED" and old is not None and new is not None and pause_state(old) == pause_state(new):
            return
        self._enqueue_claims(self.caches.claims.by_index(CLUSTER, (meta["namespace"], meta["name"])))

    def on_pool(self, kind: PoolKind) -> EventHandler:
        def handle(type: str, old: Object | None, new: Object | None) -> None:
            obj = new or old
            if obj is None:
                return
            ref = kind.ref(obj["metadata"].get("namespace"), obj["metadata"]["name"])
            self.enqueue_pool(ref)
            concerned = self.observe_pool(kind, old, new)
            if not in_initial_list():
                for other in concerned:
                    self.pool_changed(other)
            waiting_only = False
            if type == "MODIFIED" and old is not None and new is not None and pool_unchanged_for_claims(old, new):
                if not pool_became_usable(old, new):
                    return
                waiting_only = True  # a status change that can serve claims still waiting for an address
            self._enqueue_claims(self.caches.claims.by_index(POOL, ref), waiting_only=waiting_only)

        return handle


def fulfilled(claim: Object) -> bool:
    """Whether a claim names its IPAddress and is not being deleted."""
    return bool((claim.get("status") or {}).get("addressRef")) and not claim["metadata"].get("deletionTimestamp")


def pause_state(cluster: Object) -> tuple[bool, bool]:
    """A Cluster's `spec.paused` and whether it carries the paused annotation."""
    annotations = cluster["metadata"].get("annotations") or {}
    return bool((cluster.get("spec") or {}).get("paused")), ANNOTATION_PAUSED in annotations


def pool_unchanged_for_claims(old: Object, new: Object) -> bool:
    """A status-only change of a pool does not concern its claims."""
    keys = ("generation", "annotations", "deletionTimestamp", "uid")
    return all(old["metadata"].get(k) == new["metadata"].get(k) for k in keys)


def pool_became_usable(old: Object, new: Object) -> bool:
    """Whether a pool's status turned Ready, or reports free addresses where it reported none."""

    def ready(pool: Object) -> bool:
        conditions = (pool.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    return (ready(new) and not ready(old)) or (reported_free(new) > 0 and reported_free(old) == 0)
