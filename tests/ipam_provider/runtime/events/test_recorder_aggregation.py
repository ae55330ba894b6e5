"""Events as the real API server keeps them: a burst on one pool is 10 Events and one combined Event on the pool,
a repeat patches its Event's count, a deleted Event is created again, a refused write is logged and not raised."""

from __future__ import annotations

import asyncio
import uuid

import structlog

from ipam_provider.api.capi import CLAIMS
from ipam_provider.common import Object
from ipam_provider.runtime.events import NORMAL, WARNING, EventRecorder
from ipam_provider.runtime.events.correlator import COMBINED_PREFIX
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.objects import POOLS, pool

COMPONENT = "events-test"


def claim_ref(namespace: str, name: str) -> Object:
    """A claim as the reconciler holds it (the Event's involvedObject need not exist)."""
    meta = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "resourceVersion": "1"}
    return {"apiVersion": CLAIMS.api_version, "kind": CLAIMS.kind, "metadata": meta}


async def events_of(kube: KubeClient, namespace: str) -> list[Object]:
    items, _ = await kube.list(EVENTS, namespace)
    return [e for e in items if (e.get("source") or {}).get("component") == COMPONENT]


async def test_a_burst_on_one_pool_is_ten_events_and_one_combined_event(kube: KubeClient, namespace: str) -> None:
    created = await kube.create(POOLS, pool("burst", ["10.40.0.0/22"], 22), namespace)
    the_pool = {"apiVersion": POOLS.api_version, "kind": POOLS.kind, **created}
    recorder = EventRecorder(kube, COMPONENT)
    recorder.start()
    try:
        for index in range(300):
            message = f"10.40.{index // 256}.{index % 256}/22 allocated from InClusterIPPool/{namespace}/burst"
            recorder.record(claim_ref(namespace, f"m{index}"), NORMAL, "AddressAllocated", message, related=the_pool)
            if index % 50 == 49:
                await asyncio.sleep(0)  # let the writer run between records, as it does between reconciles
        await recorder.flush()
    finally:
        await recorder.close()
    events = await events_of(kube, namespace)
    individual = [e for e in events if e["involvedObject"]["kind"] == CLAIMS.kind]
    combined = [e for e in events if e["involvedObject"]["kind"] == POOLS.kind]
    assert len(events) == 11 and len(individual) == 10 and len(combined) == 1
    assert sorted(e["involvedObject"]["name"] for e in individual) == sorted(f"m{i}" for i in range(10))
    assert all(e["count"] == 1 and e["related"]["uid"] == created["metadata"]["uid"] for e in individual)
    (on_pool,) = combined
    assert on_pool["involvedObject"]["uid"] == created["metadata"]["uid"]
    assert on_pool["count"] == 290 and on_pool["reason"] == "AddressAllocated" and on_pool["type"] == NORMAL
    assert on_pool["message"] == f"{COMBINED_PREFIX}10.40.1.43/22 allocated from InClusterIPPool/{namespace}/burst"


async def test_a_repeat_patches_the_count_and_a_deleted_event_is_created_again(
    kube: KubeClient, namespace: str
) -> None:
    created = await kube.create(POOLS, pool("bad", ["10.41.0.0/24"], 24), namespace)
    the_pool = {"apiVersion": POOLS.api_version, "kind": POOLS.kind, **created}
    recorder = EventRecorder(kube, COMPONENT)
    recorder.record(the_pool, WARNING, "PoolInvalid", "addresses overlap")
    await recorder.flush()
    (first,) = await events_of(kube, namespace)
    recorder.record(the_pool, WARNING, "PoolInvalid", "addresses overlap")
    await recorder.flush()
    (patched,) = await events_of(kube, namespace)
    assert patched["metadata"]["uid"] == first["metadata"]["uid"] and patched["count"] == 2
    assert first["count"] == 1
    await kube.delete(EVENTS, first["metadata"]["name"], namespace)
    recorder.record(the_pool, WARNING, "PoolInvalid", "addresses overlap")
    await recorder.flush()
    (again,) = await events_of(kube, namespace)
    assert (
        again["metadata"]["name"] == first["metadata"]["name"] and again["metadata"]["uid"] != first["metadata"]["uid"]
    )
    assert again["count"] == 3 and again["involvedObject"]["uid"] == created["metadata"]["uid"]


async def test_a_refused_write_is_logged_and_not_raised(kube: KubeClient, namespace: str) -> None:
    recorder = EventRecorder(kube, COMPONENT)
    nowhere = claim_ref(f"{namespace}-missing", "m1")
    with structlog.testing.capture_logs() as records:
        recorder.record(nowhere, WARNING, "AllocationFailed", "no namespace for this Event")
        await recorder.flush()
    (record,) = [r for r in records if r["event"] == "event not written"]
    assert record["log_level"] == "warning" and record["reason"] == "AllocationFailed"
    assert record["error_type"] == "ApiError" and "not found" in record["error"]
    assert record["involved"] == f"IPAddressClaim {namespace}-missing/m1"
