"""The pool reconciler: the ProtectPool finalizer, status counts and the pool's Ready condition.

Contract:
- A live pool carries the ProtectPool finalizer, a `Ready` condition from its backend's report, and the
  backend's status fields (for in-cluster pools `ipAddresses{total,free,used,outOfRange}`).
- A deleted pool keeps the finalizer while any IPAddress references it (read fresh from the API server), with
  `Ready=False/Deleting` saying why; the annotation `ipam.cluster.x-k8s.io/skip-validate-delete-webhook` lets
  it go at once (for clusterctl move).
- A paused pool is left alone.
"""

from __future__ import annotations

from typing import Any

import structlog
from pydantic import ValidationError

from ipam_provider.api.capi import (
    ANNOTATION_PAUSED,
    ANNOTATION_SKIP_DELETE_VALIDATION,
    FINALIZER_PROTECT_POOL,
    READY,
    IPAddress,
)
from ipam_provider.api.meta import Condition, set_condition
from ipam_provider.backend.contract import Allocation, PoolKind, PoolRef
from ipam_provider.kube.resources import ADDRESSES
from ipam_provider.reconcile.addresses import allocation_of
from ipam_provider.reconcile.context import Object, ReconcileContext, patch_cached, pool_resource
from ipam_provider.reconcile.events import WARNING

log = structlog.get_logger(__name__)
IN_USE_MESSAGE = "Pool has IPAddresses allocated. Cannot delete Pool until all IPAddresses have been removed."
RETRY_DELETING = 15.0
RESYNC = 60.0  # a live pool is looked at again this often, so that its backend can tidy up


def address_pool_ref(address: Object, kind: PoolKind) -> PoolRef:
    namespace = address["metadata"].get("namespace") if kind.namespaced else None
    return PoolRef(kind.group, kind.kind, namespace, address["spec"]["poolRef"]["name"])


class PoolReconciler:
    def __init__(self, context: ReconcileContext) -> None:
        self.ctx = context

    def addresses_of(self, ref: PoolRef) -> list[Allocation]:
        result = []
        for raw in self.ctx.caches.addresses.by_index("pool", ref):
            try:
                result.append(allocation_of(IPAddress.model_validate(raw)))
            except ValidationError:
                continue
        return result

    async def reconcile(self, kind: PoolKind, namespace: str | None, name: str) -> float | None:
        store = self.ctx.caches.pools.get((kind.group, kind.kind))
        raw = store.get(namespace, name) if store is not None else None
        found = self.ctx.registry.lookup(kind.group, kind.kind)
        if raw is None or found is None or store is None:
            return None
        backend = found[0]
        meta = raw["metadata"]
        annotations = meta.get("annotations") or {}
        finalizers = list(meta.get("finalizers") or [])
        ref = PoolRef(kind.group, kind.kind, namespace, name)
        resource = pool_resource(kind)
        if ANNOTATION_PAUSED in annotations:
            return None
        if meta.get("deletionTimestamp"):
            if FINALIZER_PROTECT_POOL not in finalizers:
                return None
            if ANNOTATION_SKIP_DELETE_VALIDATION not in annotations:
                in_use = await self._addresses_in_use(kind, ref)
                if in_use:
                    message = f"{IN_USE_MESSAGE} ({in_use} remain)"
                    await self._write_status(raw, store, kind, False, "Deleting", message, {}, event=True)
                    return RETRY_DELETING
            remaining = [f for f in finalizers if f != FINALIZER_PROTECT_POOL]
            await patch_cached(self.ctx, store, resource, raw, {"metadata": {"finalizers": remaining}})
            log.info("pool released", pool=str(ref))
            return None
        if FINALIZER_PROTECT_POOL not in finalizers:
            raw = await patch_cached(
                self.ctx,
                store,
                resource,
                raw,
                {"metadata": {"finalizers": [*finalizers, FINALIZER_PROTECT_POOL]}},
            )
        report = await backend.report(ref, raw, self.addresses_of(ref))
        await self._write_status(
            raw,
            store,
            kind,
            report.ready,
            report.reason,
            report.message,
            report.status_fields(),
            event=not report.ready,
        )
        return RESYNC

    async def _addresses_in_use(self, kind: PoolKind, ref: PoolRef) -> int:
        items, _ = await self.ctx.kube.list(ADDRESSES, ref.namespace)
        count = 0
        for item in items:
            pool = item.get("spec", {}).get("poolRef", {})
            if pool.get("kind") == kind.kind and pool.get("apiGroup") == kind.group and pool.get("name") == ref.name:
                count += 1
        return count

    async def _write_status(
        self,
        raw: Object,
        store: Any,
        kind: PoolKind,
        ready: bool,
        reason: str,
        message: str,
        fields: dict[str, Any],
        *,
        event: bool,
    ) -> None:
        status = raw.get("status") or {}
        try:
            current = [Condition.model_validate(c) for c in status.get("conditions") or []]
        except ValidationError:
            current = []
        conditions, changed = set_condition(
            current,
            type=READY,
            status=ready,
            reason=reason,
            message=message,
            generation=raw["metadata"].get("generation"),
        )
        if not changed and all(status.get(k) == v for k, v in fields.items()):
            return
        patch = {"status": {**fields, "conditions": [c.wire() for c in conditions]}}
        await patch_cached(self.ctx, store, pool_resource(kind), raw, patch, subresource="status")
        previous = next((c for c in current if c.type == READY), None)
        if event and (previous is None or previous.reason != reason):
            await self.ctx.recorder.record(raw, WARNING, reason, message)
