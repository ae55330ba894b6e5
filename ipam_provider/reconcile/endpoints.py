"""The endpoint reconciler: a Cluster that names a pool for its control-plane endpoint (`ipam_provider/endpoint.py`)
→ an IPAddressClaim owned by the Cluster, which the claim reconciler serves like any other → its address in the
Cluster's `spec.controlPlaneEndpoint` and topology variable, where those are still empty. The Cluster's condition
CONDITION says where it stands, with an Event on each change of reason. A paused or deleting Cluster gets nothing.
The claim lives as long as its Cluster: when the Cluster is gone and no garbage collector deleted the claim, this
reconciler does, unless `clusterctl move` is carrying it (`delete-for-move`)."""

from __future__ import annotations

from collections.abc import Callable

import structlog
from pydantic import ValidationError

from ipam_provider.api.capi import (
    ANNOTATION_DELETE_FOR_MOVE,
    CLAIMS,
    CLUSTERS,
    READY,
    Condition,
    cluster_paused,
    set_condition,
)
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION
from ipam_provider.cache import CLUSTER, patch_cached
from ipam_provider.common import Object, normalized_address
from ipam_provider.endpoint import (
    CONDITION,
    REASON_ALLOCATED,
    REASON_CLAIM_NAME_TAKEN,
    REASON_INVALID,
    REASON_POOL_NOT_FOUND,
    REASON_RESERVED,
    REASON_WAITING,
    EndpointRefused,
    EndpointRequest,
    claim_name,
    endpoint_claim,
    endpoint_claim_of,
    endpoint_patch,
    owned_by,
    requested_endpoint,
    set_address,
)
from ipam_provider.reconcile.context import ReconcileContext
from ipam_provider.runtime.events import NORMAL, WARNING
from ipam_provider.runtime.kube.client import apply_patch
from ipam_provider.runtime.kube.errors import ApiError

log = structlog.get_logger(__name__)

RETRY_STALE_CLAIM = 2.0  # a previous Cluster's claim of the same name is going


