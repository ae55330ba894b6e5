"""Control-plane endpoints from pools (docs/control-plane-endpoints.md): what a Cluster's annotations ask for, the
claim that holds its address, the patch that writes the address into the Cluster, and what the Cluster still
lacks (the BeforeClusterCreate hook's answer). Every annotation is a tenant's text: each is checked before use, and
EndpointRefused says what is wrong with it."""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ipam_provider.api.capi import (
    CLAIMS,
    CLUSTER_GROUP,
    CLUSTERS,
    IPAM_GROUP,
    LABEL_CLUSTER_NAME,
)
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION, PoolKind, PoolRef
from ipam_provider.common import Object
from ipam_provider.runtime.kube.resources import SUBDOMAIN_LENGTH, label_problem, subdomain_problem

_PREFIX = "ipam.cluster.x-k8s.io/control-plane-endpoint-"
ANNOTATION_POOL_NAME = _PREFIX + "pool-name"
ANNOTATION_POOL_KIND = _PREFIX + "pool-kind"
ANNOTATION_POOL_API_GROUP = _PREFIX + "pool-api-group"
ANNOTATION_PORT = _PREFIX + "port"
ANNOTATION_VARIABLE = _PREFIX + "variable"
LABEL_ENDPOINT = "ipam.cluster.x-k8s.io/control-plane-endpoint"
"""On the claim that holds a Cluster's control-plane endpoint (value "true")."""
DEFAULT_KIND = "InClusterIPPool"
DEFAULT_PORT = 6443
CLAIM_SUFFIX = "-control-plane-endpoint"

CONDITION = "ControlPlaneEndpointAllocated"
"""The Cluster condition this controller writes (and only this one)."""
REASON_ALLOCATED = "AddressAllocated"
REASON_RESERVED = "EndpointReserved"
REASON_WAITING = "WaitingForAddress"
REASON_INVALID = "EndpointSpecInvalid"
REASON_NOT_AN_ADDRESS = "EndpointNotAnAddress"
REASON_KIND_NOT_SERVED = "PoolKindNotServed"
REASON_NAMESPACE_NOT_ALLOWED = "PoolNamespaceNotAllowed"
REASON_POOL_NOT_FOUND = "PoolNotFound"
REASON_CLAIM_NAME_TAKEN = "ClaimNameTaken"
_VARIABLE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_SHOWN = 80  # characters of a tenant's text that a message quotes


