"""The BeforeClusterCreate hook served by the webhook server over HTTPS (no API server): discovery lists the
handler; a Cluster that asks for no endpoint, or carries it (and its variable), may be created; one still lacking
it, or asking for it wrongly, is answered "retry" with why; a body that is no hook request is answered 400."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from backends.incluster.backend import GLOBAL_IN_CLUSTER_POOL, IN_CLUSTER_POOL
from ipam_provider.common import Object
from ipam_provider.endpoint import ANNOTATION_POOL_KIND, ANNOTATION_POOL_NAME, ANNOTATION_VARIABLE
from ipam_provider.lifecycle_hook import (
    BEFORE_CLUSTER_CREATE_PATH,
    DISCOVERY_PATH,
    HOOKS_API_VERSION,
    RETRY_REFUSED,
    RETRY_WAITING,
    endpoint_verdict,
    hook_calls,
)
from ipam_provider.runtime.serving.certificates import CertificateFiles, ServingCertificate
from ipam_provider.runtime.serving.webhook import WebhookServer

KINDS = [IN_CLUSTER_POOL, GLOBAL_IN_CLUSTER_POOL]


def topology_cluster(annotations: dict[str, str], spec: Object | None = None) -> Object:
    base: Object = {"topology": {"classRef": {"name": "c"}, "version": "v1.34.0"}}
    meta = {"name": "c1", "namespace": "team-a", "uid": "u1", "annotations": annotations}
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": meta,
        "spec": {**base, **(spec or {})},
    }


SET = {"controlPlaneEndpoint": {"host": "10.0.0.5", "port": 6443}}
VARIABLE = {
    "topology": {"classRef": {"name": "c"}, "version": "v1", "variables": [{"name": "vip", "value": "10.0.0.5"}]}
}
VERDICTS: list[tuple[dict[str, str], Object, int, str]] = [
    ({}, {}, 0, ""),
    ({ANNOTATION_POOL_NAME: "vips"}, {}, RETRY_WAITING, "spec.controlPlaneEndpoint is not set yet"),
    ({ANNOTATION_POOL_NAME: "vips"}, SET, 0, ""),
    ({ANNOTATION_POOL_NAME: "vips", ANNOTATION_VARIABLE: "vip"}, SET, RETRY_WAITING, "the topology variable 'vip'"),
    ({ANNOTATION_POOL_NAME: "vips", ANNOTATION_VARIABLE: "vip"}, {**SET, **VARIABLE}, 0, ""),
    ({ANNOTATION_POOL_NAME: "vips", ANNOTATION_POOL_KIND: "Nope"}, {}, RETRY_REFUSED, "'Nope'"),
    ({ANNOTATION_POOL_NAME: "ns/vips"}, {}, RETRY_REFUSED, "a pool in another namespace"),
]


def test_a_request_of_any_shape_is_answered() -> None:
    for value in ("x", [1], None):  # asks for nothing
        assert endpoint_verdict({"metadata": {"annotations": value}, "spec": 7}, KINDS) == (0, "")
    asking = {"annotations": {ANNOTATION_POOL_NAME: "v"}}
    clusters: list[Object] = [{"metadata": {**asking, "namespace": "a"}, "spec": 7}, {"metadata": asking}]
    for cluster in clusters:  # a spec that is no object; no namespace
        retry, message = endpoint_verdict(cluster, KINDS)
        assert retry == RETRY_REFUSED and message.startswith("the control-plane endpoint cannot be allocated")


@pytest.mark.parametrize(("annotations", "spec", "retry", "text"), VERDICTS)
def test_verdicts(annotations: dict[str, str], spec: Object, retry: int, text: str) -> None:
    seconds, message = endpoint_verdict(topology_cluster(annotations, spec), KINDS)
    assert seconds == retry and text in message
    assert bool(message) == bool(retry)


@pytest_asyncio.fixture
async def hook_server() -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    server = WebhookServer(ServingCertificate.load(CertificateFiles(None)))
    await server.start("127.0.0.1", 0)
    server.use({}, hook_calls(lambda: KINDS))
    client_context = ssl.create_default_context()
    client_context.check_hostname = False
    client_context.verify_mode = ssl.CERT_NONE  # the development certificate: self-signed
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context))
    try:
        yield session, f"https://127.0.0.1:{server.port}"
    finally:
        await session.close()
        await server.close()


async def post(served: tuple[aiohttp.ClientSession, str], path: str, body: Any) -> tuple[int, Any]:
    session, base = served
    async with session.post(base + path, data=json.dumps(body).encode()) as reply:
        text = await reply.text()
        return reply.status, json.loads(text) if reply.content_type == "application/json" else text


async def test_discovery_lists_the_handler(hook_server: tuple[aiohttp.ClientSession, str]) -> None:
    status, answer = await post(
        hook_server, DISCOVERY_PATH, {"apiVersion": HOOKS_API_VERSION, "kind": "DiscoveryRequest"}
    )
    assert status == 200
    assert answer["kind"] == "DiscoveryResponse" and answer["status"] == "Success"
    [handler] = answer["handlers"]
    assert handler["requestHook"] == {"apiVersion": HOOKS_API_VERSION, "hook": "BeforeClusterCreate"}
    assert BEFORE_CLUSTER_CREATE_PATH.endswith("/beforeclustercreate/" + handler["name"])


async def test_before_cluster_create_answers_retry_until_the_endpoint_is_there(
    hook_server: tuple[aiohttp.ClientSession, str],
) -> None:
    request = {"apiVersion": HOOKS_API_VERSION, "kind": "BeforeClusterCreateRequest"}
    waiting = topology_cluster({ANNOTATION_POOL_NAME: "vips"})
    status, answer = await post(hook_server, BEFORE_CLUSTER_CREATE_PATH, {**request, "cluster": waiting})
    assert status == 200 and answer["status"] == "Success" and answer["retryAfterSeconds"] == RETRY_WAITING
    assert "InClusterIPPool/team-a/vips" in answer["message"]
    done = topology_cluster({ANNOTATION_POOL_NAME: "vips"}, SET)
    status, answer = await post(hook_server, BEFORE_CLUSTER_CREATE_PATH, {**request, "cluster": done})
    assert status == 200 and answer == {
        "apiVersion": HOOKS_API_VERSION,
        "kind": "BeforeClusterCreateResponse",
        "status": "Success",
    }


@pytest.mark.parametrize(
    ("path", "body", "status", "text"),
    [
        (
            BEFORE_CLUSTER_CREATE_PATH,
            {"apiVersion": HOOKS_API_VERSION, "kind": "BeforeClusterCreateRequest"},
            400,
            "no cluster",
        ),
        (BEFORE_CLUSTER_CREATE_PATH, {"kind": "DiscoveryRequest"}, 400, "expected a"),
        (DISCOVERY_PATH, [1], 400, "expected a"),
        ("/elsewhere", {}, 404, "no handler"),
    ],
)
async def test_what_is_no_hook_request_is_refused(
    hook_server: tuple[aiohttp.ClientSession, str], path: str, body: Any, status: int, text: str
) -> None:
    answered, reply = await post(hook_server, path, body)
    assert answered == status and text in reply
