"""Control-plane endpoints from pools, against the real API server with the controller in-process: a Cluster that
names a pool gets an address of it in `spec.controlPlaneEndpoint` (and its topology variable), held by a claim the
Cluster owns and released when the Cluster goes; an endpoint already set is reserved, never overwritten; a paused
Cluster gets nothing; each bad input gets the Cluster's condition and an Event saying why, and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ipam_provider.api.capi import ADDRESSES, CLAIMS, CLUSTERS
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION
from ipam_provider.controller import Controller
from ipam_provider.endpoint import (
    ANNOTATION_POOL_KIND,
    ANNOTATION_POOL_NAME,
    ANNOTATION_PORT,
    ANNOTATION_VARIABLE,
    CONDITION,
    LABEL_ENDPOINT,
)
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.objects import POOLS, Object, claim, cluster, pool, wait_address, wait_claim_reason, wait_event

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "control-plane-endpoint"


def endpoint_cluster(
    name: str, pool_name: str, *, spec: Object | None = None, annotations: dict[str, str] | None = None
) -> Object:
    obj = cluster(name)
    obj["metadata"]["annotations"] = {ANNOTATION_POOL_NAME: pool_name, **(annotations or {})}
    obj["spec"].update(spec or {})
    return obj


async def wait_condition(kube: KubeClient, namespace: str, name: str, reason: str) -> Object:
    """Wait until the Cluster's endpoint condition has `reason`; answer the condition."""

    async def probe() -> Object | None:
        found = await kube.get(CLUSTERS, name, namespace)
        conditions = ((found or {}).get("status") or {}).get("conditions") or []
        ours = next((c for c in conditions if c["type"] == CONDITION), None)
        return ours if ours is not None and ours["reason"] == reason else None

    return await wait_for(probe, timeout=30, message=f"Cluster {name} to have {CONDITION} reason {reason}")


async def free_of(kube: KubeClient, namespace: str, name: str) -> int | None:
    found = await kube.get(POOLS, name, namespace)
    free = ((found or {}).get("status") or {}).get("ipAddresses", {}).get("free")
    return int(free) if free is not None else None


async def test_a_cluster_gets_its_endpoint_from_a_pool_and_gives_it_back_when_deleted(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("vips", ["10.70.0.10-10.70.0.12"], 24), namespace)
    await wait_for(lambda: _equal(free_of(kube, namespace, "vips"), 3), message="pool vips to count 3 free")
    await kube.create(CLUSTERS, endpoint_cluster("alpha", "vips"), namespace)

    condition = await wait_condition(kube, namespace, "alpha", "AddressAllocated")
    assert condition["status"] == "True"
    held_by = "held by IPAddressClaim alpha-control-plane-endpoint"
    assert condition["message"] == f"10.70.0.10 from InClusterIPPool/{namespace}/vips, {held_by}"
    found = await kube.get(CLUSTERS, "alpha", namespace)
    assert found is not None and found["spec"]["controlPlaneEndpoint"] == {"host": "10.70.0.10", "port": 6443}
    held = await kube.get(CLAIMS, "alpha-control-plane-endpoint", namespace)
    assert held is not None
    assert held["metadata"]["labels"][LABEL_ENDPOINT] == "true"
    assert held["spec"]["clusterName"] == "alpha"
    [owner] = held["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Cluster", found["metadata"]["uid"], True)
    await wait_for(lambda: _equal(free_of(kube, namespace, "vips"), 2), message="pool vips to count 2 free")
    # A machine's claim never gets the endpoint's address.
    await kube.create(CLAIMS, claim("machine", "vips"), namespace)
    assert (await wait_address(kube, namespace, "machine"))["spec"]["address"] == "10.70.0.11"

    await kube.delete(CLUSTERS, "alpha", namespace)
    await wait_for(
        lambda: _gone(kube.get(ADDRESSES, "alpha-control-plane-endpoint", namespace)),
        message="the endpoint's IPAddress to go with its Cluster",
    )
    await wait_for(lambda: _equal(free_of(kube, namespace, "vips"), 2), message="pool vips to count 2 free again")


async def test_an_endpoint_already_set_is_reserved_in_the_pool_and_never_overwritten(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("vips", ["10.70.1.5-10.70.1.6"], 24), namespace)
    endpoint = {"host": "10.70.1.5", "port": 443}
    await kube.create(CLUSTERS, endpoint_cluster("beta", "vips", spec={"controlPlaneEndpoint": endpoint}), namespace)
    condition = await wait_condition(kube, namespace, "beta", "EndpointReserved")
    assert condition["status"] == "True" and condition["message"].startswith("10.70.1.5 from")
    held = await kube.get(CLAIMS, "beta-control-plane-endpoint", namespace)
    assert held is not None and held["metadata"]["annotations"][REQUESTED_ADDRESS_ANNOTATION] == "10.70.1.5"
    found = await kube.get(CLUSTERS, "beta", namespace)
    assert found is not None and found["spec"]["controlPlaneEndpoint"] == endpoint
    await kube.create(CLAIMS, claim("machine", "vips"), namespace)
    assert (await wait_address(kube, namespace, "machine"))["spec"]["address"] == "10.70.1.6"
    await kube.create(CLAIMS, claim("another", "vips"), namespace)
    await wait_claim_reason(kube, namespace, "another", "PoolExhausted")


