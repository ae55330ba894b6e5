"""Cluster API shapes: IPAddressClaim and IPAddress (ipam v1beta2), Cluster (v1beta2); only what we use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError

from ipam_provider.api.meta import Condition, Model, ObjectMeta

FINALIZER_RELEASE_ADDRESS = "ipam.cluster.x-k8s.io/ReleaseAddress"
FINALIZER_PROTECT_ADDRESS = "ipam.cluster.x-k8s.io/ProtectAddress"
FINALIZER_PROTECT_POOL = "ipam.cluster.x-k8s.io/ProtectPool"
LABEL_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
LABEL_WATCH_FILTER = "cluster.x-k8s.io/watch-filter"
ANNOTATION_PAUSED = "cluster.x-k8s.io/paused"
ANNOTATION_SKIP_DELETE_VALIDATION = "ipam.cluster.x-k8s.io/skip-validate-delete-webhook"
# Set by `clusterctl move` on each object it deletes at the source, after copying it to the target.
ANNOTATION_DELETE_FOR_MOVE = "clusterctl.cluster.x-k8s.io/delete-for-move"

POOL_IN_USE = "Pool has IPAddresses allocated. Cannot delete Pool until all IPAddresses have been removed."  # Go's text
READY = "Ready"
REASON_ALLOCATED = "AddressAllocated"
REASON_POOL_NOT_READY = "PoolNotReady"
REASON_ALLOCATION_FAILED = "AllocationFailed"


class TypedReference(Model):
    api_group: str = Field(default="", alias="apiGroup")
    kind: str
    name: str


class LocalReference(Model):
    name: str


class ClaimSpec(Model):
    pool_ref: TypedReference = Field(alias="poolRef")
    cluster_name: str | None = Field(default=None, alias="clusterName")


class ClaimStatus(Model):
    address_ref: LocalReference | None = Field(default=None, alias="addressRef")
    conditions: list[Condition] = Field(default_factory=list)


class IPAddressClaim(Model):
    metadata: ObjectMeta
    spec: ClaimSpec
    status: ClaimStatus = Field(default_factory=ClaimStatus)

    @property
    def cluster_name(self) -> str | None:
        return self.spec.cluster_name or self.metadata.labels.get(LABEL_CLUSTER_NAME) or None


class IPAddressSpec(Model):
    claim_ref: LocalReference = Field(alias="claimRef")
    pool_ref: TypedReference = Field(alias="poolRef")
    address: str
    prefix: int
    gateway: str | None = None


class IPAddress(Model):
    metadata: ObjectMeta
    spec: IPAddressSpec


class ClusterSpec(Model):
    paused: bool | None = None


class Cluster(Model):
    metadata: ObjectMeta
    spec: ClusterSpec = Field(default_factory=ClusterSpec)

    @property
    def paused(self) -> bool:
        return bool(self.spec.paused) or ANNOTATION_PAUSED in self.metadata.annotations


def cluster_paused(raw: Mapping[str, Any] | None) -> bool:
    """Whether a Cluster object is paused (None, or one that does not parse, is not)."""
    try:
        return raw is not None and Cluster.model_validate(raw).paused
    except ValidationError:
        return False
