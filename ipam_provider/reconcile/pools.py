"""The pool reconciler: the ProtectPool finalizer, and the pool's status from its backend's report (`Ready`, the
other conditions, `ipAddresses`, the kind's own fields, and the repair loop's `AddressesRecorded`) and its metrics.

A deleted pool keeps its finalizer while IPAddresses name it (`Ready=False/Deleting`), unless it carries the
skip-validate-delete-webhook or clusterctl's delete-for-move annotation. A pool clusterctl is moving is not
reported; a paused one is left alone. A live pool is reported again after its backend's `report_interval`, else the
sync period, stretched by up to a tenth at random; when its status changes, the pools its report names as `related`
are looked at again soon. A pool found gone loses all of its series.
"""

from __future__ import annotations

import dataclasses
import random

import structlog
from pydantic import ValidationError

from ipam_provider import pool_metrics
from ipam_provider.api.capi import (
    ADDRESSES,
    ANNOTATION_DELETE_FOR_MOVE,
    ANNOTATION_PAUSED,
    ANNOTATION_SKIP_DELETE_VALIDATION,
    FINALIZER_PROTECT_POOL,
    POOL_IN_USE,
    READY,
    Condition,
    IPAddress,
    find_condition,
    names_pool,
    set_condition,
)
from ipam_provider.backend.contract import Allocation, PoolRef, PoolReport, ReportCondition
from ipam_provider.cache import POOL, patch_cached
from ipam_provider.common import Object
from ipam_provider.reconcile.context import ReconcileContext, pool_resource
from ipam_provider.runtime.cache.store import Store
from ipam_provider.runtime.events import WARNING
from ipam_provider.runtime.kube.resources import Resource

log = structlog.get_logger(__name__)
RETRY_DELETING = 15.0
RETRY_ALLOCATING = 0.5  # a deleted pool whose claims this process is allocating now: look again soon


