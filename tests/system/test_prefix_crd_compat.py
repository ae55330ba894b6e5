"""Wire compatibility of the prefix pool CRDs with the Go in-cluster provider v1.1.0's.

The Go CRDs are read from its Go module (config/crd/bases) and compared with ours field by field: group, kinds and
names, scope, versions, every spec and status field's path and type, defaults, required fields, printer columns.
Then the pools of the Go webhook's own test scenarios are written as manifests and sent to the real API server with
our CRDs: the valid ones are stored as sent (plus the default), the invalid ones are refused with the Go webhook's
message. The Go module holds no YAML example of a prefix pool, so those scenarios stand in for one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.incluster.prefix_backend import GLOBAL_IN_CLUSTER_PREFIX_POOL, IN_CLUSTER_PREFIX_POOL
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from tools.controlplane.assets import AssetError, go_module_dir, our_crd_paths
from tools.controlplane.crds import load_documents

GO_MODULE = "sigs.k8s.io/cluster-api-ipam-provider-in-cluster"
GO_VERSION = "v1.1.0"
KINDS = ("InClusterPrefixPool", "GlobalInClusterPrefixPool")
PREFIX_POOLS = pool_resource(IN_CLUSTER_PREFIX_POOL)
GLOBAL_PREFIX_POOLS = pool_resource(GLOBAL_IN_CLUSTER_PREFIX_POOL)
# What ours has beyond the Go schema: the Ready condition of every pool of this provider.
OUR_EXTRAS = ("status.conditions",)
Object = dict[str, Any]


def go_crds() -> dict[str, Object]:
    try:
        base = go_module_dir(GO_MODULE, GO_VERSION) / "config" / "crd" / "bases"
    except AssetError as error:
        pytest.fail(str(error), pytrace=False)
    paths = [base / f"ipam.cluster.x-k8s.io_{kind.lower()}s.yaml" for kind in KINDS]
    return {doc["spec"]["names"]["kind"]: doc for doc in load_documents(paths)}


def our_crds() -> dict[str, Object]:
    return {
        doc["spec"]["names"]["kind"]: doc
        for doc in load_documents(our_crd_paths())
        if doc["spec"]["names"]["kind"] in KINDS
    }


def fields(schema: Object, path: str = "") -> Iterator[tuple[str, Object]]:
    """Every (path, schema) below `schema`, list items as `path[]`."""
    for name, child in (schema.get("properties") or {}).items():
        child_path = f"{path}.{name}" if path else name
        yield child_path, child
        yield from fields(child, child_path)
    if "items" in schema:
        yield f"{path}[]", schema["items"]
        yield from fields(schema["items"], f"{path}[]")


def shape(schema: Object) -> dict[str, tuple[Any, ...]]:
    """Per field path: type, default, required children; ours' extras left out."""
    return {
        path: (child.get("type"), child.get("default"), sorted(child.get("required") or []))
        for path, child in fields(schema)
        if not path.startswith(OUR_EXTRAS)
    }


def served_version(crd: Object) -> Object:
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    assert isinstance(version, dict)
    return version


@pytest.mark.parametrize("kind", KINDS)
def test_our_crd_matches_the_go_crd(kind: str) -> None:
    go, ours = go_crds()[kind], our_crds()[kind]
    assert ours["metadata"]["name"] == go["metadata"]["name"]
    assert ours["spec"]["group"] == go["spec"]["group"] == "ipam.cluster.x-k8s.io"
    assert ours["spec"]["names"] == go["spec"]["names"]
    assert ours["spec"]["scope"] == go["spec"]["scope"]
    assert [(v["name"], v["served"], v["storage"]) for v in ours["spec"]["versions"]] == [
        (v["name"], v["served"], v["storage"]) for v in go["spec"]["versions"]
    ]
    go_version, our_version = served_version(go), served_version(ours)
    assert our_version.get("subresources") == go_version.get("subresources") == {"status": {}}
    columns = [(c["name"], c["type"], c["jsonPath"]) for c in go_version["additionalPrinterColumns"]]
    assert [(c["name"], c["type"], c["jsonPath"]) for c in our_version["additionalPrinterColumns"]] == columns
    go_schema, our_schema = go_version["schema"]["openAPIV3Schema"], our_version["schema"]["openAPIV3Schema"]
    assert shape(our_schema) == shape(go_schema)
    assert shape(go_schema)["spec.allocationPrefixLength"] == ("integer", 64, [])
    assert sorted(our_schema["properties"]["spec"]["required"]) == ["prefixes"]
    assert set(dict(fields(our_schema))) - set(dict(fields(go_schema))) == {
        path for path, _ in fields(our_schema) if path.startswith(OUR_EXTRAS)
    }
    labels = ours["metadata"]["labels"]
    assert labels["clusterctl.cluster.x-k8s.io"] == "" and labels["cluster.x-k8s.io/provider"] == "ipam-py"
    move = (
        "clusterctl.cluster.x-k8s.io/move-hierarchy"
        if go["spec"]["scope"] == "Namespaced"
        else "clusterctl.cluster.x-k8s.io/move"
    )
    assert labels[move] == ""


def prefix_pool(name: str, spec: Object, kind: str = "InClusterPrefixPool") -> Object:
    return {"apiVersion": PREFIX_POOLS.api_version, "kind": kind, "metadata": {"name": name}, "spec": spec}