class EndpointRefused(Exception):
    """The Cluster's endpoint request cannot be served: `reason` (a CamelCase condition reason) and a message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class EndpointRequest:
    """What a Cluster asks for: an address of `pool`, served on `port`, and also written into the topology
    variable `variable` (None: none)."""

    pool: PoolRef
    port: int
    variable: str | None


def requested_endpoint(cluster: Object, kinds: Sequence[PoolKind]) -> EndpointRequest | None:
    """The Cluster's request (None: it asks for nothing, having no ANNOTATION_POOL_NAME); raises EndpointRefused
    when an annotation, or the endpoint already set, is malformed, or names a pool that cannot serve it."""
    annotations: Mapping[str, str] = cluster["metadata"].get("annotations") or {}
    if ANNOTATION_POOL_NAME not in annotations:
        return None
    name = annotations[ANNOTATION_POOL_NAME].strip()
    if "/" in name:
        raise EndpointRefused(
            REASON_NAMESPACE_NOT_ALLOWED,
            f"annotation {ANNOTATION_POOL_NAME} is {name[:_SHOWN]!r}, a pool in another namespace: a Cluster's "
            "endpoint comes from a pool of its own namespace or a cluster-scoped pool (such as a "
            "GlobalInClusterIPPool); name one of those",
        )
    if (problem := subdomain_problem(name)) is not None:
        raise EndpointRefused(REASON_INVALID, f"annotation {ANNOTATION_POOL_NAME}: {problem}")
    kind = _pool_kind(annotations, kinds)
    port = _port(cluster, annotations)
    variable = annotations.get(ANNOTATION_VARIABLE, "").strip() or None
    if variable is not None:
        if not _VARIABLE.match(variable) or variable == "builtin":
            raise EndpointRefused(
                REASON_INVALID,
                f"annotation {ANNOTATION_VARIABLE} is {variable[:_SHOWN]!r}, which is not a topology variable name "
                "(letters, digits, '_' and '-', at most 128, not 'builtin')",
            )
        if not isinstance((cluster.get("spec") or {}).get("topology"), dict):
            raise EndpointRefused(
                REASON_INVALID,
                f"annotation {ANNOTATION_VARIABLE} names the topology variable {variable!r}, but the Cluster has no "
                "spec.topology; remove the annotation or use a ClusterClass",
            )
    set_host(cluster)  # a malformed endpoint already set is refused here
    return EndpointRequest(kind.ref(cluster["metadata"]["namespace"], name), port, variable)


def _pool_kind(annotations: Mapping[str, str], kinds: Sequence[PoolKind]) -> PoolKind:
    kind_name = annotations.get(ANNOTATION_POOL_KIND, "").strip() or DEFAULT_KIND
    group = annotations.get(ANNOTATION_POOL_API_GROUP, "").strip() or IPAM_GROUP
    found = next((k for k in kinds if (k.group, k.kind) == (group, kind_name)), None)
    if found is None:
        served = ", ".join(sorted(f"{k.kind}.{k.group}" for k in kinds)) or "none"
        raise EndpointRefused(
            REASON_KIND_NOT_SERVED,
            f"the pool kind {kind_name[:_SHOWN]!r} of API group {group[:_SHOWN]!r} (annotations "
            f"{ANNOTATION_POOL_KIND}, {ANNOTATION_POOL_API_GROUP}) is not served by this controller; served: {served}",
        )
    return found


def _port(cluster: Object, annotations: Mapping[str, str]) -> int:
    """The port: the Cluster's own when its endpoint names one, else the annotation's, else DEFAULT_PORT."""
    endpoint = _endpoint(cluster)
    if endpoint.get("port") not in (None, 0):
        port = endpoint["port"]
        if type(port) is not int or not 0 < port < 65536:
            raise EndpointRefused(
                REASON_INVALID, f"spec.controlPlaneEndpoint.port is {str(port)[:_SHOWN]!r}, not a port (1-65535)"
            )
        return port
    text = annotations.get(ANNOTATION_PORT, "").strip()
    if not text:
        return DEFAULT_PORT
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        raise EndpointRefused(
            REASON_INVALID, f"annotation {ANNOTATION_PORT} is {text[:_SHOWN]!r}, which is not a port (1-65535)"
        )
    return int(text)


def _endpoint(cluster: Object) -> dict[str, Any]:
    endpoint = (cluster.get("spec") or {}).get("controlPlaneEndpoint")
    if endpoint is None:
        return {}
    if not isinstance(endpoint, dict):
        raise EndpointRefused(REASON_INVALID, "spec.controlPlaneEndpoint is not an object with host and port")
    return endpoint


def set_host(cluster: Object) -> str | None:
    """The Cluster's `spec.controlPlaneEndpoint.host` when one is set (canonical text when it is an IP address),
    else None; raises EndpointRefused when it is not a string."""
    host = _endpoint(cluster).get("host")
    if host in (None, ""):
        return None
    if not isinstance(host, str):
        raise EndpointRefused(REASON_INVALID, "spec.controlPlaneEndpoint.host is not a string")
    try:
        return str(ipaddress.ip_address(host.strip()))
    except ValueError:
        return host


def set_address(cluster: Object) -> str | None:
    """The IP address of the endpoint already set, or None (unset); raises EndpointRefused when the host set is not
    an IP address (a DNS name cannot be reserved in a pool)."""
    host = set_host(cluster)
    if host is None:
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise EndpointRefused(
            REASON_NOT_AN_ADDRESS,
            f"spec.controlPlaneEndpoint.host is {host[:_SHOWN]!r}, which is not an IP address, so it cannot be "
            f"reserved in a pool; remove annotation {ANNOTATION_POOL_NAME}, or clear the host to have one allocated",
        ) from None
    return host


def claim_name(cluster_name: str) -> str:
    """The name of the claim holding the Cluster's endpoint: `<cluster>-control-plane-endpoint`, or, when that
    would be too long, the Cluster's name cut and a hash of it in its place."""
    name = cluster_name + CLAIM_SUFFIX
    if len(name) <= SUBDOMAIN_LENGTH:
        return name
    digest = hashlib.sha256(cluster_name.encode()).hexdigest()[:10]
    return f"{cluster_name[: SUBDOMAIN_LENGTH - len(CLAIM_SUFFIX) - 11].rstrip('.-')}-{digest}{CLAIM_SUFFIX}"


