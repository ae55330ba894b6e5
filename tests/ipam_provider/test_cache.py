"""What the caches keep: managedFields and the last-applied annotation never reach a store, whichever way an object
comes in (the informer's LIST, a watch event, the answer to one of the controller's own writes), and the fields
the controller reads are all there."""

from __future__ import annotations

import copy
import json
from typing import Any

from backends.incluster.backend import IN_CLUSTER_POOL
from ipam_provider.api.capi import (
    CLAIMS,
    CLUSTERS,
    FINALIZER_PROTECT_ADDRESS,
    FINALIZER_RELEASE_ADDRESS,
    LABEL_CLUSTER_NAME,
)
from ipam_provider.cache import Caches, patch_cached, project_claim, project_cluster, project_pool
from ipam_provider.endpoint import ANNOTATION_POOL_NAME, CONDITION
from ipam_provider.runtime.cache.projection import LAST_APPLIED, strip_bookkeeping
from ipam_provider.runtime.cache.store import Store
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import POOLS, claim, cluster, pool, wait_address

Object = dict[str, Any]
MANAGED = [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]


def served_claim() -> Object:
    """A claim as the API server answers it, bookkeeping included."""
    return {
        "apiVersion": CLAIMS.api_version,
        "kind": CLAIMS.kind,
        "metadata": {
            "name": "c",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "7",
            "generation": 2,
            "labels": {LABEL_CLUSTER_NAME: "cl"},
            "annotations": {"keep": "me", LAST_APPLIED: '{"a": "copy of the whole object"}'},
            "finalizers": [FINALIZER_RELEASE_ADDRESS],
            "ownerReferences": [{"apiVersion": "v1", "kind": "Machine", "name": "m", "uid": "u-m"}],
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-02T00:00:00Z",
            "managedFields": MANAGED,
            "selfLink": "/apis/x",
        },
        "spec": {"poolRef": {"apiGroup": "g", "kind": "K", "name": "p"}, "clusterName": "cl"},
        "status": {"addressRef": {"name": "c"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_a_claim_keeps_what_the_controller_reads_and_the_given_object_is_left_alone() -> None:
    given = served_claim()
    before = copy.deepcopy(given)
    kept = project_claim(given)
    assert given == before, "a projection must not change the object its caller still holds"
    meta = dict(before["metadata"])
    del meta["managedFields"], meta["selfLink"]
    meta["annotations"] = {"keep": "me"}
    assert kept == {**before, "metadata": meta}


def test_a_cluster_keeps_only_its_pause_state_of_the_spec() -> None:
    served = {
        "apiVersion": CLUSTERS.api_version,
        "kind": CLUSTERS.kind,
        "metadata": {"name": "cl", "namespace": "ns", "resourceVersion": "3", "managedFields": MANAGED},
        "spec": {"paused": True, "topology": {"classRef": {"name": "big"}, "variables": [{"name": "v"}]}},
        "status": {"phase": "Provisioned"},
    }
    kept = project_cluster(served)
    assert kept == {
        "apiVersion": CLUSTERS.api_version,
        "kind": CLUSTERS.kind,
        "metadata": {"name": "cl", "namespace": "ns", "resourceVersion": "3"},
        "spec": {"paused": True},
    }
    assert project_cluster({"metadata": {"name": "x"}, "spec": {"topology": {}}})["spec"] == {}


def test_a_cluster_asking_for_an_endpoint_keeps_the_endpoint_its_variables_and_our_condition() -> None:
    ours = {"type": CONDITION, "status": "True", "reason": "AddressAllocated"}
    served: Object = {
        "metadata": {"name": "c", "annotations": {ANNOTATION_POOL_NAME: "vips"}},
        "spec": {
            "controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443},
            "topology": {"classRef": {"name": "k"}, "version": "v1", "variables": [{"name": "v", "value": 1}]},
            "clusterNetwork": {"pods": {"cidrBlocks": ["10.1.0.0/16"]}},
        },
        "status": {"conditions": [{"type": "Available", "status": "True"}, ours], "phase": "Provisioned"},
    }
    kept = project_cluster(served)
    assert kept["spec"] == {
        "controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443},
        "topology": {"variables": [{"name": "v", "value": 1}]},
    }
    assert kept["status"] == {"conditions": [ours]}


def test_a_pool_keeps_everything_but_the_bookkeeping() -> None:
    served: Object = {
        "metadata": {"name": "p", "generation": 4, "other": "kept", "managedFields": MANAGED},
        "spec": {"addresses": ["10.0.0.0/24"], "anything": {"deep": [1]}},
        "status": {"ipAddresses": {"total": 254}},
    }
    kept = strip_bookkeeping(served)
    assert kept == {**served, "metadata": {"name": "p", "generation": 4, "other": "kept"}}
    assert "managedFields" in served["metadata"]
    assert project_pool(served) == kept


def test_pools_decoded_apart_share_their_strings() -> None:
    """Two pools from two watch events hold one copy of each key and short string between them."""
    raw = json.dumps({"metadata": {"name": "p"}, "status": {"conditions": [{"type": "Ready", "reason": "PoolReady"}]}})
    first, second = (project_pool(json.loads(raw)) for _ in range(2))
    condition, other = first["status"]["conditions"][0], second["status"]["conditions"][0]
    assert condition["reason"] is other["reason"]
    assert next(iter(condition)) is next(iter(other))


def test_every_store_projects_what_it_is_given() -> None:
    caches = Caches()
    caches.serve([], lambda group, kind: None)
    for store in (caches.claims, caches.addresses, caches.clusters, Store()):
        assert store.upsert(served_claim())
        stored = store.get("ns", "c")
        assert stored is not None
        assert "managedFields" not in stored["metadata"] and LAST_APPLIED not in stored["metadata"]["annotations"]
        assert stored["metadata"]["resourceVersion"] == "7"


def assert_projected(obj: Object, where: str) -> None:
    meta = obj["metadata"]
    assert "managedFields" not in meta, f"{where}: managedFields reached a store"
    assert LAST_APPLIED not in (meta.get("annotations") or {}), f"{where}: the last-applied annotation was kept"


async def test_no_store_of_a_running_controller_holds_managed_fields(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    """Objects listed at start, objects seen by watch, and the answers to the controller's own writes."""
    applied = {LAST_APPLIED: json.dumps(claim("listed", "net"))}
    await kube.create(POOLS, pool("net", ["10.30.0.0/29"], 29), namespace)
    await kube.create(CLUSTERS, {**cluster("cl"), "metadata": {"name": "cl", "annotations": applied}}, namespace)
    await kube.create(CLAIMS, claim("listed", "net", cluster="cl", labels={"l": "1"}, annotations=applied), namespace)
    async with controller_factory(namespaces=[namespace]) as controller:
        await kube.create(CLAIMS, claim("watched", "net", cluster="cl"), namespace)
        for name in ("listed", "watched"):
            await wait_address(kube, namespace, name)
        served = await kube.get(CLAIMS, "listed", namespace)
        assert served is not None and served["metadata"]["managedFields"], "the API server sends managedFields"
        caches = controller.caches
        stores = {"claims": caches.claims, "addresses": caches.addresses, "clusters": caches.clusters}
        stores |= {f"pools {kind}": store for (_, kind), store in caches.pools.items()}
        for label, store in stores.items():
            for obj in store.items():
                assert_projected(obj, f"{label} {obj['metadata']['name']}")
        listed = caches.claims.get(namespace, "listed")
        assert listed is not None
        meta = listed["metadata"]
        assert {"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp"} <= meta.keys()
        assert meta["labels"] == {"l": "1"} and FINALIZER_RELEASE_ADDRESS in meta["finalizers"]
        assert listed["spec"]["clusterName"] == "cl" and listed["status"]["addressRef"] == {"name": "listed"}
        address = caches.addresses.get(namespace, "watched")
        assert address is not None
        claim_uid = (await kube.get(CLAIMS, "watched", namespace) or {})["metadata"]["uid"]
        owners = address["metadata"]["ownerReferences"]
        assert any(o["uid"] == claim_uid and o.get("controller") for o in owners), "adoption reads ownerReferences"
        assert FINALIZER_PROTECT_ADDRESS in address["metadata"]["finalizers"]
        assert address["metadata"]["labels"] == {LABEL_CLUSTER_NAME: "cl"} and address["spec"]["address"]
        kept_cluster = caches.clusters.get(namespace, "cl")
        assert kept_cluster is not None and kept_cluster["spec"] == {"paused": False}
        pool_ref = IN_CLUSTER_POOL.ref(namespace, "net")

        async def pool_counts_both() -> Object | None:
            kept = caches.pool(pool_ref)
            used = ((kept or {}).get("status") or {}).get("ipAddresses", {}).get("used")
            return kept if used == 2 else None

        kept_pool = await wait_for(pool_counts_both, message="the cached pool's status to count both addresses")
        assert_projected(kept_pool, "pool")
        defaults = {"allocationStrategy": "LowestFree", "reserveStaticBand": False}  # the CRD's
        assert kept_pool["spec"] == {"addresses": ["10.30.0.0/29"], "prefix": 29, **defaults}


async def test_the_answer_to_a_guarded_patch_is_cached_projected(kube: KubeClient, namespace: str) -> None:
    """`patch_cached` (read-your-writes) caches the API server's answer through the projection, and the next
    patch, guarded by the cached resourceVersion, succeeds."""
    created = await kube.create(CLAIMS, claim("mine", "net", annotations={LAST_APPLIED: "{}"}), namespace)
    caches = Caches()
    caches.serve([], lambda group, kind: None)
    caches.claims.upsert(created)
    cached = caches.claims.get(namespace, "mine")
    assert cached is not None
    answer = await patch_cached(kube, caches.claims, CLAIMS, cached, {"metadata": {"finalizers": ["a/b"]}})
    assert answer["metadata"]["managedFields"], "the caller gets the whole answer"
    cached = caches.claims.get(namespace, "mine")
    assert cached is not None
    assert_projected(cached, "patched claim")
    assert cached["metadata"]["finalizers"] == ["a/b"]
    assert cached["metadata"]["resourceVersion"] == answer["metadata"]["resourceVersion"]
    await patch_cached(kube, caches.claims, CLAIMS, cached, {"metadata": {"labels": {"x": "y"}}})
    cached = caches.claims.get(namespace, "mine")
    assert cached is not None and cached["metadata"]["labels"] == {"x": "y"}
    assert_projected(cached, "patched claim")