# The Go webhook's test scenarios (internal/webhooks/inclusterprefixpool_test.go), as manifests.
VALID: dict[str, Object] = {
    "disjoint": {"prefixes": ["fd00::/64", "fd01::/64"]},
    "custom-length": {"prefixes": ["fd00::/48"], "allocationPrefixLength": 56},
    "length-96": {"prefixes": ["fd00::/48"], "allocationPrefixLength": 96},
    "length-128": {"prefixes": ["fd00::/48"], "allocationPrefixLength": 128},
    "length-64": {"prefixes": ["fd00::/48"], "allocationPrefixLength": 64},
    "all-fields": {"prefixes": ["fd20::/48"], "gateway": "fd20::1", "excludedPrefixes": ["fd20:0:0:2::/64"]},
    "empty-gateway": {"prefixes": ["fd20::/48"], "gateway": ""},
    # Ours only: IPv4 prefix pools.
    "ipv4": {"prefixes": ["10.0.0.0/16"], "allocationPrefixLength": 24, "gateway": "10.0.0.1"},
}
INVALID: dict[str, tuple[Object, str]] = {
    "empty": ({"prefixes": []}, "prefixes is required"),
    "cidr-only": ({"prefixes": ["fd00::1"]}, "provided entry is not a valid IPv6 CIDR"),
    "aligned": ({"prefixes": ["fd00::1/64"]}, "CIDR must be network-aligned"),
    "too-long": ({"prefixes": ["fd00::/65"]}, "CIDR prefix length must be <= allocationPrefixLength"),
    "gateway-v6": ({"prefixes": ["fd00::/64"], "gateway": "10.0.0.1"}, "provided gateway must be IPv6"),
    "excluded-v6": (
        {"prefixes": ["fd00::/64"], "excludedPrefixes": ["10.0.0.1"]},
        "only IPv6 excluded prefixes are supported",
    ),
    "excluded-entry": (
        {"prefixes": ["fd00::/64"], "excludedPrefixes": ["fd00::/x"]},
        "provided entry is not a valid IP, range, nor CIDR",
    ),
    "length-range": ({"prefixes": ["fd00::/48"], "allocationPrefixLength": 129}, "less than or equal to 128"),
    # Ours only: IPv4 prefix pools, checked the same way.
    "ipv4-length": ({"prefixes": ["10.0.0.0/16"]}, "allocationPrefixLength must be between 1 and 32 for IPv4"),
    "ipv4-cidr": ({"prefixes": ["10.0.0.1"], "allocationPrefixLength": 24}, "provided entry is not a valid IPv4 CIDR"),
    "mixed": ({"prefixes": ["10.0.0.0/16", "fd00::/48"]}, "provided prefixes are of mixed IP families"),
    "gateway-v4": ({"prefixes": ["10.0.0.0/16"], "allocationPrefixLength": 24, "gateway": "fd00::1"}, "must be IPv4"),
}


async def test_the_go_scenarios_are_stored_as_sent_or_refused_with_the_go_message(
    kube: KubeClient, namespace: str
) -> None:
    for name, spec in VALID.items():
        stored = await kube.create(PREFIX_POOLS, prefix_pool(name, spec), namespace)
        assert stored["spec"] == {"allocationPrefixLength": 64, **spec}, name
    stored = await kube.create(
        GLOBAL_PREFIX_POOLS, prefix_pool(f"{namespace}-global", VALID["all-fields"], "GlobalInClusterPrefixPool")
    )
    assert stored["spec"]["allocationPrefixLength"] == 64
    await kube.delete(GLOBAL_PREFIX_POOLS, f"{namespace}-global")
    wrong: dict[str, str] = {}
    for name, (spec, message) in INVALID.items():
        try:
            await kube.create(PREFIX_POOLS, prefix_pool(name, spec), namespace)
        except ApiError as error:
            if error.status != 422 or message not in error.message:
                wrong[name] = error.message
        else:
            wrong[name] = "accepted"
    assert not wrong, wrong


async def test_allocation_prefix_length_is_immutable(kube: KubeClient, namespace: str) -> None:
    await kube.create(PREFIX_POOLS, prefix_pool("fixed", {"prefixes": ["fd00::/48"]}), namespace)
    with pytest.raises(ApiError) as refused:
        await kube.patch(PREFIX_POOLS, "fixed", {"spec": {"allocationPrefixLength": 56}}, namespace)
    assert "spec.allocationPrefixLength is immutable" in refused.value.message
    changed = await kube.patch(PREFIX_POOLS, "fixed", {"spec": {"excludedPrefixes": ["fd00::/64"]}}, namespace)
    assert changed["spec"]["excludedPrefixes"] == ["fd00::/64"]


def test_the_go_crds_are_where_the_test_reads_them() -> None:
    """A guard for the comparison above: it must have read both Go CRDs, with their prefix pool fields."""
    crds = go_crds()
    assert set(crds) == set(KINDS)
    for crd in crds.values():
        spec = served_version(crd)["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        assert set(spec) == {"prefixes", "allocationPrefixLength", "gateway", "excludedPrefixes"}
    assert all(isinstance(path, Path) for path in our_crd_paths())
