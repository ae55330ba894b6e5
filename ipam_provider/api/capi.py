"""Cluster API resources and shapes: IPAddressClaim and IPAddress (ipam v1beta2), Cluster and Machine (v1beta2) with
their API groups, and the object metadata and conditions (metav1) they carry; only what we use. Also how they name
pools: the pool an IPAddressClaim or IPAddress references, and whether an IPAddress names a given pool; every place
that needs either asks here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ipam_provider.backend.contract import Allocation, PoolKind, PoolRef
from ipam_provider.runtime.kube.bounds import CONDITION_MESSAGE_LENGTH, cut_message
from ipam_provider.runtime.kube.resources import Resource, now_rfc3339

IPAM_GROUP = "ipam.cluster.x-k8s.io"
CLUSTER_GROUP = "cluster.x-k8s.io"

CLAIMS = Resource(IPAM_GROUP, "v1beta2", "ipaddressclaims", "IPAddressClaim", namespaced=True)
ADDRESSES = Resource(IPAM_GROUP, "v1beta2", "ipaddresses", "IPAddress", namespaced=True)
CLUSTERS = Resource(CLUSTER_GROUP, "v1beta2", "clusters", "Cluster", namespaced=True)
MACHINES = Resource(CLUSTER_GROUP, "v1beta2", "machines", "Machine", namespaced=True)

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


class Model(BaseModel):
    """Base for API shapes: camelCase on the wire, unknown fields kept."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class OwnerReference(Model):
    api_version: str = Field(alias="apiVersion")
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = Field(default=None, alias="blockOwnerDeletion")


class ObjectMeta(Model):
    name: str
    namespace: str | None = None
    uid: str = ""
    resource_version: str = Field(default="", alias="resourceVersion")
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[OwnerReference] = Field(default_factory=list, alias="ownerReferences")
    deletion_timestamp: str | None = Field(default=None, alias="deletionTimestamp")

    @property
    def deleting(self) -> bool:
        return self.deletion_timestamp is not None


class Condition(Model):
    type: str
    status: str
    reason: str
    message: str = ""
    last_transition_time: str = Field(alias="lastTransitionTime")
    observed_generation: int | None = Field(default=None, alias="observedGeneration")


def set_condition(
    conditions: Sequence[Condition], type: str, status: bool, reason: str, message: str, generation: int | None
) -> tuple[list[Condition], bool]:
    """The conditions with `type` set (its transition time moves when its status flips), and whether they changed.
    The message is cut to what the API accepts (CONDITION_MESSAGE_LENGTH): every condition we write passes here."""
    message = cut_message(message, CONDITION_MESSAGE_LENGTH)
    wanted = "True" if status else "False"
    previous = find_condition(conditions, type)
    transition = previous.last_transition_time if previous is not None and previous.status == wanted else now_rfc3339()
    updated = Condition(
        type=type,
        status=wanted,
        reason=reason,
        message=message,
        last_transition_time=transition,
        observed_generation=generation,
    )
    if previous is None:
        return [*conditions, updated], True
    return [updated if c.type == type else c for c in conditions], updated.wire() != previous.wire()


def find_condition(conditions: Sequence[Condition], type: str) -> Condition | None:
    return next((c for c in conditions if c.type == type), None)


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

    def allocation(self) -> Allocation:
        """The allocation the IPAddress records, its annotations being the backend's bookkeeping."""
        return Allocation(self.spec.address, self.spec.prefix, self.spec.gateway, dict(self.metadata.annotations))


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


KindLookup = Callable[[str, str], PoolKind | None]
"""(apiGroup, kind) → the registered pool kind, or None when no backend serves it."""


def referenced_pool(obj: Mapping[str, Any], kind_of: KindLookup) -> PoolRef | None:
    """The pool an IPAddressClaim or IPAddress names in `spec.poolRef`; None when its kind is not served (or the
    reference is incomplete). A namespaced pool is looked for in the object's own namespace."""
    pool = (obj.get("spec") or {}).get("poolRef") or {}
    name = pool.get("name")
    kind = kind_of(pool.get("apiGroup") or "", pool.get("kind") or "")
    if kind is None or not name:
        return None
    return kind.ref(obj["metadata"].get("namespace"), name)


def addresses_listing(ref: PoolRef) -> str:
    """The kubectl command that lists the IPAddresses of the pool's namespace (every namespace: a cluster-scoped
    pool) with the pool each names, which an admission refusal gives instead of naming them."""
    scope = f"-n {ref.namespace}" if ref.namespace else "-A"
    columns = "NAMESPACE:.metadata.namespace,NAME:.metadata.name,KIND:.spec.poolRef.kind,POOL:.spec.poolRef.name"
    return f"`kubectl get ipaddresses.ipam.cluster.x-k8s.io {scope} -o custom-columns={columns}`"


def names_pool(address: Mapping[str, Any], ref: PoolRef) -> bool:
    """Whether the IPAddress's `spec.poolRef` names the pool `ref` (by group, kind and name: uids may predate a
    restore). A namespaced pool is named only by IPAddresses of its own namespace."""
    pool = (address.get("spec") or {}).get("poolRef") or {}
    if (pool.get("apiGroup") or "", pool.get("kind"), pool.get("name")) != (ref.group, ref.kind, ref.name):
        return False
    return ref.namespace is None or address["metadata"].get("namespace") == ref.namespace
