"""The BeforeClusterCreate hook with Cluster API's real topology controller (tests/support/capi_core.py): a
ClusterClass Cluster that takes its endpoint from an InClusterIPPool (examples/control-plane-endpoint/) is held
back by our hook, served by the controller's webhook server over HTTPS, until the controller has written the
address into its spec and topology variable; every version of the infrastructure cluster and the control plane the
topology controller writes carries it. Deleting the Cluster gives the address back to the pool."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

import yaml

from ipam_provider.api.capi import CLAIMS, CLUSTERS
from ipam_provider.common import Object
from ipam_provider.controller import Controller
from ipam_provider.lifecycle_hook import hook_calls
from ipam_provider.runtime.cache.informer import Informer
from ipam_provider.runtime.cache.store import Store
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.serving.certificates import CertificateFiles, ServingCertificate
from ipam_provider.runtime.serving.webhook import WebhookServer
from tests.support.capi_core import (
    CONTROL_PLANES,
    ENDPOINT_VARIABLE,
    EXTENSION_CONFIGS,
    INFRASTRUCTURE_CLUSTERS,
    KUBERNETES_VERSION,
    CoreManager,
    create_cluster_class,
    extension_config,
    rendered_endpoint_host,
    rendered_vip,
)
from tests.support.cluster import wait_for
from tests.support.objects import POOLS, pool
from tests.system.endpoints.test_endpoints import EXAMPLES, free_of, wait_condition
from tests.system.endpoints.test_topology_harness import discovered
from tools.controlplane.pki import write_pki


def example_cluster(namespace: str, class_name: str) -> Object:
    """examples/control-plane-endpoint/30-clusterclass-cluster.yaml, in `namespace`, over `class_name`."""
    cluster: Object = yaml.safe_load((EXAMPLES / "30-clusterclass-cluster.yaml").read_text())
    cluster["metadata"]["namespace"] = namespace
    cluster["spec"]["topology"].update(classRef={"name": class_name}, version=KUBERNETES_VERSION)
    return cluster


async def test_the_topology_is_rendered_only_with_the_endpoint_from_the_pool(
    kube: KubeClient, in_process_controller: Controller, capi_core_manager: CoreManager, tmp_path: Path
) -> None:
    namespace = capi_core_manager.namespace
    pki = write_pki(tmp_path)
    server = WebhookServer(ServingCertificate.load(CertificateFiles(str(tmp_path), pki["cert"].name, pki["key"].name)))
    await server.start("127.0.0.1", 0)
    server.use({}, hook_calls(lambda: in_process_controller.registry.kinds))
    config = extension_config(
        f"ipam-{namespace}", f"https://127.0.0.1:{server.port}", pki["ca"].read_bytes(), namespace
    )
    seen: list[Object] = []  # every version written of both kinds, as the watch shows it

    def record(_: str, old: Object | None, new: Object | None) -> None:
        if new is not None:
            seen.append(new)

    watched = (INFRASTRUCTURE_CLUSTERS, CONTROL_PLANES)
    informers = [Informer(kube, resource, Store(), record, namespaces=[namespace]) for resource in watched]
    watches = [asyncio.create_task(informer.run()) for informer in informers]
    await kube.create(EXTENSION_CONFIGS, config)
    try:
        await wait_for(lambda: discovered(kube, config["metadata"]["name"]), timeout=30, message="the hook's discovery")
        await create_cluster_class(kube, capi_core_manager)
        await kube.create(POOLS, pool("vips", ["10.10.200.10-10.10.200.29"], 24), namespace)
        await wait_for(lambda: _is(free_of(kube, namespace, "vips"), 20), message="pool vips to count 20 free")
        await kube.create(CLUSTERS, example_cluster(namespace, "harness"), namespace)

        condition = await wait_condition(kube, namespace, "topology", "AddressAllocated")
        assert condition["message"].startswith("10.10.200.10 from InClusterIPPool/")
        await wait_for(lambda: _rendered(kube, namespace), timeout=60, message=lambda: capi_core_manager.log_tail())
        await asyncio.sleep(2)  # versions written right after the first ones are seen too
        kinds = {obj["kind"] for obj in seen}
        assert kinds == {INFRASTRUCTURE_CLUSTERS.kind, CONTROL_PLANES.kind}, kinds
        for obj in seen:
            kind = obj["kind"]
            value = rendered_endpoint_host(obj) if kind == INFRASTRUCTURE_CLUSTERS.kind else rendered_vip(obj)
            assert value == "10.10.200.10", f"{kind} version {obj['metadata']['resourceVersion']} carries {value!r}"
        stored = await kube.get(CLUSTERS, "topology", namespace)
        assert stored is not None
        assert stored["spec"]["controlPlaneEndpoint"] == {"host": "10.10.200.10", "port": 6443}
        assert {"name": ENDPOINT_VARIABLE, "value": "10.10.200.10"} in stored["spec"]["topology"]["variables"]

        await kube.delete(CLUSTERS, "topology", namespace)
        await wait_for(
            lambda: _is(kube.get(CLAIMS, "topology-control-plane-endpoint", namespace), None),
            timeout=60,
            message="the endpoint's claim to go with its Cluster",
        )
        await wait_for(lambda: _is(free_of(kube, namespace, "vips"), 20), message="pool vips to count 20 free again")
    finally:
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await kube.delete(EXTENSION_CONFIGS, config["metadata"]["name"])
        await server.close()


async def _rendered(kube: KubeClient, namespace: str) -> bool:
    infrastructure, _ = await kube.list(INFRASTRUCTURE_CLUSTERS, namespace)
    control_planes, _ = await kube.list(CONTROL_PLANES, namespace)
    return bool(infrastructure and control_planes)


async def _is(value: Awaitable[object], expected: object) -> bool:
    return await value == expected
