"""Hostile shapes on the real API server, as a tenant writes them: a claim whose requested-address annotation holds
40 KB gets its Ready condition (the message cut to metav1.Condition's 32768) and a Warning Event, instead of a status
patch refused with 422 and retried forever; and a Cluster nested deeper than orjson decodes (1,100 levels, in a
topology variable) neither keeps the controller's caches from syncing nor stops claims being served."""

from __future__ import annotations

from typing import Any

import orjson

from ipam_provider.api.capi import CLAIMS, CLUSTERS
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION
from ipam_provider.runtime.kube.bounds import CONDITION_MESSAGE_LENGTH
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import POOLS, claim, pool, ready_condition, wait_address, wait_claim_reason

Object = dict[str, Any]


async def test_a_claim_with_a_40kb_annotation_gets_its_cut_condition_and_an_event(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(POOLS, pool("p", ["10.60.0.0/24"], 24), namespace)
    huge = "1" * 40_000
    await kube.create(CLAIMS, claim("huge", "p", annotations={REQUESTED_ADDRESS_ANNOTATION: huge}), namespace)
    async with controller_factory(namespaces=[namespace]):
        found = await wait_claim_reason(kube, namespace, "huge", "AllocationFailed")
        condition = ready_condition(found)
        assert condition is not None and condition["status"] == "False"
        assert len(condition["message"]) <= CONDITION_MESSAGE_LENGTH
        assert condition["message"].endswith("which is not an IP address; fix or remove it")

        async def warning() -> Object | None:
            events, _ = await kube.list(EVENTS, namespace)
            return next(
                (e for e in events if e["involvedObject"]["name"] == "huge" and e["reason"] == "AllocationFailed"),
                None,
            )

        event = await wait_for(warning, timeout=15, message="the claim's AllocationFailed Event")
        assert event["type"] == "Warning" and event["message"].endswith("fix or remove it")


def deep_cluster(name: str, depth: int) -> Object:
    """A Cluster whose topology variable holds a value `depth` levels deep (its spec an orjson.Fragment: written as
    text, since orjson writes at most 254 levels)."""
    value = b"[" * depth + b"]" * depth
    spec = b'{"topology": {"classRef": {"name": "c"}, "version": "v1.34.0", "variables": [{"name": "x", "value": '
    return {
        "apiVersion": CLUSTERS.api_version,
        "kind": CLUSTERS.kind,
        "metadata": {"name": name},
        "spec": orjson.Fragment(spec + value + b"}]}}"),
    }


async def test_a_cluster_nested_1100_levels_deep_stops_neither_the_caches_nor_the_claims(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(CLUSTERS, deep_cluster("deep", 1_100), namespace)
    listed, _ = await kube.list(CLUSTERS, namespace)
    assert [c["metadata"]["name"] for c in listed] == ["deep"], "the API server keeps it and lists it"
    await kube.create(POOLS, pool("p", ["10.61.0.0/24"], 24), namespace)
    await kube.create(CLAIMS, claim("c", "p"), namespace)
    async with controller_factory(namespaces=[namespace]):  # a restart with it present: the caches sync
        await wait_address(kube, namespace, "c")
