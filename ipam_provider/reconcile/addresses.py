"""The IPAddress that fulfils a claim: its desired shape, and what adoption must add to an existing one."""

from __future__ import annotations

from typing import Any

from ipam_provider.api.capi import (
    FINALIZER_PROTECT_ADDRESS,
    LABEL_CLUSTER_NAME,
    IPAddress,
    IPAddressClaim,
)
from ipam_provider.backend.contract import Allocation, PoolKind
from ipam_provider.kube.resources import ADDRESSES, CLAIMS

Object = dict[str, Any]


def owner_references(claim: IPAddressClaim, kind: PoolKind, pool: Object) -> list[Object]:
    """The claim as controller and the pool as a non-controller owner, both blocking owner deletion."""
    return [
        {
            "apiVersion": CLAIMS.api_version,
            "kind": CLAIMS.kind,
            "name": claim.metadata.name,
            "uid": claim.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        },
        {
            "apiVersion": kind.api_version,
            "kind": kind.kind,
            "name": pool["metadata"]["name"],
            "uid": pool["metadata"]["uid"],
            "controller": False,
            "blockOwnerDeletion": True,
        },
    ]


def desired_address(claim: IPAddressClaim, kind: PoolKind, pool: Object, allocation: Allocation) -> Object:
    labels = {}
    if LABEL_CLUSTER_NAME in claim.metadata.labels:
        labels[LABEL_CLUSTER_NAME] = claim.metadata.labels[LABEL_CLUSTER_NAME]
    elif claim.spec.cluster_name:
        labels[LABEL_CLUSTER_NAME] = claim.spec.cluster_name
    spec: Object = {
        "claimRef": {"name": claim.metadata.name},
        "poolRef": {"apiGroup": kind.group, "kind": kind.kind, "name": pool["metadata"]["name"]},
        "address": allocation.address,
        "prefix": allocation.prefix,
    }
    if allocation.gateway:
        spec["gateway"] = allocation.gateway
    return {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {
            "name": claim.metadata.name,
            "namespace": claim.metadata.namespace,
            "labels": labels,
            "annotations": dict(allocation.annotations),
            "finalizers": [FINALIZER_PROTECT_ADDRESS],
            "ownerReferences": owner_references(claim, kind, pool),
        },
        "spec": spec,
    }


def allocation_of(address: IPAddress) -> Allocation:
    return Allocation(
        address=address.spec.address,
        prefix=address.spec.prefix,
        gateway=address.spec.gateway,
        annotations=dict(address.metadata.annotations),
    )


def belongs_to(address: IPAddress, claim: IPAddressClaim, kind: PoolKind) -> bool:
    """Whether the IPAddress names this claim and its pool (by name: uids may predate a restore)."""
    ref = address.spec.pool_ref
    return (
        address.spec.claim_ref.name == claim.metadata.name
        and ref.kind == kind.kind
        and ref.api_group == kind.group
        and ref.name == claim.spec.pool_ref.name
    )


def adoption_patch(address: Object, claim: IPAddressClaim, kind: PoolKind, pool: Object) -> Object | None:
    """A merge patch adding the owner references, finalizer and cluster label an adopted IPAddress lacks, or
    None if it has them all. The spec is never touched."""
    meta = address["metadata"]
    references = list(meta.get("ownerReferences") or [])
    present = {ref.get("uid") for ref in references}
    wanted = owner_references(claim, kind, pool)
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
    cluster = claim.metadata.labels.get(LABEL_CLUSTER_NAME) or claim.spec.cluster_name
    if cluster and labels.get(LABEL_CLUSTER_NAME) != cluster:
        patch["metadata"]["labels"] = {LABEL_CLUSTER_NAME: cluster}
    return patch if len(patch["metadata"]) > 1 else None
