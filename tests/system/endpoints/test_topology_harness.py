"""The topology harness itself (tests/support/capi_core.py): Cluster API's real core manager renders a
ClusterClass-based Cluster on the real API server. With no ExtensionConfig registered, nothing holds the topology
back, and the inline patches carry the Cluster's variable into both rendered objects; a stub Runtime Extension
registered for the test's namespace whose BeforeClusterCreate handler answers "retry" holds both back."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from pathlib import Path

from ipam_provider.api.capi import CLUSTERS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tests.support.capi_core import (
    CONTROL_PLANES,
    ENDPOINT_VARIABLE,
    EXTENSION_CONFIGS,
    INFRASTRUCTURE_CLUSTERS,
    KUBERNETES_VERSION,
    CoreManager,
    Object,
    create_cluster_class,
    extension_config,
    rendered_endpoint_host,
    rendered_vip,
    topology_cluster,
)
from tests.support.cluster import wait_for
from tools.controlplane.pki import write_pki

VIP = "192.0.2.10"


async def only(kube: KubeClient, manager: CoreManager, resource: Resource, what: str) -> Object:
    """The one object of `resource` in the manager's namespace, within 60 s; the manager's log if it never comes."""

    async def probe() -> Object | None:
        items, _ = await kube.list(resource, manager.namespace)
        return items[0] if len(items) == 1 else None

    return await wait_for(probe, timeout=60, message=lambda: f"the {what}\n{manager.log_tail()}")


async def test_topology_renders_the_variable_into_both_objects(
    kube: KubeClient, capi_core_manager: CoreManager
) -> None:
    namespace = capi_core_manager.namespace
    await create_cluster_class(kube, capi_core_manager)
    cluster = topology_cluster("harness-1", variables={ENDPOINT_VARIABLE: VIP}, replicas=3)
    await kube.create(CLUSTERS, cluster, namespace)

    infrastructure = await only(kube, capi_core_manager, INFRASTRUCTURE_CLUSTERS, "infrastructure cluster")
    control_plane = await only(kube, capi_core_manager, CONTROL_PLANES, "control plane")
    assert rendered_endpoint_host(infrastructure) == VIP
    assert infrastructure["spec"]["controlPlaneEndpoint"]["port"] == 6443
    assert rendered_vip(control_plane) == VIP
    assert (control_plane["spec"]["version"], control_plane["spec"]["replicas"]) == (KUBERNETES_VERSION, 3)

    async def referenced() -> Object | None:
        stored = await kube.get(CLUSTERS, "harness-1", namespace)
        spec = (stored or {}).get("spec") or {}
        return stored if spec.get("infrastructureRef") and spec.get("controlPlaneRef") else None

    stored = await wait_for(
        referenced, timeout=30, message=lambda: f"the Cluster's refs\n{capi_core_manager.log_tail()}"
    )
    assert stored["spec"]["infrastructureRef"]["name"] == infrastructure["metadata"]["name"]
    assert stored["spec"]["controlPlaneRef"]["name"] == control_plane["metadata"]["name"]


HOOKS = "hooks.runtime.cluster.x-k8s.io/v1alpha1"


class HoldingExtension:
    """A stub Runtime Extension on 127.0.0.1 over HTTPS: one BeforeClusterCreate handler, `hold`, that answers
    `retryAfterSeconds: 1` while `holding` is set and records every request body."""

    def __init__(self, directory: Path) -> None:
        self.pki = write_pki(directory)
        self.holding = True
        self.requests: list[Object] = []
        extension = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                answer = extension.answer(self.path.split("?")[0], body)
                payload = json.dumps(answer).encode()
                self.send_response(200 if answer else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *_: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.pki["cert"], self.pki["key"])
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str, body: Object) -> Object:
        """The response to a POST of `body` to `path`; {} for a path it does not serve."""
        if path == f"/{HOOKS}/discovery":
            hook = {"apiVersion": HOOKS, "hook": "BeforeClusterCreate"}
            handler = {"name": "hold", "requestHook": hook, "timeoutSeconds": 5, "failurePolicy": "Fail"}
            return {"apiVersion": HOOKS, "kind": "DiscoveryResponse", "status": "Success", "handlers": [handler]}
        if path == f"/{HOOKS}/beforeclustercreate/hold":
            self.requests.append(body)
            retry = 1 if self.holding else 0
            return {
                "apiVersion": HOOKS,
                "kind": "BeforeClusterCreateResponse",
                "status": "Success",
                "retryAfterSeconds": retry,
            }
        return {}


async def test_a_retrying_hook_holds_the_topology_back(
    kube: KubeClient, capi_core_manager: CoreManager, tmp_path: Path
) -> None:
    """With an ExtensionConfig (limited to the test's namespace) whose BeforeClusterCreate handler answers "retry",
    nothing is rendered; once it answers with no retry, both objects are."""
    namespace = capi_core_manager.namespace
    extension = HoldingExtension(tmp_path)
    config = extension_config(f"hold-{namespace}", extension.url, extension.pki["ca"].read_bytes(), namespace)
    await kube.create(EXTENSION_CONFIGS, config)
    try:
        await wait_for(
            lambda: discovered(kube, config["metadata"]["name"]),
            timeout=30,
            message=lambda: f"the extension's discovery\n{capi_core_manager.log_tail()}",
        )
        await create_cluster_class(kube, capi_core_manager)
        await kube.create(CLUSTERS, topology_cluster("held", variables={ENDPOINT_VARIABLE: VIP}), namespace)

        async def called_twice() -> bool:
            return len(extension.requests) >= 2

        await wait_for(called_twice, timeout=30, message=lambda: f"two hook calls\n{capi_core_manager.log_tail()}")
        for resource in (INFRASTRUCTURE_CLUSTERS, CONTROL_PLANES):
            assert (await kube.list(resource, namespace))[0] == [], f"{resource.kind} rendered while held"
        extension.holding = False
        infrastructure = await only(kube, capi_core_manager, INFRASTRUCTURE_CLUSTERS, "infrastructure cluster")
        assert rendered_endpoint_host(infrastructure) == VIP
    finally:
        await kube.delete(EXTENSION_CONFIGS, config["metadata"]["name"])
        extension.server.shutdown()
    request = extension.requests[0]
    assert (request["apiVersion"], request["kind"]) == (HOOKS, "BeforeClusterCreateRequest")
    assert request["cluster"]["metadata"]["name"] == "held" and "status" not in request["cluster"]


async def discovered(kube: KubeClient, name: str) -> Object | None:
    """The ExtensionConfig once the manager has discovered its handlers."""
    stored = await kube.get(EXTENSION_CONFIGS, name)
    return stored if ((stored or {}).get("status") or {}).get("handlers") else None
