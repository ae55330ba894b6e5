"""Builders for the objects tests create, and waits on what the controller does with them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backends.incluster.backend import GLOBAL_IN_CLUSTER_POOL, IN_CLUSTER_POOL
from backends.incluster.prefix_backend import GLOBAL_IN_CLUSTER_PREFIX_POOL, IN_CLUSTER_PREFIX_POOL
from ipam_provider.api.capi import ADDRESSES, CLAIMS, CLUSTERS, IPAM_GROUP
from ipam_provider.controller import Controller
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.events.recorder import EventRecorder
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.cluster import wait_for

POOLS = pool_resource(IN_CLUSTER_POOL)
GLOBAL_POOLS = pool_resource(GLOBAL_IN_CLUSTER_POOL)
PREFIX_POOLS = pool_resource(IN_CLUSTER_PREFIX_POOL)
GLOBAL_PREFIX_POOLS = pool_resource(GLOBAL_IN_CLUSTER_PREFIX_POOL)
Object = dict[str, Any]


def pool(name: str, addresses: list[str], prefix: int, **spec: Any) -> Object:
    return {
        "apiVersion": POOLS.api_version,
        "kind": POOLS.kind,
        "metadata": {"name": name},
        "spec": {"addresses": addresses, "prefix": prefix, **spec},
    }


def global_pool(name: str, addresses: list[str], prefix: int, **spec: Any) -> Object:
    return {**pool(name, addresses, prefix, **spec), "apiVersion": GLOBAL_POOLS.api_version, "kind": GLOBAL_POOLS.kind}


def claim(
    name: str,
    pool_name: str,
    *,
    kind: str = "InClusterIPPool",
    group: str = IPAM_GROUP,
    cluster: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Object:
    spec: Object = {"poolRef": {"apiGroup": group, "kind": kind, "name": pool_name}}
    if cluster:
        spec["clusterName"] = cluster
    return {
        "apiVersion": CLAIMS.api_version,
        "kind": CLAIMS.kind,
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": spec,
    }


def cluster(name: str, *, paused: bool = False) -> Object:
    spec = {"paused": paused}  # a v1beta2 Cluster spec needs at least one property
    return {"apiVersion": CLUSTERS.api_version, "kind": CLUSTERS.kind, "metadata": {"name": name}, "spec": spec}


def ready_condition(obj: Object | None) -> Object | None:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Ready"), None)


async def wait_claim_reason(kube: KubeClient, namespace: str, name: str, reason: str, timeout: float = 30) -> Object:
    """Wait until the claim's Ready condition has `reason`; return the claim."""

    async def probe() -> Object | None:
        obj = await kube.get(CLAIMS, name, namespace)
        condition = ready_condition(obj)
        return obj if condition is not None and condition.get("reason") == reason else None

    async def describe() -> str:
        return str(ready_condition(await kube.get(CLAIMS, name, namespace)))

    return await wait_for(probe, timeout=timeout, message=f"claim {namespace}/{name} to have Ready reason {reason}")


async def wait_address(kube: KubeClient, namespace: str, name: str, timeout: float = 30) -> Object:
    """Wait until the claim is fulfilled; return its IPAddress."""
    await wait_claim_reason(kube, namespace, name, "AddressAllocated", timeout)
    address = await kube.get(ADDRESSES, name, namespace)
    assert address is not None, f"claim {namespace}/{name} is Ready but IPAddress {name} does not exist"
    return address


async def addresses_of(kube: KubeClient, namespace: str | None = None) -> list[str]:
    items, _ = await kube.list(ADDRESSES, namespace)
    return [item["spec"]["address"] for item in items]


async def events_text(kube: KubeClient, namespace: str, controller: Controller) -> str:
    """Reason and message of every Event in `namespace`, once `controller` has written all it recorded."""
    await controller.context.recorder.flush()
    items, _ = await kube.list(EVENTS, namespace)
    return "\n".join(f"{e.get('reason')}: {e.get('message')}" for e in items)


async def wait_events(
    kube: KubeClient,
    namespace: str,
    recorder: EventRecorder,
    match: Callable[[Object], bool],
    message: str,
    until: Callable[[list[Object]], bool] = bool,
) -> list[Object]:
    """Wait until the Events of `namespace` that `match`, once `recorder` has written all it recorded, satisfy
    `until` (default: there is one); answer them. An Event is recorded after the status it reports is written, so
    a test that saw the status waits for the Event too."""

    async def found() -> list[Object] | None:
        await recorder.flush()
        events, _ = await kube.list(EVENTS, namespace)
        matched = [event for event in events if match(event)]
        return matched if until(matched) else None

    return await wait_for(found, message=message)


async def wait_event(
    kube: KubeClient, namespace: str, controller: Controller, reason: str, naming: str = "", timeout: float = 60
) -> str:
    """Wait for an Event with `reason` whose message holds `naming` (as `wait_events`); answer the Events' text."""

    async def recorded() -> str | None:
        text = await events_text(kube, namespace, controller)
        found = any(line.startswith(f"{reason}: ") and naming in line for line in text.splitlines())
        return text if found else None

    return await wait_for(recorded, timeout=timeout, message=f"a {reason} Event holding {naming!r}")