async def test_a_topology_cluster_gets_its_variable_and_a_custom_port(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("vips", ["10.70.2.0/30"], 30), namespace)
    variables = [{"name": "other", "value": 7}, {"name": "controlPlaneIpAddr", "value": ""}]
    topology = {"classRef": {"name": "some-class"}, "version": "v1.34.0", "variables": variables}
    obj = endpoint_cluster(
        "gamma",
        "vips",
        spec={"topology": topology},
        annotations={ANNOTATION_VARIABLE: "controlPlaneIpAddr", ANNOTATION_PORT: "8443"},
    )
    await kube.create(CLUSTERS, obj, namespace)
    await wait_condition(kube, namespace, "gamma", "AddressAllocated")
    found = await kube.get(CLUSTERS, "gamma", namespace)
    assert found is not None
    assert found["spec"]["controlPlaneEndpoint"] == {"host": "10.70.2.1", "port": 8443}
    assert found["spec"]["topology"]["variables"] == [
        {"name": "other", "value": 7},
        {"name": "controlPlaneIpAddr", "value": "10.70.2.1"},
    ]


async def test_a_paused_cluster_gets_nothing(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("vips", ["10.70.3.0/30"], 30), namespace)
    obj = endpoint_cluster("paused", "vips", spec={"paused": True})
    await kube.create(CLUSTERS, obj, namespace)
    await kube.create(CLUSTERS, endpoint_cluster("marker", "vips"), namespace)  # served after the paused one
    await wait_condition(kube, namespace, "marker", "AddressAllocated")
    assert await kube.get(CLAIMS, "paused-control-plane-endpoint", namespace) is None
    found = await kube.get(CLUSTERS, "paused", namespace)
    assert found is not None and "controlPlaneEndpoint" not in found["spec"]


BAD_INPUTS: list[tuple[str, dict[str, Any], str, str]] = [
    ("missing", {}, "PoolNotFound", "InClusterIPPool/{ns}/missing was not found; create it, or name another pool"),
    (
        "vips",
        {ANNOTATION_POOL_KIND: "SomeIPPool"},
        "PoolKindNotServed",
        "the pool kind 'SomeIPPool' of API group 'ipam.cluster.x-k8s.io'",
    ),
    ("vips", {ANNOTATION_PORT: "https"}, "EndpointSpecInvalid", "annotation {port} is 'https', which is not a port"),
    ("other/vips", {}, "PoolNamespaceNotAllowed", "is 'other/vips', a pool in another namespace"),
    ("full", {}, "PoolExhausted", "IPAddressClaim bad-control-plane-endpoint: "),
]


@pytest.mark.parametrize(("pool_name", "annotations", "reason", "text"), BAD_INPUTS, ids=[b[2] for b in BAD_INPUTS])
async def test_bad_input_is_told_on_the_cluster_and_nothing_else_changes(
    kube: KubeClient,
    namespace: str,
    in_process_controller: Controller,
    pool_name: str,
    annotations: dict[str, str],
    reason: str,
    text: str,
) -> None:
    await kube.create(POOLS, pool("vips", ["10.70.4.0/30"], 30), namespace)
    await kube.create(POOLS, pool("full", ["10.70.5.1"], 30), namespace)
    await kube.create(CLAIMS, claim("holder", "full"), namespace)
    await wait_address(kube, namespace, "holder")
    await kube.create(CLUSTERS, endpoint_cluster("bad", pool_name, annotations=annotations), namespace)
    expected = text.format(ns=namespace, port=ANNOTATION_PORT)
    condition = await wait_condition(kube, namespace, "bad", reason)
    assert condition["status"] == "False" and expected in condition["message"]
    await wait_event(kube, namespace, in_process_controller, reason, expected)
    found = await kube.get(CLUSTERS, "bad", namespace)
    assert found is not None and "controlPlaneEndpoint" not in found["spec"]


async def test_a_host_that_is_no_address_and_a_claim_name_taken_are_told(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("vips", ["10.70.6.0/30"], 30), namespace)
    named = endpoint_cluster("dns", "vips", spec={"controlPlaneEndpoint": {"host": "api.example.com", "port": 6443}})
    await kube.create(CLUSTERS, named, namespace)
    condition = await wait_condition(kube, namespace, "dns", "EndpointNotAnAddress")
    assert "'api.example.com', which is not an IP address" in condition["message"]
    await kube.create(CLAIMS, claim("taken-control-plane-endpoint", "vips"), namespace)
    await kube.create(CLUSTERS, endpoint_cluster("taken", "vips"), namespace)
    condition = await wait_condition(kube, namespace, "taken", "ClaimNameTaken")
    assert "IPAddressClaim taken-control-plane-endpoint exists and is not this Cluster's" in condition["message"]
    await wait_event(kube, namespace, in_process_controller, "ClaimNameTaken", "taken-control-plane-endpoint")


async def _equal(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _gone(value: Any) -> bool:
    return await value is None


async def test_the_example_cluster_gets_its_endpoint(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    """examples/control-plane-endpoint/ (its pool and plain Cluster), applied in the test's namespace."""
    for name in ("10-inclusterippool.yaml", "20-cluster.yaml"):
        doc = yaml.safe_load((EXAMPLES / name).read_text())
        doc["metadata"]["namespace"] = namespace
        await kube.create(POOLS if doc["kind"] == "InClusterIPPool" else CLUSTERS, doc, namespace)
    await wait_condition(kube, namespace, "plain", "AddressAllocated")
    found = await kube.get(CLUSTERS, "plain", namespace)
    assert found is not None and found["spec"]["controlPlaneEndpoint"] == {"host": "10.10.200.10", "port": 6443}
