"""docs/migrating-from-go-incluster.md, followed on a control plane that carries a Go in-cluster provider install.

The control plane is this test's own (the session's has our CRDs already): kube-apiserver + etcd with only
Cluster API's CRDs. The Go provider's release components are rendered from its Go module the way its release
does (`kustomize build config/default`, here `kubectl kustomize`), labelled as `clusterctl init` labels them and
created, cert-manager's objects aside: CRDs with their conversion-webhook stanza, RBAC, Services, Deployment and
webhook configurations. Pools, claims and IPAddresses are shaped as the Go provider writes them, one
GlobalInClusterIPPool is stored as v1alpha1 and both CRDs list v1alpha1 in `status.storedVersions`.

The runbook's shell blocks are then run with bash as the runbook has them, found by their `<!-- step: NAME -->`
markers, except `clusterctl-delete` (emulated: no clusterctl here) and `deploy` (the controller runs in this
process), and with a stand-in for the Go provider's webhooks during `preflight-storage-migration` (they cannot
be served here); the runbook's "What the test covers" says the same.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.incluster.naming import RESERVATIONS
from ipam_provider.api.capi import ADDRESSES, CLAIMS, CLUSTERS, IPAM_GROUP, LABEL_CLUSTER_NAME
from ipam_provider.runtime.kube.client import JSON_PATCH, KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import CRDS, NAMESPACES, Resource
from tests.support.cluster import wait_for
from tests.support.controller import run_controller
from tests.support.objects import (
    GLOBAL_POOLS,
    GLOBAL_PREFIX_POOLS,
    POOLS,
    PREFIX_POOLS,
    claim,
    cluster,
    pool,
    ready_condition,
)
from tools.controlplane.assets import AssetError, binaries_dir, capi_crd_paths
from tools.controlplane.cluster import ControlPlaneError, LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import REPO_ROOT, load_versions

pytestmark = pytest.mark.apiserver  # a control plane of its own, not through the `kubeconfig` fixture

GO_MODULE = "sigs.k8s.io/cluster-api-ipam-provider-in-cluster"
GO_VERSION = "v1.1.0"  # the newest release the Go module proxy serves
GO_NAMESPACE = "capi-ipam-in-cluster-system"
RUNBOOK = REPO_ROOT / "docs" / "migrating-from-go-incluster.md"
STEPS = (
    "preflight-prefix-pools",
    "preflight-stored-versions",
    "preflight-storage-migration",
    "preflight-snapshot",
    "clusterctl-delete",
    "wait-go-pods-gone",
    "remove-leftovers",
    "take-over-crds",
    "deploy",
    "verify-pools",
    "verify-addresses",
    "verify-status",
    "verify-canary",
)
CLUSTERCTL_LABELS = {"clusterctl.cluster.x-k8s.io": "", "cluster.x-k8s.io/provider": "ipam-in-cluster"}
PROTECT_POOL = "ipam.cluster.x-k8s.io/ProtectPool"
RELEASE_ADDRESS = "ipam.cluster.x-k8s.io/ReleaseAddress"
PROTECT_ADDRESS = "ipam.cluster.x-k8s.io/ProtectAddress"
MUTATING = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "", False)
VALIDATING = Resource("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "", False)
GLOBAL_POOLS_V1ALPHA1 = Resource(IPAM_GROUP, "v1alpha1", "globalinclusterippools", "GlobalInClusterIPPool", False)
POOL_CRDS = ("inclusterippools.ipam.cluster.x-k8s.io", "globalinclusterippools.ipam.cluster.x-k8s.io")
PREFIX_POOL_CRDS = (
    "inclusterprefixpools.ipam.cluster.x-k8s.io",
    "globalinclusterprefixpools.ipam.cluster.x-k8s.io",
)

Object = dict[str, Any]


def runbook_steps() -> dict[str, str]:
    """The runbook's shell blocks by step name; the test fails if one is missing or unknown."""
    found = dict(re.findall(r"<!-- step: ([a-z0-9-]+) -->\n```sh\n(.*?)```", RUNBOOK.read_text(), re.DOTALL))
    assert set(found) == set(STEPS), f"runbook steps {sorted(found)} differ from the test's {sorted(STEPS)}"
    return found


