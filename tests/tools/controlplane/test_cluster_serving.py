"""The harness serves the real API: schema validation, watches, the status subresource, conflicts, finalizers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from tests.support.cluster import wait_for


def claim(name: str, pool_name: str | None = "pool") -> dict[str, Any]:
    pool_ref: dict[str, str] = {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool"}
    if pool_name is not None:
        pool_ref["name"] = pool_name
    return {
        "apiVersion": CLAIMS.api_version,
        "kind": "IPAddressClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": pool_ref},
    }


async def test_claim_without_pool_name_is_refused_by_the_real_schema(kube: KubeClient, namespace: str) -> None:
    with pytest.raises(ApiError) as refused:
        await kube.create(CLAIMS, claim("no-pool-name", pool_name=None), namespace)
    assert refused.value.status == 422
    assert "spec.poolRef.name" in refused.value.message


async def test_watch_sees_added_then_modified_through_the_status_subresource(kube: KubeClient, namespace: str) -> None:
    _, list_version = await kube.list(CLAIMS, namespace)
    events: list[tuple[str, dict[str, Any]]] = []

    async def follow() -> None:
        async for kind, obj in kube.watch(CLAIMS, namespace, resource_version=list_version, timeout_seconds=30):
            if kind in ("ADDED", "MODIFIED"):
                events.append((kind, obj))
            if len(events) == 2:
                return

    watcher = asyncio.create_task(follow())
    created = await kube.create(CLAIMS, claim("watched"), namespace)
    patched = await kube.patch(
        CLAIMS, "watched", {"status": {"addressRef": {"name": "watched"}}}, namespace, subresource="status"
    )
    await asyncio.wait_for(watcher, 20)
    assert [kind for kind, _ in events] == ["ADDED", "MODIFIED"]
    versions = [int(obj["metadata"]["resourceVersion"]) for _, obj in events]
    assert versions == sorted(versions) and versions[0] < versions[1]
    assert versions == [
        int(created["metadata"]["resourceVersion"]),
        int(patched["metadata"]["resourceVersion"]),
    ]
    assert events[1][1]["status"]["addressRef"] == {"name": "watched"}
    # The main resource ignores status: a status written through it is dropped.
    spec_write = await kube.patch(CLAIMS, "watched", {"status": {"addressRef": {"name": "other"}}}, namespace)
    assert spec_write["status"]["addressRef"] == {"name": "watched"}


async def test_update_with_a_stale_resource_version_conflicts(kube: KubeClient, namespace: str) -> None:
    created = await kube.create(CLAIMS, claim("stale"), namespace)
    await kube.patch(CLAIMS, "stale", {"metadata": {"labels": {"step": "one"}}}, namespace)
    stale = {**created, "metadata": {**created["metadata"], "labels": {"step": "two"}}}
    with pytest.raises(ApiError) as conflict:
        await kube.replace(CLAIMS, stale)
    assert conflict.value.status == 409 and conflict.value.conflict
    with pytest.raises(ApiError) as merge_conflict:
        await kube.patch(
            CLAIMS,
            "stale",
            {
                "metadata": {
                    "resourceVersion": created["metadata"]["resourceVersion"],
                    "labels": {"step": "3"},
                }
            },
            namespace,
        )
    assert merge_conflict.value.conflict


async def test_finalizer_holds_a_deleted_claim_until_removed(kube: KubeClient, namespace: str) -> None:
    body = claim("held")
    body["metadata"]["finalizers"] = ["ipam.cluster.x-k8s.io/ReleaseAddress"]
    await kube.create(CLAIMS, body, namespace)
    assert await kube.delete(CLAIMS, "held", namespace)
    held = await kube.get(CLAIMS, "held", namespace)
    assert held is not None and held["metadata"].get("deletionTimestamp")
    await kube.patch(CLAIMS, "held", {"metadata": {"finalizers": None}}, namespace)

    async def gone() -> bool:
        return await kube.get(CLAIMS, "held", namespace) is None

    await wait_for(gone, timeout=10, message="the claim to disappear once its finalizer is removed")