def endpoint_claim(cluster: Object, request: EndpointRequest, requested: str | None) -> Object:
    """The IPAddressClaim for the Cluster's endpoint: owned by the Cluster (which `clusterctl move` carries it
    with), named by `claim_name`, asking for `requested` when the endpoint is already set."""
    meta = cluster["metadata"]
    labels = {LABEL_ENDPOINT: "true"}
    if label_problem(meta["name"]) is None:
        labels[LABEL_CLUSTER_NAME] = meta["name"]
    owner = {
        "apiVersion": CLUSTERS.api_version,
        "kind": CLUSTERS.kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    claim_meta: Object = {
        "name": claim_name(meta["name"]),
        "namespace": meta["namespace"],
        "labels": labels,
        "ownerReferences": [owner],
    }
    if requested is not None:
        claim_meta["annotations"] = {REQUESTED_ADDRESS_ANNOTATION: requested}
    pool_ref = {"apiGroup": request.pool.group, "kind": request.pool.kind, "name": request.pool.name}
    spec = {"poolRef": pool_ref, "clusterName": meta["name"]}
    return {"apiVersion": CLAIMS.api_version, "kind": CLAIMS.kind, "metadata": claim_meta, "spec": spec}


def endpoint_claim_of(labels: Mapping[str, str] | None) -> bool:
    """Whether a claim of these labels holds a Cluster's endpoint (LABEL_ENDPOINT)."""
    return (labels or {}).get(LABEL_ENDPOINT) == "true"


def owned_by(claim: Object, cluster: Object) -> bool:
    """Whether the claim's controller owner is this Cluster (by uid)."""
    uid = cluster["metadata"].get("uid")
    return any(
        ref.get("kind") == CLUSTERS.kind
        and str(ref.get("apiVersion", "")).split("/")[0] == CLUSTER_GROUP
        and ref.get("uid") == uid
        and ref.get("controller")
        for ref in claim["metadata"].get("ownerReferences") or []
    )


def endpoint_patch(cluster: Object, request: EndpointRequest, address: str) -> Object | None:
    """The merge patch of the Cluster's spec that writes `address` where it is still missing (its endpoint, the
    topology variable), or None when nothing is: what is set is never overwritten."""
    spec: Object = {}
    if set_host(cluster) is None:
        spec["controlPlaneEndpoint"] = {"host": address, "port": request.port}
    if request.variable is not None:
        variables, found = _variable(cluster, request.variable)
        if found is None:
            spec["topology"] = {"variables": [*variables, {"name": request.variable, "value": address}]}
        elif found.get("value") in (None, ""):
            replaced = [{**v, "value": address} if v is found else v for v in variables]
            spec["topology"] = {"variables": replaced}
    return {"spec": spec} if spec else None


def missing(cluster: Object, request: EndpointRequest) -> str | None:
    """What of the endpoint the Cluster still lacks, said for a person (None: nothing)."""
    if set_host(cluster) is None:
        return "spec.controlPlaneEndpoint"
    if request.variable is not None:
        _, found = _variable(cluster, request.variable)
        if found is None or found.get("value") in (None, ""):
            return f"the topology variable {request.variable!r}"
    return None


def _variable(cluster: Object, name: str) -> tuple[list[Any], dict[str, Any] | None]:
    """The Cluster's topology variables, and the one called `name` (None: absent)."""
    variables = list((cluster["spec"].get("topology") or {}).get("variables") or [])
    return variables, next((v for v in variables if isinstance(v, dict) and v.get("name") == name), None)
