"""Admission of pool changes (docs/admission.md): `PoolAdmission.decide` answers a review for any served pool kind,
reading no more than the answer needs; what the core allows goes to the kind's backend's `review_pool_change`. A
check that cannot be made raises (500).

The webhook's caller is not authenticated, so the core's answers name no object, and an answer rests on the pool's
IPAddresses only when the review is about the pool as stored (`_reviews_stored`). Every replica, leader or standby,
answers from its caches; before they have synced, a review that would need a cluster-wide LIST (a cluster-scoped
pool) is refused with code 503, to be retried.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence

import aiohttp
import structlog

from ipam_provider.api.capi import (
    ADDRESSES,
    ANNOTATION_DELETE_FOR_MOVE,
    ANNOTATION_SKIP_DELETE_VALIDATION,
    POOL_IN_USE,
    addresses_listing,
    names_pool,
)
from ipam_provider.backend.contract import AddressInUse, AdmissionReviewer, PoolKind, PoolRef
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.common import Object, listed
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.serving.webhook import ALLOWED, ReviewRequest, Route, Verdict

log = structlog.get_logger(__name__)

LISTED_REASONS = 20  # a backend's reasons joined into one refusal; the rest are counted
# The metadata a review's old object shares with the stored pool when the review is about it (a CREATE: no pool).
IDENTITY = {"UPDATE": ("uid", "resourceVersion"), "DELETE": ("uid",)}
OPTIONAL_READ_SECONDS = 1.0  # a read whose answer is not needed to decide (the verdict stands without it)


class CachesNotSynced(Exception):
    """The check needs every namespace's IPAddresses, and this replica's IPAddress cache has not synced."""


READ_ERRORS = (ApiError, aiohttp.ClientError, OSError, TimeoutError, CachesNotSynced)
NOT_SYNCED = Verdict(
    False,
    503,
    "ServiceUnavailable",
    "this replica cannot check a cluster-scoped pool's IPAddresses before its caches have synced (it is starting); "
    "try again",
)


def webhook_path(kind: PoolKind) -> str:
    """The kubebuilder path of a kind's validating webhook: `/validate-<group, dots as dashes>-<version>-<kind>`."""
    return f"/validate-{kind.group.replace('.', '-')}-{kind.version}-{kind.kind.lower()}"


