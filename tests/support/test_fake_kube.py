"""The fake API server behaves as the real one where the reconcilers rely on it.

Each scenario runs against the fake (fast lane) and against the real kube-apiserver (`apiserver` lane), so that
a difference between the two fails a test instead of hiding behind the reconcilers' tests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from tests.support.fake_kube import FakeKube, merge_patch
from tests.support.world import address, claim

Scenario = Callable[[KubeClient, str], Awaitable[None]]


async def create_get_and_the_errors_of_missing_and_taken_names(kube: KubeClient, namespace: str) -> None:
    created = await kube.create(CLAIMS, claim("a", namespace=namespace), namespace)
    meta = created["metadata"]
    assert meta["uid"] and meta["resourceVersion"] and meta["generation"] == 1 and meta["namespace"] == namespace
    assert await kube.get(CLAIMS, "a", namespace) == created
    with pytest.raises(ApiError) as taken:
        await kube.create(CLAIMS, claim("a", namespace=namespace), namespace)
    assert (taken.value.status, taken.value.reason, taken.value.already_exists) == (409, "AlreadyExists", True)
    assert not taken.value.conflict
    assert await kube.get(CLAIMS, "missing", namespace) is None
    with pytest.raises(ApiError) as missing:
        await kube.patch(CLAIMS, "missing", {"metadata": {"labels": {"a": "b"}}}, namespace)
    assert (missing.value.status, missing.value.reason, missing.value.not_found) == (404, "NotFound", True)
    assert await kube.delete(CLAIMS, "missing", namespace) is False


async def a_stale_resource_version_is_a_conflict(kube: KubeClient, namespace: str) -> None:
    created = await kube.create(CLAIMS, claim("a", namespace=namespace), namespace)
    first = created["metadata"]["resourceVersion"]
    updated = await kube.patch(CLAIMS, "a", {"metadata": {"resourceVersion": first, "labels": {"x": "1"}}}, namespace)
    assert updated["metadata"]["labels"] == {"x": "1"}
    assert int(updated["metadata"]["resourceVersion"]) > int(first)
    with pytest.raises(ApiError) as stale:
        await kube.patch(CLAIMS, "a", {"metadata": {"resourceVersion": first, "labels": {"x": "2"}}}, namespace)
    assert (stale.value.status, stale.value.reason, stale.value.conflict) == (409, "Conflict", True)
    with pytest.raises(ApiError) as stale_status:
        await kube.patch(
            CLAIMS, "a", {"metadata": {"resourceVersion": first}, "status": {}}, namespace, subresource="status"
        )
    assert stale_status.value.conflict
    same = await kube.patch(CLAIMS, "a", {"metadata": {"labels": {"x": "1"}}}, namespace)
    assert same["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"], "a no-op keeps the version"
    removed = await kube.patch(CLAIMS, "a", {"metadata": {"labels": {"x": None}}}, namespace)
    assert not removed["metadata"].get("labels"), "null removes a key"


async def status_is_a_subresource_and_generation_follows_the_spec(kube: KubeClient, namespace: str) -> None:
    await kube.create(CLAIMS, {**claim("a", namespace=namespace), "status": {"addressRef": {"name": "x"}}}, namespace)
    created = await kube.get(CLAIMS, "a", namespace)
    assert created is not None and "addressRef" not in (created.get("status") or {}), "create ignores status"
    status = {"addressRef": {"name": "a"}}
    written = await kube.patch(
        CLAIMS, "a", {"metadata": {"labels": {"ignored": "yes"}}, "status": status}, namespace, subresource="status"
    )
    assert written["status"] == status and not written["metadata"].get("labels"), "/status changes status only"
    assert written["metadata"]["generation"] == 1
    relabelled = await kube.patch(CLAIMS, "a", {"metadata": {"labels": {"l": "1"}}, "status": None}, namespace)
    assert relabelled["status"] == status, "the object's patch leaves status alone"
    assert relabelled["metadata"]["generation"] == 1, "metadata is not the spec"
    moved = await kube.patch(CLAIMS, "a", {"spec": {"clusterName": "c"}}, namespace)
    assert moved["metadata"]["generation"] == 2


async def finalizers_hold_a_deleted_object_until_the_last_one_goes(kube: KubeClient, namespace: str) -> None:
    body = claim("a", namespace=namespace, finalizers=["example.com/one", "example.com/two"])
    created = await kube.create(CLAIMS, body, namespace)
    assert await kube.delete(CLAIMS, "a", namespace) is True
    deleting = await kube.get(CLAIMS, "a", namespace)
    assert deleting is not None and deleting["metadata"]["deletionTimestamp"]
    assert int(deleting["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    with pytest.raises(ApiError) as refused:
        await kube.patch(CLAIMS, "a", {"metadata": {"finalizers": ["example.com/one", "example.com/new"]}}, namespace)
    assert refused.value.status == 422
    await kube.patch(CLAIMS, "a", {"metadata": {"finalizers": ["example.com/two"]}}, namespace)
    assert await kube.get(CLAIMS, "a", namespace) is not None
    last = await kube.patch(CLAIMS, "a", {"metadata": {"finalizers": None}}, namespace)
    assert last["metadata"]["deletionTimestamp"] and not last["metadata"].get("finalizers")
    assert await kube.get(CLAIMS, "a", namespace) is None


async def a_uid_precondition_guards_a_delete(kube: KubeClient, namespace: str) -> None:
    created = await kube.create(ADDRESSES, address("a", "a", namespace=namespace), namespace)
    with pytest.raises(ApiError) as wrong:
        await kube.delete(ADDRESSES, "a", namespace, uid="not-its-uid")
    assert (wrong.value.status, wrong.value.reason, wrong.value.conflict) == (409, "Conflict", True)
    with pytest.raises(ApiError) as no_status:
        await kube.patch(ADDRESSES, "a", {"status": {}}, namespace, subresource="status")
    assert no_status.value.not_found, "an IPAddress has no status subresource"
    assert await kube.delete(ADDRESSES, "a", namespace, uid=created["metadata"]["uid"]) is True
    assert await kube.get(ADDRESSES, "a", namespace) is None


async def lists_are_scoped_by_namespace_and_labels(kube: KubeClient, namespace: str) -> None:
    await kube.create(CLAIMS, claim("a", namespace=namespace, labels={"role": "x"}), namespace)
    await kube.create(CLAIMS, claim("b", namespace=namespace), namespace)
    items, version = await kube.list(CLAIMS, namespace)
    assert sorted(i["metadata"]["name"] for i in items) == ["a", "b"] and version
    assert all(i["kind"] == "IPAddressClaim" and i["apiVersion"] == CLAIMS.api_version for i in items)
    selected, _ = await kube.list(CLAIMS, namespace, label_selector="role=x")
    assert [i["metadata"]["name"] for i in selected] == ["a"]
    everywhere, _ = await kube.list(CLAIMS)
    assert {"a", "b"} <= {i["metadata"]["name"] for i in everywhere if i["metadata"]["namespace"] == namespace}


SCENARIOS: list[Scenario] = [
    create_get_and_the_errors_of_missing_and_taken_names,
    a_stale_resource_version_is_a_conflict,
    status_is_a_subresource_and_generation_follows_the_spec,
    finalizers_hold_a_deleted_object_until_the_last_one_goes,
    a_uid_precondition_guards_a_delete,
    lists_are_scoped_by_namespace_and_labels,
]
IDS = [scenario.__name__ for scenario in SCENARIOS]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
async def test_the_fake(scenario: Scenario) -> None:
    await scenario(FakeKube(), "ns")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
async def test_the_real_api_server_agrees(scenario: Scenario, kube: KubeClient, namespace: str) -> None:
    await scenario(kube, namespace)


async def test_requests_are_recorded_in_order() -> None:
    journal: list[str] = []
    kube = FakeKube(journal)
    await kube.create(CLAIMS, claim("a"), "ns")
    await kube.patch(CLAIMS, "a", {"status": {}}, "ns", subresource="status")
    await kube.get(CLAIMS, "a", "ns")
    await kube.delete(CLAIMS, "a", "ns")
    assert journal == [
        "create IPAddressClaim a",
        "patch IPAddressClaim/status a",
        "get IPAddressClaim a",
        "delete IPAddressClaim a",
    ]
    assert [r.verb for r in kube.writes()] == ["create", "patch", "delete"]


def test_merge_patch_follows_rfc_7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    assert merge_patch(target, {"a": "z", "c": {"f": None}, "l": [3]}) == {"a": "z", "c": {"d": "e"}, "l": [3]}
    assert merge_patch(target, {"c": "flat"}) == {"a": "b", "c": "flat", "l": [1, 2]}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}, "the target is not changed"