class EndpointReconciler:
    """Serves the Clusters of `context`'s caches; `enqueue_claim(namespace, name)` has a claim it created
    reconciled (the cache holds it from the create's answer, so its watch event is not seen as a change)."""

    def __init__(self, context: ReconcileContext, enqueue_claim: Callable[[str, str], None]) -> None:
        self.ctx = context
        self.enqueue_claim = enqueue_claim

    async def reconcile(self, namespace: str, name: str) -> float | None:
        """Reconcile one Cluster's endpoint; returns seconds until it should be looked at again, or None."""
        cluster = self.ctx.caches.clusters.get(namespace, name)
        if cluster is None:
            await self._release_orphans(namespace, name)
            return None
        if cluster["metadata"].get("deletionTimestamp") or cluster_paused(cluster):
            return None
        try:
            request = requested_endpoint(cluster, self.ctx.registry.kinds)
            if request is None:
                return None
            return await self._serve(cluster, request)
        except EndpointRefused as refused:
            await self._condition(cluster, False, refused.reason, refused.message)
            return None

    async def _serve(self, cluster: Object, request: EndpointRequest) -> float | None:
        meta = cluster["metadata"]
        name = claim_name(meta["name"])
        claim = self.ctx.caches.claims.get(meta["namespace"], name)
        if claim is not None and not owned_by(claim, cluster):
            return await self._name_taken(cluster, claim)
        if claim is None:
            claim = await self._create_claim(cluster, request)
        address = self._address(claim)
        if address is None:
            await self._condition(cluster, False, *self._waiting(claim, request))
            return None
        patch = endpoint_patch(cluster, request, address)
        if patch is not None:
            cluster = await patch_cached(self.ctx.kube, self.ctx.caches.clusters, CLUSTERS, cluster, patch)
            log.info("control-plane endpoint written", cluster=f"{meta['namespace']}/{meta['name']}", address=address)
        reserved = REQUESTED_ADDRESS_ANNOTATION in (claim["metadata"].get("annotations") or {})
        message = f"{address} from {request.pool}, held by IPAddressClaim {name}"
        await self._condition(cluster, True, REASON_RESERVED if reserved else REASON_ALLOCATED, message)
        return None

    async def _name_taken(self, cluster: Object, claim: Object) -> float | None:
        """The claim of the endpoint's name is not this Cluster's: a previous Cluster's of the same name, which is
        deleted (its Cluster is gone), or anyone else's, which is reported and left alone."""
        meta = claim["metadata"]
        previous = {
            ref.get("kind")
            for ref in meta.get("ownerReferences") or []
            if ref.get("name") == cluster["metadata"]["name"]
        }
        if endpoint_claim_of(meta.get("labels")) and CLUSTERS.kind in previous:
            if not meta.get("deletionTimestamp"):
                await self.ctx.kube.delete(CLAIMS, meta["name"], meta["namespace"], uid=meta.get("uid"))
            return RETRY_STALE_CLAIM
        message = (
            f"IPAddressClaim {meta['name']} exists and is not this Cluster's; the endpoint's claim needs that name: "
            "rename or delete that claim"
        )
        await self._condition(cluster, False, REASON_CLAIM_NAME_TAKEN, message)
        return None

    async def _create_claim(self, cluster: Object, request: EndpointRequest) -> Object:
        body = endpoint_claim(cluster, request, set_address(cluster))
        try:
            created = await self.ctx.kube.create(CLAIMS, body, cluster["metadata"]["namespace"])
        except ApiError as error:
            if error.status == 422:
                raise EndpointRefused(REASON_INVALID, f"the API server refused the claim: {error.message}") from None
            raise  # AlreadyExists included: the claim appears in the cache, and the retry sees whose it is
        self.ctx.caches.claims.upsert(created)
        self.enqueue_claim(created["metadata"]["namespace"], created["metadata"]["name"])
        log.info(
            "control-plane endpoint claimed",
            claim=f"{created['metadata']['namespace']}/{body['metadata']['name']}",
            pool=str(request.pool),
        )
        return created

    def _address(self, claim: Object) -> str | None:
        """The address of the claim's IPAddress, once the claim is fulfilled and the IPAddress cached."""
        ref = ((claim.get("status") or {}).get("addressRef") or {}).get("name")
        found = self.ctx.caches.addresses.get(claim["metadata"]["namespace"], ref) if ref else None
        address = (found or {}).get("spec", {}).get("address")
        return normalized_address(str(address)) if address else None

    def _waiting(self, claim: Object, request: EndpointRequest) -> tuple[str, str]:
        """The reason and message while the claim waits: the pool missing, or the claim's own Ready condition."""
        name = claim["metadata"]["name"]
        if self.ctx.caches.pool(request.pool) is None:
            return REASON_POOL_NOT_FOUND, f"{request.pool} was not found; create it, or name another pool"
        conditions = (claim.get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if isinstance(c, dict) and c.get("type") == READY), None)
        if ready is None or ready.get("status") == "True":
            return REASON_WAITING, f"waiting for IPAddressClaim {name} to be fulfilled from {request.pool}"
        reason = str(ready.get("reason") or REASON_WAITING)
        return reason, f"IPAddressClaim {name}: {ready.get('message') or reason}"

    async def _condition(self, cluster: Object, status: bool, reason: str, message: str) -> None:
        """Write CONDITION on the Cluster's status (a server-side apply of that one condition: the others are Cluster
        API's), made by `set_condition`, with an Event when its reason changes; nothing when it says this already."""
        meta = cluster["metadata"]
        previous = condition_of(cluster)
        try:
            current = [Condition.model_validate(previous)] if previous is not None else []
        except ValidationError:  # not as this controller writes it: replaced
            current = []
        conditions, changed = set_condition(current, CONDITION, status, reason, message, meta.get("generation"))
        if not changed:
            return
        body = {
            "apiVersion": CLUSTERS.api_version,
            "kind": CLUSTERS.kind,
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "status": {"conditions": [c.wire() for c in conditions]},
        }
        updated = await self.ctx.kube.patch(
            CLUSTERS, meta["name"], body, meta["namespace"], subresource="status", form=apply_patch(force=True)
        )
        self.ctx.caches.clusters.upsert(updated)
        if previous is None or previous.get("reason") != reason:
            self.ctx.recorder.record(
                cluster, NORMAL if status or reason == REASON_WAITING else WARNING, reason, message
            )

    async def _release_orphans(self, namespace: str, name: str) -> None:
        """The Cluster is gone: delete its endpoint claims that nothing else deletes (no garbage collector ran, or
        the Cluster was force-deleted); never a claim `clusterctl move` is carrying."""
        for claim in self.ctx.caches.claims.by_index(CLUSTER, (namespace, name)):
            meta = claim["metadata"]
            moving = ANNOTATION_DELETE_FOR_MOVE in (meta.get("annotations") or {})
            if endpoint_claim_of(meta.get("labels")) and not meta.get("deletionTimestamp") and not moving:
                log.info("control-plane endpoint released: its Cluster is gone", claim=f"{namespace}/{meta['name']}")
                await self.ctx.kube.delete(CLAIMS, meta["name"], namespace, uid=meta.get("uid"))


def condition_of(cluster: Object) -> Object | None:
    """The Cluster's CONDITION, as cached."""
    conditions = (cluster.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if isinstance(c, dict) and c.get("type") == CONDITION), None)
