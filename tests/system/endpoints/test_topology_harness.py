"""The topology harness itself (tests/support/capi_core.py): Cluster API's real core manager renders a
ClusterClass-based Cluster on the real API server. With no ExtensionConfig registered, nothing holds the topology
back, and the inline patches carry the Cluster's variable into both rendered objects."""

from __future__ import annotations

from ipam_provider.api.capi import CLUSTERS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tests.support.capi_core import (
    CONTROL_PLANES,
    ENDPOINT_VARIABLE,
    INFRASTRUCTURE_CLUSTERS,
    KUBERNETES_VERSION,
    CoreManager,
    Object,
    create_cluster_class,
    rendered_endpoint_host,
    rendered_vip,
    topology_cluster,
)
from tests.support.cluster import wait_for

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