class PoolAdmission:
    """Decides reviews of pools of the registry's kinds. `cached_addresses(ref)` answers the IPAddresses naming a
    pool from the controller's cache, or None when the cache cannot answer (then they are listed);
    `cached_pools(kind)` the pools of a kind from the controller's cache, or None before it has synced; `synced()`
    whether those caches have synced (`Caches.admission_synced`; in a standby too)."""

    def __init__(
        self,
        kube: KubeClient,
        registry: BackendRegistry,
        cached_addresses: Callable[[PoolRef], Sequence[Object] | None] = lambda ref: None,
        cached_pools: Callable[[PoolKind], Sequence[Object] | None] = lambda kind: None,
        synced: Callable[[], bool] = lambda: False,
    ) -> None:
        self.kube = kube
        self.registry = registry
        self.cached_addresses = cached_addresses
        self.cached_pools = cached_pools
        self.synced = synced

    def routes(self) -> dict[str, Route]:
        """The webhook's routes: one path per kind of the registry."""
        return {
            webhook_path(kind): Route(
                kind.kind, functools.partial(self.decide, path_kind=kind), reads="the pool's IPAddresses"
            )
            for kind in self.registry.kinds
        }

    async def decide(self, request: ReviewRequest, path_kind: PoolKind) -> Verdict:
        """The verdict on `request`, come in at `path_kind`'s path; raises what a LIST it needed raised."""
        try:
            return await self._decide(request, path_kind)
        except CachesNotSynced:
            return NOT_SYNCED

    async def _decide(self, request: ReviewRequest, path_kind: PoolKind) -> Verdict:
        if (request.group, request.kind) != (path_kind.group, path_kind.kind):
            return Verdict(
                False, 400, "BadRequest", f"this path reviews {path_kind.kind}, not {request.kind or 'an object'}"
            )
        if request.operation == "CONNECT":
            return ALLOWED
        if request.operation == "DELETE":
            return await self._decide_delete(request, path_kind)
        pool = request.new
        if pool is None:
            return Verdict(False, 400, "BadRequest", f"the {request.operation} request carries no object")
        if request.old is not None and (request.old.get("spec") or {}) == (pool.get("spec") or {}):
            return ALLOWED  # metadata only: never refused, so nothing is read
        review = self._reviewer(path_kind)
        if review is None:
            return ALLOWED
        ref = _ref(request, path_kind, pool)
        in_use = await self.addresses_in_use(ref)
        if in_use and not await self._reviews_stored(request, path_kind, ref):
            in_use = []  # the spec alone: the answer tells nothing of addresses in use
        return _verdict(request.operation, path_kind, ref, await review(ref, request.old, pool, in_use))

    async def _decide_delete(self, request: ReviewRequest, kind: PoolKind) -> Verdict:
        ref = _ref(request, kind, request.old)
        if not ref.name:
            return Verdict(False, 400, "BadRequest", "the DELETE request names no pool")
        pool = request.old
        if pool is None:
            return Verdict(False, 400, "BadRequest", "the DELETE request carries no oldObject")
        annotations = (pool.get("metadata") or {}).get("annotations") or {}
        if ANNOTATION_DELETE_FOR_MOVE in annotations:
            return ALLOWED
        if ANNOTATION_SKIP_DELETE_VALIDATION in annotations:
            return await self._skipped_delete(request, kind, ref)
        in_use = await self.addresses_in_use(ref)
        if in_use and not await self._reviews_stored(request, kind, ref):
            return ALLOWED  # no stored pool has its uid: the API server deletes no pool on this answer
        if in_use:
            return Verdict(False, 403, "Forbidden", _in_use_refusal(ref, len(in_use)))
        review = self._reviewer(kind)
        if review is None:
            return ALLOWED
        return _verdict(request.operation, kind, ref, await review(ref, pool, None, in_use))

    async def _skipped_delete(self, request: ReviewRequest, kind: PoolKind, ref: PoolRef) -> Verdict:
        """A DELETE under the skip annotation: allowed, with a warning if IPAddresses are known to name the stored
        pool. The caches answer, else reads of at most OPTIONAL_READ_SECONDS whose failure only drops the warning."""
        try:
            async with asyncio.timeout(OPTIONAL_READ_SECONDS):
                in_use = await self.addresses_in_use(ref)
                stored = not in_use or await self._reviews_stored(request, kind, ref)
        except READ_ERRORS as error:
            log.info(
                "deleting a pool under the skip annotation; its IPAddresses not listed",
                pool=str(ref),
                error=str(error) or type(error).__name__,
            )
            return ALLOWED
        if not in_use or not stored:
            return ALLOWED
        return Verdict(
            True,
            warnings=(
                f"{ref} still has {len(in_use)} IPAddress(es) in use; {ANNOTATION_SKIP_DELETE_VALIDATION} lets the "
                f"pool go anyway, and no pool serves them any more ({addresses_listing(ref)} lists them)",
            ),
        )

    async def _reviews_stored(self, request: ReviewRequest, kind: PoolKind, ref: PoolRef) -> bool:
        """Whether the review is about the pool as stored, so that its answer may rest on the pool's IPAddresses:
        for a CREATE, no pool of its name is stored; for an UPDATE, the stored pool has the uid and resourceVersion
        of the review's old object; for a DELETE, its uid. The cache answers when it agrees, else a GET (which
        raises what it raised). A forged review (its requester is not known) thus learns nothing of the addresses
        in use of a pool it cannot read (a uid is random)."""
        fields = IDENTITY.get(request.operation, ())
        wanted = _identity(request.old, fields) if fields else None
        if fields and (wanted is None or not all(wanted)):
            return False
        cached = self.cached_pools(kind)
        if cached is not None and _identity(_named(cached, ref), fields) == wanted:
            return True
        stored = await self.kube.get(pool_resource(kind), ref.name, ref.namespace)
        return _identity(stored, fields) == wanted

    def _reviewer(self, kind: PoolKind) -> AdmissionReviewer | None:
        found = self.registry.lookup(kind.group, kind.kind)
        return self.registry.capabilities(found[0]).review_pool_change if found is not None else None

    async def addresses_in_use(self, ref: PoolRef) -> list[AddressInUse]:
        """The live IPAddresses naming the pool: from the cache if it can answer, else listed (in the pool's
        namespace; in every namespace only when the synced caches do not cover the pool's, with --namespace; before
        they have synced raises CachesNotSynced)."""
        cached = self.cached_addresses(ref)
        if cached is None and ref.namespace is None and not self.synced():
            raise CachesNotSynced()
        items = cached if cached is not None else (await self.kube.list(ADDRESSES, ref.namespace))[0]
        in_use: list[AddressInUse] = []
        for item in items:
            meta = item.get("metadata") or {}
            if meta.get("deletionTimestamp") or not names_pool(item, ref):
                continue
            spec = item.get("spec") or {}
            namespace = str(meta.get("namespace", ""))
            claim = (spec.get("claimRef") or {}).get("name") or meta.get("name", "")
            prefix = spec.get("prefix")
            prefix = prefix if isinstance(prefix, int) and not isinstance(prefix, bool) else None
            name, address = str(meta.get("name", "")), str(spec.get("address", ""))
            in_use.append(AddressInUse(namespace, name, address, f"{namespace}/{claim}", prefix))
        return in_use