def go_module_dir(version: str) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.fail(f"Go is needed to download {GO_MODULE}@{version} from the Go module proxy", pytrace=False)
    result = subprocess.run(
        [go, "mod", "download", "-json", f"{GO_MODULE}@{version}"], capture_output=True, text=True, cwd="/"
    )
    if result.returncode != 0:
        pytest.fail(f"go mod download {GO_MODULE}@{version} failed: {result.stdout}{result.stderr}", pytrace=False)
    return Path(json.loads(result.stdout)["Dir"])


def render_release(kubectl: Path, module: Path) -> list[Object]:
    """The Go provider's release components (`kustomize build config/default`), labelled as clusterctl does."""
    result = subprocess.run(
        [str(kubectl), "kustomize", str(module / "config" / "default")], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {module}/config/default failed: {result.stderr}", pytrace=False)
    documents = [d for d in yaml.safe_load_all(result.stdout) if d]
    for document in documents:
        document["metadata"].setdefault("labels", {}).update(CLUSTERCTL_LABELS)
    return documents


def stored_api_versions(etcd_port: int, plural: str) -> dict[str, str]:
    """`apiVersion` of each object of `plural` as etcd holds it (name → version), read past the apiserver."""
    prefix = f"/registry/{IPAM_GROUP}/{plural}/".encode()
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    body = json.dumps({"key": base64.b64encode(prefix).decode(), "range_end": base64.b64encode(end).decode()})
    request = urllib.request.Request(f"http://127.0.0.1:{etcd_port}/v3/kv/range", data=body.encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.load(response)
    stored = {}
    for kv in answer.get("kvs", []):
        value = json.loads(base64.b64decode(kv["value"]))
        stored[value["metadata"]["name"]] = value["apiVersion"]
    return stored


class Shell:
    """Runs the runbook's blocks with bash, as a person would paste them: kubectl (the harness's build) and
    ipam-provider on PATH, KUBECONFIG set, in a working directory with `crds/` (a link to the repository's)."""

    def __init__(self, kubectl: Path, kubeconfig: Path, workdir: Path) -> None:
        self.workdir = workdir
        (workdir / "crds").symlink_to(REPO_ROOT / "crds")
        path = os.pathsep.join([str(kubectl.parent), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.env = {**os.environ, "PATH": path, "KUBECONFIG": str(kubeconfig)}

    async def run(self, name: str, script: str, **env: str) -> str:
        process = await asyncio.create_subprocess_exec(
            "bash",
            "-e",
            "-o",
            "pipefail",
            "-c",
            script,
            cwd=self.workdir,
            env={**self.env, **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), timeout=300)
        text = output.decode()
        print(f"--- runbook step {name}:\n{script}--- output:\n{text}")
        assert process.returncode == 0, f"runbook step {name} exited with {process.returncode}:\n{text}"
        return text

    async def kubectl_create(self, documents: list[Object]) -> None:
        listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": documents})
        path = self.workdir / "release-part.json"
        path.write_text(listing)
        await self.run("(the Go release, as clusterctl creates it)", f"kubectl create -f {path}\n")


def go_address(name: str, claim_obj: Object, pool_obj: Object, address: str, prefix: int, gateway: str) -> Object:
    """An IPAddress as the Go provider v1.1.0 writes it (pkg/ipamutil): the claim as controller owner, the pool as
    owner, ProtectAddress, the claim's cluster-name label; no reservation anywhere."""
    meta = claim_obj["metadata"]
    return {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {
            "name": name,
            "labels": {LABEL_CLUSTER_NAME: meta["labels"][LABEL_CLUSTER_NAME]},
            "finalizers": [PROTECT_ADDRESS],
            "ownerReferences": [
                {
                    "apiVersion": CLAIMS.api_version,
                    "kind": CLAIMS.kind,
                    "name": name,
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                },
                {
                    "apiVersion": pool_obj["apiVersion"],
                    "kind": pool_obj["kind"],
                    "name": pool_obj["metadata"]["name"],
                    "uid": pool_obj["metadata"]["uid"],
                    "controller": False,
                    "blockOwnerDeletion": True,
                },
            ],
        },
        "spec": {
            "claimRef": {"name": name},
            "poolRef": {"apiGroup": IPAM_GROUP, "kind": pool_obj["kind"], "name": pool_obj["metadata"]["name"]},
            "address": address,
            "prefix": prefix,
            **({"gateway": gateway} if gateway else {}),  # Go leaves an empty gateway out
        },
    }


async def json_patch(kube: KubeClient, resource: Resource, name: str, operations: list[Object]) -> Object:
    return await kube.patch(resource, name, operations, form=JSON_PATCH)


async def storage_version_switch(kube: KubeClient, crd_name: str, storage: str, conversion: Object) -> None:
    """Make `storage` the CRD's storage version and set `conversion`, as a Go provider upgrade once did."""
    crd = await kube.get(CRDS, crd_name)
    assert crd is not None
    operations: list[Object] = [
        {"op": "replace", "path": f"/spec/versions/{i}/storage", "value": version["name"] == storage}
        for i, version in enumerate(crd["spec"]["versions"])
    ]
    operations.append({"op": "replace", "path": "/spec/conversion", "value": conversion})
    await json_patch(kube, CRDS, crd_name, operations)


async def wait_established(kube: KubeClient, names: tuple[str, ...]) -> None:
    async def established() -> bool:
        for name in names:
            crd = await kube.get(CRDS, name)
            conditions = ((crd or {}).get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    await wait_for(established, timeout=30, message=f"CRDs {names} Established")


async def api_error_of(call: Awaitable[Any]) -> ApiError:
    try:
        await call
    except ApiError as error:
        return error
    pytest.fail("the request succeeded, but the Go provider's leftovers should have refused it")


async def test_the_runbook_takes_over_a_go_provider_install(tmp_path: Path) -> None:
    steps = runbook_steps()
    try:
        binaries = await asyncio.to_thread(binaries_dir)
        capi_crds = capi_crd_paths(load_versions())
    except AssetError as error:
        pytest.fail(f"cannot build the control plane for the migration test: {error}", pytrace=False)
    kubectl = binaries / "kubectl"
    if not kubectl.is_file():
        pytest.fail(f"kubectl is missing from {binaries} (hack/control-plane/build-binaries.sh builds it)")
    release = render_release(kubectl, go_module_dir(GO_VERSION))
    plane = LocalControlPlane(tmp_path / "control-plane", binaries)
    try:
        await asyncio.to_thread(plane.start)
    except ControlPlaneError as error:
        pytest.fail(f"cannot start the control plane for the migration test: {error}", pytrace=False)
    assert plane.state is not None
    workdir = tmp_path / "work"
    workdir.mkdir()
    shell = Shell(kubectl, plane.kubeconfig_path, workdir)
    kube = await KubeClient.from_kubeconfig(str(plane.kubeconfig_path))
    try:
        await install_crds(kube, capi_crds)  # Cluster API's CRDs only: ours come through the runbook
        await follow_the_runbook(kube, shell, steps, release, plane.state.etcd_port, plane.kubeconfig_path)
    finally:
        await kube.close()
        await asyncio.to_thread(plane.stop)


async def follow_the_runbook(
    kube: KubeClient, shell: Shell, steps: dict[str, str], release: list[Object], etcd_port: int, kubeconfig: Path
) -> None:
    # --- The Go provider's install, as `clusterctl init --ipam in-cluster:v1.1.0` leaves it. There is no
    # cert-manager here, so no Certificate and Issuer, and nothing serves the webhooks.
    webhook_kinds = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    installed = [d for d in release if not d["apiVersion"].startswith("cert-manager.io/")]
    await shell.kubectl_create([d for d in installed if d["kind"] not in webhook_kinds])
    crds = {d["metadata"]["name"]: d for d in release if d["kind"] == "CustomResourceDefinition"}
    await wait_established(kube, tuple(crds))
    go_conversion = crds[POOL_CRDS[0]]["spec"]["conversion"]
    assert go_conversion["strategy"] == "Webhook"
    assert go_conversion["webhook"]["clientConfig"]["service"] == {
        "name": "capi-ipam-in-cluster-webhook-service",
        "namespace": GO_NAMESPACE,
        "path": "/convert",
    }

    # Both CRDs once stored v1alpha1 (as the Go provider's early releases did), so both list it in storedVersions;
    # one global pool was written then and is still stored as v1alpha1.
    for name in POOL_CRDS:
        await storage_version_switch(kube, name, "v1alpha1", {"strategy": "None"})
    await wait_established(kube, POOL_CRDS)
    legacy = await kube.create(
        GLOBAL_POOLS_V1ALPHA1,
        {
            "apiVersion": GLOBAL_POOLS_V1ALPHA1.api_version,
            "kind": "GlobalInClusterIPPool",
            "metadata": {"name": "shared", "finalizers": [PROTECT_POOL]},
            "spec": {"addresses": ["10.61.0.0/28"], "prefix": 28, "gateway": "10.61.0.1"},
        },
    )
    status = {"status": {"ipAddresses": {"total": 13, "used": 3, "free": 10, "outOfRange": 0}}}
    await kube.patch(GLOBAL_POOLS_V1ALPHA1, "shared", status, subresource="status")
    for name in POOL_CRDS:
        await storage_version_switch(kube, name, "v1alpha2", crds[name]["spec"]["conversion"])
    await wait_established(kube, POOL_CRDS)
    shared = {**legacy, "apiVersion": GLOBAL_POOLS.api_version}  # reading it now needs the conversion webhook

    # The Go provider's objects: a namespaced pool and the global one, claims in two namespaces, their IPAddresses
    # (with holes where claims were released), status as the Go provider writes it (addressRef, no conditions).
    ns, ns_b = "workloads", "workloads-b"
    for namespace in (ns, ns_b):
        await kube.create(NAMESPACES, {"metadata": {"name": namespace}})
        await kube.create(CLUSTERS, cluster("workload-1"), namespace)
    body = pool("nodes", ["10.60.0.10-10.60.0.20"], 24, gateway="10.60.0.1")
    body["metadata"]["finalizers"] = [PROTECT_POOL]
    nodes = await kube.create(POOLS, body, ns)
    status = {"status": {"ipAddresses": {"total": 11, "used": 3, "free": 8, "outOfRange": 0}}}
    await kube.patch(POOLS, "nodes", status, ns, subresource="status")
    pods, shared_prefixes = await create_go_prefix_pools(kube, ns)
    old = {
        (ns, "old-0"): (nodes, "10.60.0.10", 24, "10.60.0.1"),
        (ns, "old-1"): (nodes, "10.60.0.11", 24, "10.60.0.1"),
        (ns, "old-2"): (nodes, "10.60.0.13", 24, "10.60.0.1"),
        (ns, "old-g0"): (shared, "10.61.0.2", 28, "10.61.0.1"),
        (ns, "old-g1"): (shared, "10.61.0.3", 28, "10.61.0.1"),
        (ns_b, "old-g2"): (shared, "10.61.0.5", 28, "10.61.0.1"),
        (ns, "old-p0"): (pods, "fd00:60::", 64, "fd00:60::1"),
        (ns, "old-p1"): (pods, "fd00:60:0:2::", 64, "fd00:60::1"),
        (ns_b, "old-gp0"): (shared_prefixes, "fd00:61::", 60, ""),
    }
    old_addresses: dict[tuple[str, str], Object] = {}
    for (namespace, name), (pool_obj, address, prefix, gateway) in old.items():
        pool_name = pool_obj["metadata"]["name"]
        body = claim(name, pool_name, kind=pool_obj["kind"], labels={LABEL_CLUSTER_NAME: "workload-1"})
        body["metadata"]["finalizers"] = [RELEASE_ADDRESS]
        created = await kube.create(CLAIMS, body, namespace)
        old_addresses[(namespace, name)] = await kube.create(
            ADDRESSES, go_address(name, created, pool_obj, address, prefix, gateway), namespace
        )
        await kube.patch(CLAIMS, name, {"status": {"addressRef": {"name": name}}}, namespace, subresource="status")

    # What the stale conversion stanza does once the Go provider's Service is gone: a list of global pools fails,
    # because one of them is stored as v1alpha1 (the Service is put back: the Go provider still runs).
    service = next(d for d in installed if d["metadata"]["name"] == "capi-ipam-in-cluster-webhook-service")
    await shell.run(
        "(the Go webhook Service, gone for a moment)",
        f"kubectl -n {GO_NAMESPACE} delete service {service['metadata']['name']}\n",
    )
    broken = await api_error_of(kube.list(GLOBAL_POOLS))
    assert "conversion webhook for ipam.cluster.x-k8s.io/v1alpha1, Kind=GlobalInClusterIPPool failed" in broken.message
    await shell.kubectl_create([service])
    assert stored_api_versions(etcd_port, "globalinclusterippools") == {"shared": f"{IPAM_GROUP}/v1alpha1"}
    for name in POOL_CRDS:
        crd = await kube.get(CRDS, name)
        assert crd is not None and "v1alpha1" in crd["status"]["storedVersions"], crd and crd["status"]

    # --- 1. Pre-flight.
    output = await shell.run("preflight-prefix-pools", steps["preflight-prefix-pools"])
    assert output.splitlines() == [f'{name}: ["v1alpha2"]' for name in sorted(PREFIX_POOL_CRDS, reverse=True)], output
    output = await shell.run("preflight-stored-versions", steps["preflight-stored-versions"])
    assert output.count("v1alpha1") == 2, output
    # Stand-in for the Go provider's webhooks, which cannot be served here. Its conversion webhook: for the legacy
    # pool (only addresses, prefix and gateway) converting v1alpha1 to v1alpha2 changes nothing but apiVersion, as
    # strategy None does; the stanza goes back afterwards, as the Go provider left it. Its admission webhooks
    # (which would admit the rewrite): their configurations are created only after the pre-flight.
    none = [{"op": "replace", "path": "/spec/conversion", "value": {"strategy": "None"}}]
    for name in POOL_CRDS:
        await json_patch(kube, CRDS, name, none)
    await shell.run("preflight-storage-migration", steps["preflight-storage-migration"])
    for name in POOL_CRDS:
        await json_patch(kube, CRDS, name, [{"op": "replace", "path": "/spec/conversion", "value": go_conversion}])
        crd = await kube.get(CRDS, name)
        assert crd is not None and crd["status"]["storedVersions"] == ["v1alpha2"], crd and crd["status"]
    assert stored_api_versions(etcd_port, "globalinclusterippools") == {"shared": f"{IPAM_GROUP}/v1alpha2"}
    assert stored_api_versions(etcd_port, "inclusterippools") == {"nodes": f"{IPAM_GROUP}/v1alpha2"}
    await shell.run("preflight-snapshot", steps["preflight-snapshot"])
    before = (shell.workdir / "ipaddresses-before.txt").read_text().splitlines()
    assert sorted(before) == sorted(
        f"{namespace} {name} {pool_obj['kind']} {pool_obj['metadata']['name']} {address}"
        for (namespace, name), (pool_obj, address, _, _) in old.items()
    )

    await shell.kubectl_create([d for d in installed if d["kind"] in webhook_kinds])

    # --- 2. clusterctl delete, emulated: it deletes the provider's labelled objects in its namespace. Here it leaves
    # the webhook configurations (as when the provider was installed another way, or clusterctl stopped on an
    # error), so that step 3 has to delete them.
    assert "clusterctl delete --ipam in-cluster" in steps["clusterctl-delete"]
    assert "--include-crd" not in steps["clusterctl-delete"]
    namespaced = [d for d in installed if d["metadata"].get("namespace") == GO_NAMESPACE]
    assert {d["kind"] for d in namespaced} >= {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"}
    deletions = "".join(f"kubectl -n {GO_NAMESPACE} delete {d['kind']} {d['metadata']['name']}\n" for d in namespaced)
    await shell.run("(clusterctl delete)", deletions)
    # Claims made while no provider runs: they wait, and are served once ours starts.
    for name, pool_obj in [
        ("new-0", nodes),
        ("new-1", nodes),
        ("new-2", nodes),
        ("new-g0", shared),
        ("new-g1", shared),
        ("new-p0", pods),
    ]:
        await kube.create(CLAIMS, claim(name, pool_obj["metadata"]["name"], kind=pool_obj["kind"]), ns)
    await shell.run("wait-go-pods-gone", steps["wait-go-pods-gone"])

    # --- 3. The leftovers, by the names the Go release gives them. While the webhook configurations stay, a pool
    # cannot even be labelled.
    label = {"metadata": {"labels": {"migrated": "yes"}}}
    refused = await api_error_of(kube.patch(POOLS, "nodes", label, ns))
    assert 'failed calling webhook "default.inclusterippool.ipam.cluster.x-k8s.io"' in refused.message, refused
    leftovers = [d for d in release if d["kind"] in webhook_kinds | {"ClusterRole", "ClusterRoleBinding"}]
    for document in leftovers:
        reference = f"{document['kind'].lower()}/{document['metadata']['name']}"
        assert reference in steps["remove-leftovers"], f"the runbook does not delete {reference}"
    await shell.run("remove-leftovers", steps["remove-leftovers"])
    for resource, name in [
        (MUTATING, "capi-ipam-in-cluster-mutating-webhook-configuration"),
        (VALIDATING, "capi-ipam-in-cluster-validating-webhook-configuration"),
    ]:
        assert await kube.get(resource, name) is None, f"{name} is still there"
    await kube.patch(POOLS, "nodes", label, ns)

    # --- 4. The CRDs.
    await shell.run("take-over-crds", steps["take-over-crds"])
    for name in POOL_CRDS:
        crd = await kube.get(CRDS, name)
        assert crd is not None
        assert crd["spec"]["conversion"] == {"strategy": "None"}, crd["spec"]["conversion"]
        assert "cert-manager.io/inject-ca-from" not in crd["metadata"].get("annotations", {})
        versions = {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]}
        assert versions == {"v1alpha2": (True, True), "v1alpha1": (False, False)}, versions
        assert crd["status"]["storedVersions"] == ["v1alpha2"]
        assert crd["metadata"]["labels"].get("clusterctl.cluster.x-k8s.io/move-hierarchy") == ""
    for name in PREFIX_POOL_CRDS:
        crd = await kube.get(CRDS, name)
        assert crd is not None
        assert crd["spec"]["conversion"] == {"strategy": "None"}, crd["spec"]["conversion"]
        assert "cert-manager.io/inject-ca-from" not in crd["metadata"].get("annotations", {})
        assert [(v["name"], v["served"], v["storage"]) for v in crd["spec"]["versions"]] == [("v1alpha2", True, True)]
        assert "x-kubernetes-validations" in json.dumps(crd["spec"]["versions"][0]["schema"]), "not our CRD"
    await wait_established(kube, (*POOL_CRDS, *PREFIX_POOL_CRDS, f"{RESERVATIONS.plural}.{IPAM_GROUP}"))

    # --- 5. Our controller, in this process instead of `deploy`.
    async with run_controller(kubeconfig):
        for name in ("new-3", "new-4"):
            await kube.create(CLAIMS, claim(name, "nodes"), ns)
        await kube.create(CLAIMS, claim("new-p1", "pods", kind="InClusterPrefixPool"), ns)
        await wait_all_fulfilled(kube, 18)

        # --- 6. Verify.
        output = await shell.run("verify-pools", steps["verify-pools"])
        assert output.count("condition met") == 4, output
        await assert_pool(kube, POOLS, "nodes", ns, total=11, used=8, free=3)
        await assert_pool(kube, GLOBAL_POOLS, "shared", None, total=13, used=5, free=8)
        await assert_pool(kube, PREFIX_POOLS, "pods", ns, total=65536, used=4, free=65532)
        await assert_pool(kube, GLOBAL_PREFIX_POOLS, "shared-prefixes", None, total=16, used=1, free=15)
        output = await shell.run("verify-addresses", steps["verify-addresses"])
        assert "every IPAddress kept its address" in output
        assert "IPAddresses: 18, reservations: 18" in output
        output = await shell.run("verify-status", steps["verify-status"])
        assert output.count("AddressAllocated") == 18, output
        for (namespace, name), (pool_obj, address, prefix, _) in old.items():
            row = rf"^{namespace}\s+{name}\s+{pool_obj['kind']}/{pool_obj['metadata']['name']}\s+{address}/{prefix}\s+"
            assert re.search(row + r"AddressAllocated\s*$", output, re.MULTILINE), f"no row for {name}:\n{output}"
        canary = {"NS": ns, "POOL": "nodes", "POOL_KIND": "InClusterIPPool"}
        output = await shell.run("verify-canary", steps["verify-canary"], **canary)
        assert "the canary got 10.60.0.18, which is new" in output

        # The old IPAddresses are the same objects (adopted, never re-created), with the same spec.
        for (namespace, name), original in old_addresses.items():
            current = await kube.get(ADDRESSES, name, namespace)
            assert current is not None
            assert current["metadata"]["uid"] == original["metadata"]["uid"]
            assert current["spec"] == original["spec"]
            claim_obj = await kube.get(CLAIMS, name, namespace)
            assert claim_obj is not None and claim_obj["status"]["addressRef"] == {"name": name}
        # New claims took the lowest free addresses, never an old one.
        new_nodes = {await address_of(kube, ns, f"new-{i}") for i in range(5)}
        assert new_nodes == {"10.60.0.12", "10.60.0.14", "10.60.0.15", "10.60.0.16", "10.60.0.17"}, new_nodes
        new_shared = {await address_of(kube, ns, f"new-g{i}") for i in range(2)}
        assert new_shared == {"10.61.0.4", "10.61.0.6"}, new_shared
        # New prefix claims took the lowest free /64s: the hole first.
        new_prefixes = {await address_of(kube, ns, f"new-p{i}") for i in range(2)}
        assert new_prefixes == {"fd00:60:0:1::", "fd00:60:0:3::"}, new_prefixes
        output = await shell.run(
            "verify-canary", steps["verify-canary"], NS=ns, POOL="pods", POOL_KIND="InClusterPrefixPool"
        )
        assert "the canary got fd00:60:0:4::, which is new" in output


async def create_go_prefix_pools(kube: KubeClient, namespace: str) -> tuple[Object, Object]:
    """A namespaced and a global IPv6 prefix pool, as the Go provider v1.1.0 leaves them: defaulted
    allocationPrefixLength, the ProtectPool finalizer, its status counts."""
    body = {
        "apiVersion": PREFIX_POOLS.api_version,
        "kind": "InClusterPrefixPool",
        "metadata": {"name": "pods", "finalizers": [PROTECT_POOL]},
        "spec": {"prefixes": ["fd00:60::/48"], "gateway": "fd00:60::1"},
    }
    pods = await kube.create(PREFIX_POOLS, body, namespace)
    assert pods["spec"]["allocationPrefixLength"] == 64, "the Go CRD's default"
    counts = {"total": 65536, "used": 2, "free": 65534, "outOfRange": 0}
    await kube.patch(PREFIX_POOLS, "pods", {"status": {"ipAddresses": counts}}, namespace, subresource="status")
    body = {
        **body,
        "kind": "GlobalInClusterPrefixPool",
        "metadata": {"name": "shared-prefixes", "finalizers": [PROTECT_POOL]},
        "spec": {"prefixes": ["fd00:61::/56"], "allocationPrefixLength": 60},
    }
    shared = await kube.create(GLOBAL_PREFIX_POOLS, body)
    counts = {"total": 16, "used": 1, "free": 15, "outOfRange": 0}
    await kube.patch(GLOBAL_PREFIX_POOLS, "shared-prefixes", {"status": {"ipAddresses": counts}}, subresource="status")
    return pods, shared


async def wait_all_fulfilled(kube: KubeClient, count: int) -> None:
    seen: dict[str, Any] = {}

    async def fulfilled() -> bool:
        claims, _ = await kube.list(CLAIMS)
        seen.clear()
        for c in claims:
            seen[f"{c['metadata']['namespace']}/{c['metadata']['name']}"] = ready_condition(c)
        reasons = [(condition or {}).get("reason") for condition in seen.values()]
        return len(claims) == count and all(r == "AddressAllocated" for r in reasons)

    await wait_for(fulfilled, timeout=60, message=lambda: f"{count} claims AddressAllocated; Ready: {seen}")


async def assert_pool(
    kube: KubeClient, resource: Resource, name: str, namespace: str | None, *, total: int, used: int, free: int
) -> None:
    async def counted() -> Object | None:
        obj = await kube.get(resource, name, namespace)
        counts = ((obj or {}).get("status") or {}).get("ipAddresses") or {}
        condition = ready_condition(obj) or {}
        wanted = counts.get("total") == total and counts.get("used") == used and counts.get("free") == free
        return obj if wanted and condition.get("status") == "True" else None

    await wait_for(counted, timeout=30, message=f"{name}: Ready, total {total}, used {used}, free {free}")


async def address_of(kube: KubeClient, namespace: str, name: str) -> str:
    address = await kube.get(ADDRESSES, name, namespace)
    assert address is not None, f"claim {namespace}/{name} has no IPAddress"
    return str(address["spec"]["address"])
