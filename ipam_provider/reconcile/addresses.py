"""The IPAddress that fulfils a claim: its desired shape, what adoption must add to an existing one, and whether
an existing one is the claim's."""

from __future__ import annotations

from ipam_provider.api.capi import ADDRESSES, CLAIMS, FINALIZER_PROTECT_ADDRESS, LABEL_CLUSTER_NAME, names_pool
from ipam_provider.backend.contract import Allocation
from ipam_provider.common import Object
from ipam_provider.reconcile.context import ClaimWork


def owner_references(work: ClaimWork, pool: Object) -> list[Object]:
    """The claim as controller and the pool as a non-controller owner, both blocking owner deletion."""
    claim_owner = (CLAIMS.api_version, CLAIMS.kind, work.name, work.claim.metadata.uid, True)
    pool_owner = (work.kind.api_version, work.kind.kind, pool["metadata"]["name"], pool["metadata"]["uid"], False)
    keys = ("apiVersion", "kind", "name", "uid", "controller")
    return [{**dict(zip(keys, owner, strict=True)), "blockOwnerDeletion": True} for owner in (claim_owner, pool_owner)]


def cluster_label(work: ClaimWork) -> str | None:
    """The cluster-name label an IPAddress of the claim carries: the claim's own label, else its clusterName."""
    return work.claim.metadata.labels.get(LABEL_CLUSTER_NAME) or work.claim.spec.cluster_name or None


def desired_address(work: ClaimWork, pool: Object, allocation: Allocation) -> Object:
    cluster = cluster_label(work)
    spec: Object = {
        "claimRef": {"name": work.name},
        "poolRef": {"apiGroup": work.kind.group, "kind": work.kind.kind, "name": pool["metadata"]["name"]},
        "address": allocation.address,
        "prefix": allocation.prefix,
    }
    if allocation.gateway:
        spec["gateway"] = allocation.gateway
    return {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {
            "name": work.name,
            "namespace": work.namespace,
            "labels": {LABEL_CLUSTER_NAME: cluster} if cluster else {},
            "annotations": dict(allocation.annotations),
            "finalizers": [FINALIZER_PROTECT_ADDRESS],
            "ownerReferences": owner_references(work, pool),
        },
        "spec": spec,
    }


def belongs_to(address: Object, work: ClaimWork) -> bool:
    """Whether the IPAddress names this claim and its pool (by name: uids may predate a restore)."""
    claim_ref = (address.get("spec") or {}).get("claimRef") or {}
    return claim_ref.get("name") == work.name and names_pool(address, work.pool_ref)


def adoption_patch(address: Object, work: ClaimWork, pool: Object) -> Object | None:
    """A merge patch adding the owner references, finalizer and cluster label an adopted IPAddress lacks, or
    None if it has them all. The spec is never touched."""
    meta = address["metadata"]
    references = list(meta.get("ownerReferences") or [])
    present = {ref.get("uid") for ref in references}
    wanted = owner_references(work, pool)
    if any(ref.get("controller") for ref in references):
        wanted = [ref for ref in wanted if not ref["controller"]]
    missing_refs = [ref for ref in wanted if ref["uid"] not in present]
    finalizers = list(meta.get("finalizers") or [])
    labels = dict(meta.get("labels") or {})
    patch: Object = {"metadata": {"resourceVersion": meta["resourceVersion"]}}
    if missing_refs:
        patch["metadata"]["ownerReferences"] = references + missing_refs
    if FINALIZER_PROTECT_ADDRESS not in finalizers:
        patch["metadata"]["finalizers"] = [*finalizers, FINALIZER_PROTECT_ADDRESS]
    cluster = cluster_label(work)
    if cluster and labels.get(LABEL_CLUSTER_NAME) != cluster:
        patch["metadata"]["labels"] = {LABEL_CLUSTER_NAME: cluster}
    return patch if len(patch["metadata"]) > 1 else None
