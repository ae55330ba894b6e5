"""`ipam-provider status`: the claims view (default) and the pools view, as tables and as JSON, against the real
API server."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from backends.incluster.backend import IN_CLUSTER_POOL
from ipam_provider.api.capi import CLAIMS
from ipam_provider.backend.contract import PoolKind
from ipam_provider.controller import Controller
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.statusview import pool_rows
from tests.support.cluster import wait_for
from tests.support.netbox_backend import NB_POOLS, nb_claim, netbox_pool, prefix
from tests.support.objects import POOLS, claim, pool, wait_address, wait_claim_reason

MISSING = PoolKind("example.com", "v1", "MissingIPPool", "missingippools", namespaced=True)


async def status(kubeconfig: Path, namespace: str, *args: str) -> tuple[str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ipam_provider",
        "status",
        *args,
        f"--kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode(), err.decode()


async def one_used_one_waiting(kube: KubeClient, namespace: str) -> None:
    """Pool "net" with one address, given to claim "a"; claim "b" waits; its counts written."""
    await kube.create(POOLS, pool("net", ["10.34.0.1"], 24), namespace)
    await kube.create(CLAIMS, claim("a", "net"), namespace)
    await wait_address(kube, namespace, "a")
    await kube.create(CLAIMS, claim("b", "net"), namespace)
    await wait_claim_reason(kube, namespace, "b", "PoolExhausted")

    async def counted() -> bool:
        found = await kube.get(POOLS, "net", namespace)
        return bool(((found or {}).get("status") or {}).get("ipAddresses", {}).get("used") == 1)

    await wait_for(counted, message="pool net to count its used address")


async def test_pool_rows_count_and_skip_a_kind_without_crd(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await one_used_one_waiting(kube, namespace)
    held = claim("going", "net")  # being deleted, held by another controller's finalizer: not waiting
    held["metadata"]["finalizers"] = ["example.com/hold"]
    await kube.create(CLAIMS, held, namespace)
    await kube.delete(CLAIMS, "going", namespace)
    rows, skipped = await pool_rows(kube, [IN_CLUSTER_POOL, MISSING], [namespace])
    await kube.patch(CLAIMS, "going", {"metadata": {"finalizers": None}}, namespace)
    assert rows == [
        {
            "apiGroup": IN_CLUSTER_POOL.group,
            "kind": "InClusterIPPool",
            "namespace": namespace,
            "name": "net",
            "ready": True,
            "reason": rows[0]["reason"],
            "total": 1,
            "used": 1,
            "free": 0,
            "outOfRange": rows[0]["outOfRange"],
            "waiting": 1,
        }
    ]
    assert rows[0]["reason"]
    assert skipped == [{"apiGroup": "example.com", "kind": "MissingIPPool", "reason": "its CRD is not installed"}]


async def test_the_pools_view_as_table_and_json(
    kube: KubeClient, kubeconfig: Path, namespace: str, in_process_controller: Controller
) -> None:
    await one_used_one_waiting(kube, namespace)
    # A NetBox pool no controller serves here: no status yet, one claim waiting on it.
    await kube.create(NB_POOLS, netbox_pool("nb", [prefix("10.35.0.0/24")]), namespace)
    await kube.create(CLAIMS, nb_claim("c", "nb"), namespace)

    out, err = await status(kubeconfig, namespace, "pools", "-o", "json")
    assert err == ""
    document: dict[str, Any] = json.loads(out)
    assert set(document) == {"pools", "skipped"} and document["skipped"] == []
    # Cluster-scoped pools that other tests of the session left behind are shown too; this namespace's are these.
    by_name = {row["name"]: row for row in document["pools"] if row["namespace"] == namespace}
    assert set(by_name) == {"net", "nb"}
    net, nb = by_name["net"], by_name["nb"]
    assert (net["kind"], net["namespace"], net["ready"], net["total"], net["used"], net["free"], net["waiting"]) == (
        "InClusterIPPool",
        namespace,
        True,
        1,
        1,
        0,
        1,
    )
    assert (nb["kind"], nb["ready"], nb["reason"], nb["total"], nb["waiting"]) == ("NetboxIPPool", None, None, None, 1)

    table, _ = await status(kubeconfig, namespace, "--pools")
    header, *lines = table.splitlines()
    assert header.split() == ["KIND", "NAMESPACE", "NAME", "READY", "REASON", "TOTAL", "USED", "FREE", "WAITING"]
    rows = {line.split()[2]: line.split() for line in lines}
    assert rows["net"][:4] == ["InClusterIPPool", namespace, "net", "True"] and rows["net"][5:] == ["1", "1", "0", "1"]
    assert rows["nb"] == ["NetboxIPPool", namespace, "nb", "Unknown", "-", "-", "-", "-", "1"]


async def test_the_claims_view_as_json(
    kube: KubeClient, kubeconfig: Path, namespace: str, in_process_controller: Controller
) -> None:
    await one_used_one_waiting(kube, namespace)
    out, _ = await status(kubeconfig, namespace, "--output=json")
    claims = {row["name"]: row for row in json.loads(out)["claims"]}
    pool_ref = {"apiGroup": IN_CLUSTER_POOL.group, "kind": "InClusterIPPool", "name": "net"}
    assert claims["a"] == {
        "namespace": namespace,
        "name": "a",
        "pool": pool_ref,
        "address": "10.34.0.1/24",
        "ready": True,
        "reason": "AddressAllocated",
    }
    assert claims["b"] == {
        "namespace": namespace,
        "name": "b",
        "pool": pool_ref,
        "address": None,
        "ready": False,
        "reason": "PoolExhausted",
    }
    table, _ = await status(kubeconfig, namespace, "claims")
    assert table.splitlines()[0].split() == ["NAMESPACE", "CLAIM", "POOL", "ADDRESS", "READY"]
    line = next(row for row in table.splitlines() if " b " in f" {row} ")
    assert line.split() == [namespace, "b", "InClusterIPPool/net", "-", "PoolExhausted"]