class PoolReconciler:
    def __init__(self, context: ReconcileContext, sync_period: float = 600.0) -> None:
        self.ctx = context
        self.sync_period = sync_period

    def addresses_of(self, ref: PoolRef) -> list[Allocation]:
        """The allocations of the cached IPAddresses that name the pool."""
        result = []
        for raw in self.ctx.caches.addresses.by_index(POOL, ref):
            try:
                result.append(IPAddress.model_validate(raw).allocation())
            except ValidationError:
                continue
        return result

    async def reconcile(self, ref: PoolRef) -> float | None:
        """Reconcile one pool; returns seconds until it should be looked at again, or None."""
        store = self.ctx.caches.pools.get((ref.group, ref.kind))
        found = self.ctx.registry.lookup(ref.group, ref.kind)
        raw = store.get(ref.namespace, ref.name) if store is not None else None
        if found is None or store is None:
            return None
        if raw is None:
            pool_metrics.forget_pool(self.ctx.pool_labels(ref))
            self.ctx.repair_conditions.pop(ref, None)
            return None
        backend, kind = found
        meta = raw["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        resource = pool_resource(kind)
        if ANNOTATION_PAUSED in (meta.get("annotations") or {}):
            return None
        if meta.get("deletionTimestamp"):
            return await self._deleting(ref, raw, store, resource)
        if ANNOTATION_DELETE_FOR_MOVE in (meta.get("annotations") or {}):
            return None
        if FINALIZER_PROTECT_POOL not in finalizers:
            patch = {"metadata": {"finalizers": [*finalizers, FINALIZER_PROTECT_POOL]}}
            raw = await patch_cached(self.ctx.kube, store, resource, raw, patch)
        async with self.ctx.backend_turn(backend, ref):
            report = await backend.report(ref, raw, self.addresses_of(ref))
        found_by_repair = self.ctx.repair_conditions.get(ref)
        if found_by_repair is not None:
            report = dataclasses.replace(report, conditions=[*report.conditions, found_by_repair])
        if await self._write_status(raw, store, resource, report, event=not report.ready):
            for other in report.related:
                self.ctx.pool_changed(other)
        self._record(ref, report)
        again = self.ctx.registry.capabilities(backend).report_interval or self.sync_period
        if report.report_again is not None:
            again = min(again, max(report.report_again, 1.0))
        return again * (1 + random.random() / 10)

    def _record(self, ref: PoolRef, report: PoolReport) -> None:
        """Set the pool's gauges from the report its status was written from, and count its waiting claims."""
        labels = self.ctx.pool_labels(ref)
        if report.counts is not None:
            pool_metrics.ALLOCATED.labels(*labels).set(report.counts.used)
            pool_metrics.AVAILABLE.labels(*labels).set(report.counts.free)
        pool_metrics.record_ready(labels, report.ready, report.reason)
        pool_metrics.record_waiting(labels, self.ctx.waiting_claims(ref))

    async def _deleting(self, ref: PoolRef, raw: Object, store: Store, resource: Resource) -> float | None:
        """Hold a deleted pool's finalizer while IPAddresses name it (unless told to skip the check)."""
        meta = raw["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER_PROTECT_POOL not in finalizers:
            return None
        annotations = meta.get("annotations") or {}
        if ANNOTATION_SKIP_DELETE_VALIDATION not in annotations and ANNOTATION_DELETE_FOR_MOVE not in annotations:
            if self.ctx.allocations_under_way(ref):
                return RETRY_ALLOCATING  # an IPAddress for the pool is about to be written
            in_use = await self._addresses_in_use(ref)
            if in_use:
                report = PoolReport(False, "Deleting", f"{POOL_IN_USE} ({in_use} remain)")
                await self._write_status(raw, store, resource, report, event=True)
                self._record(ref, report)
                return RETRY_DELETING
        remaining = [f for f in finalizers if f != FINALIZER_PROTECT_POOL]
        await patch_cached(self.ctx.kube, store, resource, raw, {"metadata": {"finalizers": remaining}})
        log.info("pool released", pool=str(ref))
        return None

    async def _addresses_in_use(self, ref: PoolRef) -> int:
        """How many IPAddresses name the pool: as the cache counts them while it counts any (a lagging cache only
        delays the release), else as the API server does, page by page."""
        cached = len(self.ctx.caches.addresses.by_index(POOL, ref))
        if cached:
            return cached
        found = 0
        async for items, _ in self.ctx.kube.list_pages(ADDRESSES, ref.namespace):  # a page at a time in memory
            found += sum(1 for item in items if names_pool(item, ref))
        return found

    async def _write_status(
        self, raw: Object, store: Store, resource: Resource, report: PoolReport, *, event: bool
    ) -> bool:
        """Write the report's conditions and status fields when they change (answer whether they did); a Warning
        Event when the Ready reason changes with `event` set, and when a `warning` condition enters its state."""
        status = raw.get("status") or {}
        try:
            current = [Condition.model_validate(c) for c in status.get("conditions") or []]
        except ValidationError:
            current = []
        wanted = [ReportCondition(READY, report.ready, report.reason, report.message, warning=event)]
        wanted += [c for c in report.conditions if c.type != READY]
        conditions, changed, generation = current, False, raw["metadata"].get("generation")
        for condition in wanted:
            conditions, one_changed = set_condition(
                conditions, condition.type, condition.status, condition.reason, condition.message, generation
            )
            changed = changed or one_changed
        fields = report.status_fields()
        if not changed and all(status.get(k) == v for k, v in fields.items()):
            return False
        status = {**fields, "conditions": [c.wire() for c in conditions]}
        if await self.ctx.write_status(store, resource, raw, status) is None:
            return False  # refused: its own Event says why
        for condition in wanted:
            if condition.warning and _entered(find_condition(current, condition.type), condition):
                self.ctx.recorder.record(raw, WARNING, condition.reason, condition.message)
        return True


def _entered(previous: Condition | None, condition: ReportCondition) -> bool:
    """Whether `condition` enters its reason (and, but for Ready, where the reason alone counts, its status)."""
    if previous is None or previous.reason != condition.reason:
        return True
    return condition.type != READY and previous.status != ("True" if condition.status else "False")
