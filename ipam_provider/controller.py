"""The controller: watches → work queue → reconcilers → backends.

Informers feed the caches and map every change to the claim and pool keys it affects; workers take keys from the
queue (one key per pool at a time, pools in parallel) and run the reconcilers. `stop()` stops taking new keys,
lets in-flight reconciles finish, then stops the watches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from ipam_provider import metrics
from ipam_provider.api.capi import LABEL_CLUSTER_NAME, LABEL_WATCH_FILTER
from ipam_provider.backend.contract import PoolKind, PoolRef, reported_free
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.errors import ApiError
from ipam_provider.kube.resources import ADDRESSES, CLAIMS, CLUSTERS
from ipam_provider.queue.workqueue import WorkQueue
from ipam_provider.reconcile.claims import ClaimReconciler
from ipam_provider.reconcile.context import Caches, ReconcileContext, pool_resource, shard_for
from ipam_provider.reconcile.events import EventRecorder
from ipam_provider.reconcile.pools import PoolReconciler, address_pool_ref
from ipam_provider.watch.informer import Informer
from ipam_provider.watch.store import Object, Store

log = structlog.get_logger(__name__)
Key = tuple[Any, ...]
POOL_STATUS_DELAY = 0.5


@dataclass
class Settings:
    namespaces: list[str] = field(default_factory=list)
    watch_filter: str | None = None
    workers: int = 8
    component: str = "capi-ipam-provider-py"


class Controller:
    def __init__(self, kube: KubeClient, registry: BackendRegistry, settings: Settings) -> None:
        self.kube = kube
        self.registry = registry
        self.settings = settings
        self.caches = Caches(pools={(k.group, k.kind): Store() for k in registry.kinds})
        self.queue: WorkQueue[Key] = WorkQueue()
        self.context = ReconcileContext(
            kube, self.caches, registry, EventRecorder(kube, settings.component), self._pool_changed
        )
        self.claims = ClaimReconciler(self.context)
        self.pools = PoolReconciler(self.context)
        self._kinds = {(k.group, k.kind): k for k in registry.kinds}
        self._add_indexes()
        namespaces = settings.namespaces or None
        selector = f"{LABEL_WATCH_FILTER}={settings.watch_filter}" if settings.watch_filter else None
        self.informers = [
            Informer(
                kube,
                CLAIMS,
                self.caches.claims,
                self._on_claim,
                namespaces=namespaces,
                label_selector=selector,
            ),
            Informer(kube, ADDRESSES, self.caches.addresses, self._on_address, namespaces=namespaces),
            Informer(kube, CLUSTERS, self.caches.clusters, self._on_cluster, namespaces=namespaces),
        ]
        for kind in registry.kinds:
            self.informers.append(
                Informer(
                    kube,
                    pool_resource(kind),
                    self.caches.pools[(kind.group, kind.kind)],
                    self._pool_handler(kind),
                    namespaces=namespaces,
                )
            )
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- indexes and event mapping -------------------------------------------------------------------------

    def _claim_pool_ref(self, claim: Object) -> PoolRef | None:
        pool = claim["spec"]["poolRef"]
        kind = self._kinds.get((pool.get("apiGroup", ""), pool["kind"]))
        if kind is None:
            return None
        namespace = claim["metadata"]["namespace"] if kind.namespaced else None
        return PoolRef(kind.group, kind.kind, namespace, pool["name"])

    def _add_indexes(self) -> None:
        def claim_pool(claim: Object) -> Iterable[Hashable]:
            ref = self._claim_pool_ref(claim)
            return [ref] if ref is not None else []

        def claim_cluster(claim: Object) -> Iterable[Hashable]:
            meta = claim["metadata"]
            name = claim["spec"].get("clusterName") or (meta.get("labels") or {}).get(LABEL_CLUSTER_NAME)
            return [(meta["namespace"], name)] if name else []

        def address_pool(address: Object) -> Iterable[Hashable]:
            pool = address["spec"]["poolRef"]
            kind = self._kinds.get((pool.get("apiGroup", ""), pool["kind"]))
            return [address_pool_ref(address, kind)] if kind is not None else []

        self.caches.claims.add_index("pool", claim_pool)
        self.caches.claims.add_index("cluster", claim_cluster)
        self.caches.addresses.add_index("pool", address_pool)

    def _enqueue_claim(self, namespace: str, name: str) -> None:
        self.queue.add(("claim", namespace, name), self.claims.shard_of(namespace, name))

    def _enqueue_pool(self, ref: PoolRef, delay: float = 0.0) -> None:
        key = ("pool", ref.group, ref.kind, ref.namespace, ref.name)
        self.queue.add_after(key, delay, shard_for(ref))

    def _pool_changed(self, ref: PoolRef) -> None:
        self._enqueue_pool(ref, POOL_STATUS_DELAY)

    def _on_claim(self, type: str, old: Object | None, new: Object | None) -> None:
        obj = new or old
        if obj is not None:
            self._enqueue_claim(obj["metadata"]["namespace"], obj["metadata"]["name"])

    def _on_address(self, type: str, old: Object | None, new: Object | None) -> None:
        obj = new or old
        if obj is None:
            return
        namespace = obj["metadata"]["namespace"]
        claim_name = (obj.get("spec", {}).get("claimRef") or {}).get("name") or obj["metadata"]["name"]
        self._enqueue_claim(namespace, claim_name)
        pool = obj.get("spec", {}).get("poolRef") or {}
        kind = self._kinds.get((pool.get("apiGroup", ""), pool.get("kind", "")))
        if kind is None:
            return
        ref = address_pool_ref(obj, kind)
        self._enqueue_pool(ref, POOL_STATUS_DELAY)
        if type == "DELETED":  # an address came free: claims waiting on this pool may now be served
            for claim in self.caches.claims.by_index("pool", ref):
                if not (claim.get("status") or {}).get("addressRef"):
                    self._enqueue_claim(claim["metadata"]["namespace"], claim["metadata"]["name"])

    def _on_cluster(self, type: str, old: Object | None, new: Object | None) -> None:
        obj = new or old
        if obj is None:
            return
        if type == "MODIFIED" and old is not None and new is not None and _pause_state(old) == _pause_state(new):
            return
        for claim in self.caches.claims.by_index("cluster", (obj["metadata"]["namespace"], obj["metadata"]["name"])):
            self._enqueue_claim(claim["metadata"]["namespace"], claim["metadata"]["name"])

    def _pool_handler(self, kind: PoolKind) -> Any:
        def handle(type: str, old: Object | None, new: Object | None) -> None:
            obj = new or old
            if obj is None:
                return
            ref = PoolRef(kind.group, kind.kind, obj["metadata"].get("namespace"), obj["metadata"]["name"])
            self._enqueue_pool(ref)
            waiting_only = False
            if type == "MODIFIED" and old is not None and new is not None and _pool_unchanged_for_claims(old, new):
                if not _pool_became_usable(old, new):
                    return
                waiting_only = True  # a status change that can serve claims still waiting for an address
            for claim in self.caches.claims.by_index("pool", ref):
                if waiting_only and (claim.get("status") or {}).get("addressRef"):
                    continue
                self._enqueue_claim(claim["metadata"]["namespace"], claim["metadata"]["name"])

        return handle

    # --- running -------------------------------------------------------------------------------------------

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Run until `stop()`; `ready` is set once every cache has synced and workers run.

        `stop()` is honoured at any time, also while the caches are still syncing (an unreachable API server, a
        403 at start): then no worker starts and `run` returns as soon as the watches are cancelled.
        """
        watches = [asyncio.create_task(informer.run()) for informer in self.informers]
        try:
            if not await self._synced_or_stopped():
                log.info("stopped before the caches synced")
                return
            log.info("caches synced", claims=len(self.caches.claims), addresses=len(self.caches.addresses))
            workers = [asyncio.create_task(self._worker(i)) for i in range(self.settings.workers)]
            if ready is not None:
                ready.set()
            await self._stopping.wait()
            self.queue.shutdown()
            await asyncio.gather(*workers)
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            log.info("controller stopped")

    async def _synced_or_stopped(self) -> bool:
        """Wait until every cache has synced (True) or `stop()` was called (False), whichever comes first."""
        synced: asyncio.Future[Any] = asyncio.ensure_future(
            asyncio.gather(*(informer.wait_synced() for informer in self.informers))
        )
        stopping: asyncio.Future[Any] = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({synced, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (synced, stopping):
                future.cancel()
        return synced.done() and not synced.cancelled() and not self._stopping.is_set()

    def stop(self) -> None:
        self._stopping.set()

    @property
    def synced(self) -> bool:
        return all(informer.synced for informer in self.informers)

    async def _worker(self, number: int) -> None:
        """Take keys until the queue shuts down. A failing reconcile (any exception, or a CancelledError that is
        not this task's own cancellation) is logged and retried with backoff; the worker never dies of it."""
        while True:
            item = await self.queue.get()
            if item is None:
                return
            key, shard = item
            started = time.perf_counter()
            result = "success"
            try:
                requeue = await self._dispatch(key)
            except (Exception, asyncio.CancelledError) as error:
                if isinstance(error, asyncio.CancelledError) and _cancelling():
                    raise  # this worker itself is being cancelled
                # Anything else, including a CancelledError a backend let escape (a future cancelled by an
                # executor's shutdown), fails this reconcile only: the worker lives on and the key is retried.
                result = "error"
                delay = self.queue.add_rate_limited(key, shard)
                routine = isinstance(error, ApiError) and error.conflict  # another writer was first: just retry
                (log.debug if routine else log.warning)(
                    "reconcile failed; retrying",
                    key="/".join(str(k) for k in key if k),
                    error=str(error),
                    error_type=type(error).__name__,
                    retry_in=round(delay, 2),
                )
            else:
                self.queue.forget(key)
                if requeue is not None:
                    self.queue.add_after(key, requeue, shard)
            finally:
                self.queue.done(key, shard)
                metrics.observe_reconcile(str(key[0]), result, time.perf_counter() - started, len(self.queue))

    async def _dispatch(self, key: Key) -> float | None:
        if key[0] == "claim":
            return await self.claims.reconcile(key[1], key[2])
        kind = self._kinds[(key[1], key[2])]
        return await self.pools.reconcile(kind, key[3], key[4])


def _cancelling() -> bool:
    """Whether the running task has been asked to cancel (as opposed to a CancelledError from something it
    awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _pause_state(cluster: Object) -> tuple[bool, bool]:
    from ipam_provider.api.capi import ANNOTATION_PAUSED

    annotations = cluster["metadata"].get("annotations") or {}
    return bool((cluster.get("spec") or {}).get("paused")), ANNOTATION_PAUSED in annotations


def _pool_unchanged_for_claims(old: Object, new: Object) -> bool:
    """A status-only change of a pool does not concern its claims."""
    keys = ("generation", "annotations", "deletionTimestamp", "uid")
    return all(old["metadata"].get(k) == new["metadata"].get(k) for k in keys)


def _pool_became_usable(old: Object, new: Object) -> bool:
    """Whether a pool's status turned Ready, or reports free addresses where it reported none."""

    def ready(pool: Object) -> bool:
        conditions = (pool.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    return (ready(new) and not ready(old)) or (reported_free(new) > 0 and reported_free(old) == 0)