def _ref(request: ReviewRequest, kind: PoolKind, pool: Object | None) -> PoolRef:
    """The pool a review is about: the request's name and namespace, else those of its object."""
    meta = (pool or {}).get("metadata") or {}
    namespace = request.namespace or meta.get("namespace")
    return kind.ref(str(namespace) if namespace else None, request.name or str(meta.get("name") or ""))


def _named(pools: Sequence[Object], ref: PoolRef) -> Object | None:
    for item in pools:
        meta = item.get("metadata") or {}
        if meta.get("name") == ref.name and meta.get("namespace") == ref.namespace:
            return item
    return None


def _identity(pool: Object | None, fields: Sequence[str]) -> tuple[str, ...] | None:
    """The pool's metadata `fields` (uid, resourceVersion), or None for no pool; () for a pool and no fields (a
    CREATE's review then matches no stored pool only)."""
    if pool is None:
        return None
    meta = pool.get("metadata") or {}
    return tuple(str(meta.get(name) or "") for name in fields)


def _verdict(operation: str, kind: PoolKind, ref: PoolRef, reasons: Sequence[str]) -> Verdict:
    """Allowed without `reasons`; else refused with the first LISTED_REASONS of them, the rest counted."""
    if not reasons:
        return ALLOWED
    code, reason = (403, "Forbidden") if operation == "DELETE" else (422, "Invalid")
    return Verdict(False, code, reason, f"{kind.kind} {ref.name}: {listed(reasons, LISTED_REASONS, '; ')}")


def _in_use_refusal(ref: PoolRef, count: int) -> str:
    """The refusal of a DELETE: how many IPAddresses name the pool, and how to list them (the requester is not
    known, so none is named)."""
    return (
        f"{POOL_IN_USE} {count} IPAddress(es) name the pool ({addresses_listing(ref)} lists them). Delete their claims "
        f"first, or annotate the pool {ANNOTATION_SKIP_DELETE_VALIDATION} to delete it anyway."
    )
