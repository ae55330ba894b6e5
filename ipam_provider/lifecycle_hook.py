"""Cluster API's Runtime SDK extension of this controller: a `BeforeClusterCreate` lifecycle hook that holds a
topology Cluster back (answers "retry") until it carries the control-plane endpoint its annotations ask for, so
that the topology controller never renders its infrastructure cluster or control plane without it
(docs/control-plane-endpoints.md). Served by the webhook server on every replica, answered from the request alone;
the leader's endpoint reconciler writes the endpoint. `config/runtime-extension/` registers it (an ExtensionConfig).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ipam_provider.backend.contract import PoolKind
from ipam_provider.common import Object
from ipam_provider.endpoint import EndpointRefused, missing, requested_endpoint
from ipam_provider.runtime.serving.webhook import Call, MalformedCall

HOOKS_API_VERSION = "hooks.runtime.cluster.x-k8s.io/v1alpha1"
HANDLER = "control-plane-endpoint"
DISCOVERY_PATH = f"/{HOOKS_API_VERSION}/discovery"
BEFORE_CLUSTER_CREATE_PATH = f"/{HOOKS_API_VERSION}/beforeclustercreate/{HANDLER}"
TIMEOUT_SECONDS = 10
RETRY_WAITING = 1  # seconds: the address is written within a reconcile of the claim and one of the Cluster
RETRY_REFUSED = 10  # seconds: the annotations must be fixed by a person first


def hook_calls(kinds: Callable[[], Sequence[PoolKind]]) -> dict[str, Call]:
    """The extension's paths: discovery, and the `BeforeClusterCreate` handler deciding with the pool `kinds`
    served."""

    async def discovery(body: Any) -> Object:
        _expect(body, "DiscoveryRequest")
        handler = {
            "name": HANDLER,
            "requestHook": {"apiVersion": HOOKS_API_VERSION, "hook": "BeforeClusterCreate"},
            "timeoutSeconds": TIMEOUT_SECONDS,
            "failurePolicy": "Fail",  # with the extension down, no topology Cluster is rendered without endpoint
        }
        return {
            "apiVersion": HOOKS_API_VERSION,
            "kind": "DiscoveryResponse",
            "status": "Success",
            "handlers": [handler],
        }

    async def before_cluster_create(body: Any) -> Object:
        _expect(body, "BeforeClusterCreateRequest")
        cluster = body.get("cluster")
        if not isinstance(cluster, dict) or not isinstance(cluster.get("metadata"), dict):
            raise MalformedCall("the request has no cluster")
        retry, message = endpoint_verdict(cluster, kinds())
        answer: Object = {"apiVersion": HOOKS_API_VERSION, "kind": "BeforeClusterCreateResponse", "status": "Success"}
        if retry:
            answer.update(message=message, retryAfterSeconds=retry)
        return answer

    return {DISCOVERY_PATH: discovery, BEFORE_CLUSTER_CREATE_PATH: before_cluster_create}


def endpoint_verdict(cluster: Object, kinds: Sequence[PoolKind]) -> tuple[int, str]:
    """(seconds to retry after, why) while the Cluster lacks the endpoint it asks for, or cannot get it; (0, "")
    when it may be created: it asks for none, or carries it."""
    try:
        request = requested_endpoint(cluster, kinds)
    except (EndpointRefused, LookupError, TypeError, AttributeError) as refused:  # a hostile request's shapes too
        return RETRY_REFUSED, f"the control-plane endpoint cannot be allocated: {refused}"
    if request is None:
        return 0, ""
    lacking = missing(cluster, request)
    if lacking is None:
        return 0, ""
    return RETRY_WAITING, f"waiting for the control-plane endpoint from {request.pool}: {lacking} is not set yet"


def _expect(body: Any, kind: str) -> None:
    if not isinstance(body, dict) or (body.get("apiVersion"), body.get("kind")) != (HOOKS_API_VERSION, kind):
        raise MalformedCall(f"expected a {HOOKS_API_VERSION} {kind}")
