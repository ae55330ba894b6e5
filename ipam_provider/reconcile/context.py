"""What reconcilers share (the API client, caches, backends and event recorder), and the per-claim work object."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import structlog

from ipam_provider.api.capi import CLUSTERS, READY, IPAddressClaim
from ipam_provider.backend.contract import (
    ClaimContext,
    PoolKind,
    PoolRef,
    ReportCondition,
)
from ipam_provider.backend.protocol import Backend
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.cache import POOL, Caches, patch_cached
from ipam_provider.common import Object
from ipam_provider.endpoint import endpoint_claim_of
from ipam_provider.pool_metrics import PENDING, PoolLabels
from ipam_provider.runtime.cache.informer import name_of
from ipam_provider.runtime.cache.store import Store
from ipam_provider.runtime.events import WARNING, EventRecorder
from ipam_provider.runtime.events.correlator import LRU
from ipam_provider.runtime.kube.bounds import EVENT_MESSAGE_LENGTH, cut_message
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource

log = structlog.get_logger(__name__)
REASON_STATUS_REFUSED = "StatusRefused"


def pool_resource(kind: PoolKind) -> Resource:
    return Resource(kind.group, kind.version, kind.plural, kind.kind, kind.namespaced)


@dataclass
class ReconcileContext:
    kube: KubeClient
    caches: Caches
    registry: BackendRegistry
    recorder: EventRecorder
    pool_changed: Callable[[PoolRef], None] = lambda ref: None
    # The repair loop's findings per pool (the AddressesRecorded condition), which the pool reconciler writes with
    # the conditions of its backend's report.
    repair_conditions: dict[PoolRef, ReportCondition] = field(default_factory=dict)
    repair_releases: bool = True  # whether the repair loop releases leaks (for the messages that rely on it)
    _pool_locks: weakref.WeakValueDictionary[PoolRef, asyncio.Lock] = field(default_factory=weakref.WeakValueDictionary)
    _allocating: collections.Counter[PoolRef] = field(default_factory=collections.Counter)
    _refused: LRU[tuple[str, str | None, str], str] = field(default_factory=lambda: LRU(4096))  # see write_status

    @contextlib.contextmanager
    def allocating(self, ref: PoolRef) -> Iterator[None]:
        """Around a claim's allocation, from the backend call until its IPAddress is written."""
        self._allocating[ref] += 1
        try:
            yield
        finally:
            self._allocating[ref] -= 1
            if not self._allocating[ref]:
                del self._allocating[ref]

    def forget(self, kind: str, namespace: str | None, name: str) -> None:
        """The object is gone: the status refusal noted for it (see `write_status`) goes."""
        self._refused.pop((kind, namespace, name))

    def allocations_under_way(self, ref: PoolRef) -> int:
        """How many claims of the pool this process is allocating now: their IPAddresses are not written yet, so a
        pool being deleted must not be let go before they are."""
        return self._allocating[ref]

    @contextlib.asynccontextmanager
    async def backend_turn(self, backend: Backend, ref: PoolRef) -> AsyncIterator[None]:
        """Around every call of `backend` for `ref`: the pool's turn, unless the backend serves claims concurrently."""
        if self.registry.capabilities(backend).concurrent_claims:
            yield
            return
        lock = self._pool_locks.get(ref)
        if lock is None:
            lock = self._pool_locks[ref] = asyncio.Lock()
        async with lock:
            yield

    def pool_labels(self, ref: PoolRef) -> PoolLabels:
        return PoolLabels.of(self.registry.name_of(ref.group, ref.kind), ref)

    def waiting_claims(self, ref: PoolRef) -> dict[str, int]:
        """The cached live claims of the pool without an address, by Ready reason (`Pending` without one)."""
        waiting: dict[str, int] = {}
        for claim in self.caches.claims.by_index(POOL, ref):
            status = claim.get("status") or {}
            if claim["metadata"].get("deletionTimestamp") or status.get("addressRef"):
                continue
            ready = next((c for c in status.get("conditions") or [] if c.get("type") == READY), None)
            reason = str(ready.get("reason") or PENDING) if ready else PENDING
            waiting[reason] = waiting.get(reason, 0) + 1
        return waiting

    async def write_status(self, store: Store, resource: Resource, obj: Object, status: Object) -> Object | None:
        """`patch_cached` of the object's status subresource; None when the API server refuses the status as
        invalid (422): a Warning Event `StatusRefused` on the object says why (logged once per object and refusal),
        and no error is raised, so that the reconcile is not retried with backoff for a write refused again."""
        meta = obj["metadata"]
        key = (resource.kind, meta.get("namespace"), meta["name"])
        try:
            updated = await patch_cached(self.kube, store, resource, obj, {"status": status}, subresource="status")
        except ApiError as error:
            if error.status != 422:
                raise
            why = cut_message(error.message, EVENT_MESSAGE_LENGTH // 2)
            if self._refused.get(key) != why:
                self._refused.put(key, why)
                log.warning("status refused by the API server", kind=resource.kind, object=name_of(obj), error=why)
            self.recorder.record(obj, WARNING, REASON_STATUS_REFUSED, f"the API server refused the status: {why}")
            return None
        self._refused.pop(key)
        return updated


@dataclass
class ClaimWork:
    """One reconcile of one claim: the claim as cached (`raw`) and parsed (`claim`), always in step (see
    `refresh`), with the backend, kind, reference and cached object of its pool, and a logger bound to both."""

    raw: Object
    claim: IPAddressClaim
    backend: Backend
    kind: PoolKind
    pool_ref: PoolRef
    pool: Object | None
    log: structlog.typing.FilteringBoundLogger

    @property
    def namespace(self) -> str:
        return self.claim.metadata.namespace or ""

    @property
    def name(self) -> str:
        return self.claim.metadata.name

    _context: ClaimContext | None = field(default=None, init=False, repr=False)

    def refresh(self, raw: Object) -> None:
        """Take the claim as the API server last returned it."""
        self.raw = raw
        self.claim = IPAddressClaim.model_validate(raw)
        self._context = None

    def context(self) -> ClaimContext:
        """What the backend may know about the claim: one object until `refresh`, so that it is parsed once."""
        if self._context is None:
            self._context = claim_context(self.claim)
        return self._context


def claim_context(claim: IPAddressClaim) -> ClaimContext:
    cluster = next((r.name for r in claim.metadata.owner_references if r.kind == CLUSTERS.kind and r.controller), None)
    return ClaimContext(
        endpoint_of=cluster if endpoint_claim_of(claim.metadata.labels) and cluster == claim.cluster_name else None,
        namespace=claim.metadata.namespace or "",
        name=claim.metadata.name,
        uid=claim.metadata.uid,
        cluster_name=claim.cluster_name,
        labels=dict(claim.metadata.labels),
        annotations=dict(claim.metadata.annotations),
        owner_references=[ref.wire() for ref in claim.metadata.owner_references],
    )
