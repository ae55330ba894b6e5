"""The controller: informers → event handlers → work queue → reconcilers → backends, and, once the caches have
synced, the repair loop beside them (unless its interval is 0). `stop()` stops taking new keys, lets in-flight
reconciles finish, then stops the repair loop and the watches.

Every replica runs the caches admission reads (IPAddresses and the pools: `start_caches`), leader or standby, as
controller-runtime's manager runs its cache in every replica; their event handlers act only in `run()` (the leader),
which first replays what the caches hold to them. The claim and Cluster informers, the reconcilers and the repair
loop run in the leader only.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Collection, Hashable
from dataclasses import dataclass, field
from typing import Any

import structlog

from ipam_provider.api.capi import ADDRESSES, CLAIMS, CLUSTERS, LABEL_WATCH_FILTER
from ipam_provider.backend.contract import PoolKind, PoolRef
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.cache import Caches
from ipam_provider.common import Object
from ipam_provider.reconcile.claims import ClaimReconciler
from ipam_provider.reconcile.context import ReconcileContext, pool_resource
from ipam_provider.reconcile.endpoints import EndpointReconciler
from ipam_provider.reconcile.pools import PoolReconciler
from ipam_provider.repair import RepairLoop, RepairSettings
from ipam_provider.repair.compare import Scope
from ipam_provider.runtime.cache.informer import EventHandler, Informer
from ipam_provider.runtime.cache.store import Store
from ipam_provider.runtime.events import EventRecorder
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.telemetry import controller as telemetry
from ipam_provider.runtime.workqueue import Tenants, WorkQueue
from ipam_provider.watch import ClaimKey, ClusterKey, EventHandlers, QueueKey, tenant_of

log = structlog.get_logger(__name__)


@dataclass
class ControllerSettings:
    namespaces: list[str] = field(default_factory=list)
    watch_filter: str | None = None
    workers: int = 8
    sync_period: float = 600.0  # seconds (--sync-period=10m): every live pool is reported again this often
    component: str = "capi-ipam-provider-py"
    repair: RepairSettings = field(default_factory=RepairSettings)


class Controller:
    """Serves `registry`'s pool kinds from `caches` (the backends' own, when they were made with its views)."""

    def __init__(
        self, kube: KubeClient, registry: BackendRegistry, settings: ControllerSettings, caches: Caches | None = None
    ) -> None:
        self.kube = kube
        self.registry = registry
        self.settings = settings
        self.caches = caches or Caches()
        self.caches.serve(registry.kinds, registry.kind_of, settings.namespaces)
        # Namespaces are served in turn; one holding a quarter of the workers gets another only while more than a
        # quarter stay idle, so that its stalling backends never take the workers other namespaces' claims need.
        share = Tenants(tenant_of, limit=max(1, settings.workers // 4), workers=settings.workers)
        self.queue: WorkQueue[QueueKey] = WorkQueue(name="ipam", shard_limit=self._shard_limit, tenants=share)
        self.handlers = EventHandlers(self.caches, self.queue, registry.kind_of, self._observe_pool)
        for backend in registry.backends:
            if (accept := registry.capabilities(backend).accept_reporter) is not None:
                accept(self.handlers.pool_changed)
        self.context = ReconcileContext(
            kube, self.caches, registry, EventRecorder(kube, settings.component), self.handlers.pool_changed
        )
        self.claims = ClaimReconciler(self.context)
        self.pools = PoolReconciler(self.context, settings.sync_period)
        self.endpoints = EndpointReconciler(self.context, self.handlers.enqueue_claim)
        self.context.repair_releases = settings.repair.enabled and not settings.repair.report_only
        scope = Scope(settings.namespaces, settings.watch_filter)
        self.repair = RepairLoop(self.context, scope, settings.repair, self.queue.busy)
        self._handling = False  # whether the admission caches' handlers act (from `_sync`: the leader)
        self.informers = self._informers()
        self._cache_tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._traced: dict[QueueKey, str] = {}  # keys failing now → the error type whose traceback was logged

    def _shard_limit(self, shard: Hashable) -> int | None:
        """One key of a pool at a time (a slow external system holds one worker), unless its backend serves claims
        concurrently."""
        if isinstance(shard, PoolRef):
            found = self.registry.lookup(shard.group, shard.kind)
            if found is not None and not self.registry.capabilities(found[0]).concurrent_claims:
                return 1
        return None

    def _observe_pool(self, kind: PoolKind, old: Object | None, new: Object | None) -> Collection[PoolRef]:
        """Hand a pool's change to its backend's observer (`Capabilities.observe_pool`); the other pools it may
        concern."""
        found = self.registry.lookup(kind.group, kind.kind)
        observe = self.registry.capabilities(found[0]).observe_pool if found is not None else None
        return observe(kind, old, new) if observe is not None else ()

    def _informers(self) -> list[Informer]:
        watch_filter = self.settings.watch_filter
        selector = f"{LABEL_WATCH_FILTER}={watch_filter}" if watch_filter else None
        caches, handlers, gated = self.caches, self.handlers, self._gated
        informer = functools.partial(Informer, self.kube, namespaces=self.settings.namespaces or None)
        self.pool_informers = [
            informer(pool_resource(kind), caches.pools[(kind.group, kind.kind)], gated(handlers.on_pool(kind)))
            for kind in self.registry.kinds
        ]
        addresses = informer(ADDRESSES, caches.addresses, gated(handlers.on_address))
        self.admission_informers = [addresses, *self.pool_informers]
        self.leader_informers = [
            informer(CLAIMS, caches.claims, handlers.on_claim, label_selector=selector),
            informer(CLUSTERS, caches.clusters, handlers.on_cluster),
        ]
        return self.leader_informers + self.admission_informers

    def _gated(self, handler: EventHandler) -> EventHandler:
        """`handler`, acting only once `run()` lets it (`_sync`): until then its informer only keeps its store."""

        def handle(type: str, old: Object | None, new: Object | None) -> None:
            if self._handling:
                handler(type, old, new)

        return handle

    def start_caches(self) -> None:
        """Start the informers of the caches admission reads (IPAddresses, pools), once; every replica calls it."""
        if not self._cache_tasks:
            self._cache_tasks = [asyncio.create_task(informer.run()) for informer in self.admission_informers]

    async def close_caches(self) -> None:
        """Stop the informers `start_caches` started (`run()` does it on its way out)."""
        tasks, self._cache_tasks = self._cache_tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Run until `stop()` (honoured at any time, also while the caches sync); `ready` is set once every cache has
        synced and workers run."""
        self.start_caches()
        watches = [asyncio.create_task(informer.run()) for informer in self.leader_informers]
        watches.append(asyncio.create_task(self._prepare_pools()))
        self.context.recorder.start()
        try:
            if not await self._synced_or_stopped():
                log.info("stopped before the caches synced")
                return
            log.info("caches synced", claims=len(self.caches.claims), addresses=len(self.caches.addresses))
            names = [CLAIM_CONTROLLER, ENDPOINT_CONTROLLER, *(kind.kind.lower() for kind in self.registry.kinds)]
            telemetry.set_max_concurrent_reconciles(names, self.settings.workers)
            workers = [asyncio.create_task(self._worker()) for _ in range(self.settings.workers)]
            # run() is called in the leader only, and so is the repair loop
            repair = asyncio.create_task(self.repair.run()) if self.settings.repair.enabled else None
            if ready is not None:
                ready.set()
            await self._stopping.wait()
            if repair is not None:  # first: it asks the queue which claims are being reconciled
                repair.cancel()
                await asyncio.gather(repair, return_exceptions=True)
            self.queue.shutdown()
            await asyncio.gather(*workers)
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            await self.close_caches()
            await self.context.recorder.close()  # the Events of the last reconciles, for a few seconds at most
            log.info("controller stopped")

    async def _prepare_pools(self) -> None:
        """Once the pool caches have synced (the others may still be syncing), let each backend that can prepare
        every pool it serves (`Capabilities.prepare`), one pool at a time. A failure is logged; nothing waits for
        this."""
        await asyncio.gather(*(informer.wait_synced() for informer in self.pool_informers))
        for kind in self.registry.kinds:
            found = self.registry.lookup(kind.group, kind.kind)
            prepare = self.registry.capabilities(found[0]).prepare if found is not None else None
            if prepare is None:
                continue
            for pool in self.caches.pools[(kind.group, kind.kind)].items():
                ref = kind.ref(pool["metadata"].get("namespace"), pool["metadata"]["name"])
                try:
                    await prepare(ref, pool)
                except Exception as error:  # only a head start is lost: the first allocation does the work
                    log.warning("pool not prepared", pool=str(ref), error=str(error), error_type=type(error).__name__)

    async def _sync(self) -> None:
        """Wait for the leader's own informers (claims, Clusters) to sync; then let the handlers of the caches every
        replica runs act, replaying what those hold (each claim's key is queued under its pool: the claims are
        known by then), and wait for those caches to sync too."""
        await asyncio.gather(*(informer.wait_synced() for informer in self.leader_informers))
        self._handling = True  # in the same step as the replay: no change is missed, none is seen twice
        for informer in self.admission_informers:
            informer.replay()
        await asyncio.gather(*(informer.wait_synced() for informer in self.admission_informers))

    async def _synced_or_stopped(self) -> bool:
        """Wait until every cache has synced (True) or `stop()` was called (False), whichever comes first."""
        synced: asyncio.Future[Any] = asyncio.ensure_future(self._sync())
        stopping: asyncio.Future[Any] = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({synced, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (synced, stopping):
                future.cancel()
        return synced.done() and not synced.cancelled() and not self._stopping.is_set()

    def stop(self) -> None:
        self._stopping.set()

    async def wait_stopping(self) -> None:
        await self._stopping.wait()

    @property
    def synced(self) -> bool:
        return all(informer.synced for informer in self.informers)

    async def _worker(self) -> None:
        """Take keys until the queue shuts down. A failing reconcile (any exception, or a CancelledError that is
        not this task's own cancellation) is logged and retried with backoff; the worker never dies of it."""
        while True:
            item = await self.queue.get()
            if item is None:
                return
            key, shard = item
            controller = controller_name(key)
            started = telemetry.reconcile_started(controller)
            result: str | None = None  # None: cut off by this worker's own cancellation, not counted
            try:
                requeue = await self._dispatch(key)
            except (Exception, asyncio.CancelledError) as error:
                task = asyncio.current_task()
                if isinstance(error, asyncio.CancelledError) and task is not None and task.cancelling() > 0:
                    raise  # this worker itself is being cancelled
                # Anything else, including a CancelledError a backend let escape (a future cancelled by an
                # executor's shutdown), fails this reconcile only: the worker lives on and the key is retried.
                result = telemetry.ERROR
                self._retry(key, shard, error)
            else:
                result = telemetry.reconcile_result(requeue)
                self._succeeded(key)
                if requeue is not None:
                    self.queue.add_after(key, requeue, shard)
            finally:
                self.queue.done(key, shard)
                self._reconciled(key)
                telemetry.reconcile_finished(controller, started, result)
            # A reconcile that needed no request never suspended: let the loop serve other workers' answers before
            # this one takes the next key (after a restart thousands of fulfilled claims are only confirmed).
            await asyncio.sleep(0)

    def _reconciled(self, key: QueueKey) -> None:
        """A reconcile of `key` finished, and with it every write to the objects it keeps (a claim and its
        IPAddress, or a pool): a claim holding a Cluster's endpoint has its Cluster looked at (its own writes
        raise no watch event here), their tombstones the watch has shown go (`Store.forget_tombstone`), and, once its
        object is gone from the cache, what the Event correlator and the context (`ReconcileContext.forget`) keep
        for it."""
        namespace: str | None
        store: Store | None
        if isinstance(key, ClaimKey):
            kind, namespace, name, store = CLAIMS.kind, key.namespace, key.name, self.caches.claims
            self.caches.addresses.forget_tombstone((namespace, name))
            self.handlers.claim_reconciled(store.get(namespace, name))
        elif isinstance(key, ClusterKey):
            kind, namespace, name, store = CLUSTERS.kind, key.namespace, key.name, self.caches.clusters
        else:
            kind, namespace, name = key.ref.kind, key.ref.namespace, key.ref.name
            store = self.caches.pools.get((key.ref.group, key.ref.kind))
        if store is not None:
            store.forget_tombstone((namespace, name))
        if store is None or store.get(namespace, name) is None:
            self.context.recorder.forget(kind, namespace, name)
            self.context.forget(kind, namespace, name)

    def _succeeded(self, key: QueueKey) -> None:
        """A reconcile of `key` succeeded: its backoff and its failure streak end."""
        self.queue.forget(key)
        self._traced.pop(key, None)

    def _retry(self, key: QueueKey, shard: Hashable, error: BaseException) -> None:
        """Requeue `key` with backoff and log the failure: with its traceback the first time the key's failure
        streak meets an error of this type, else as one line; a conflict or a 429 at debug level, untraced."""
        delay = self.queue.add_rate_limited(key, shard)
        routine = isinstance(error, ApiError) and (error.conflict or error.throttled)
        error_type = type(error).__name__
        traced = not routine and self._traced.get(key) != error_type
        if traced:
            self._traced[key] = error_type
        (log.debug if routine else log.warning)(
            "reconcile failed; retrying",
            key=str(key),
            error=str(error),
            error_type=error_type,
            failures=self.queue.failures(key),
            retry_in=round(delay, 2),
            exc_info=error if traced else None,
        )

    async def _dispatch(self, key: QueueKey) -> float | None:
        if isinstance(key, ClaimKey):
            return await self.claims.reconcile(key.namespace, key.name)
        if isinstance(key, ClusterKey):
            return await self.endpoints.reconcile(key.namespace, key.name)
        return await self.pools.reconcile(key.ref)


CLAIM_CONTROLLER = "ipaddressclaim"
ENDPOINT_CONTROLLER = "cluster"


def controller_name(key: QueueKey) -> str:
    """The `controller` label of a key's reconcile: `ipaddressclaim`, `cluster` (the endpoint reconciler), or the
    pool kind in lower case."""
    if isinstance(key, ClaimKey):
        return CLAIM_CONTROLLER
    return ENDPOINT_CONTROLLER if isinstance(key, ClusterKey) else key.ref.kind.lower()
