"""pytest plugin: Cluster API's real core manager (the Cluster, topology and Runtime SDK controllers) against the
session's kube-apiserver, and a ClusterClass for it to render.

- `core_manager_binary()` builds the core manager from the pinned Cluster API module
  (`hack/clusterctl/build.sh core-manager`; cached by version outside the work tree, so only the first run builds).
- `install_topology_crds(kube)` installs every CRD of the pinned release (ClusterClass, MachineDeployment,
  ExtensionConfig, ...) and the harness's own infrastructure-cluster and control-plane kinds
  (tests/support/topology_crds.yaml), leaving any CRD that already exists as it is.
- `CoreManager` is the running process: `--namespace` set to one test's namespace, leader election off, its webhook
  server on a free port with a throwaway certificate (no webhook configuration points at it), its CRD migration
  off (it would rewrite the shared control plane's objects), its log in a file.
- `create_cluster_class(kube, namespace)` creates the templates and a ClusterClass whose inline patches write the
  `controlPlaneIpAddr` variable into the infrastructure cluster's `spec.controlPlaneEndpoint.host` and into a
  kube-vip manifest among the control plane's `spec.files`, and waits until Cluster API has reconciled it.
  `topology_cluster(...)` is a Cluster of that class; `rendered_endpoint_host` and `rendered_vip` read the two
  fields back from what the topology controller wrote.
- `extension_config(...)` is an ExtensionConfig limited to one namespace (ExtensionConfigs are cluster-scoped:
  the manager of every test sees every one, so a test deletes its own).

Fixture `capi_core_manager` (function): a `CoreManager` watching only the test's `namespace`, ready (its
`/readyz` answers) when the test starts. At teardown it deletes the namespace's Clusters and waits for the Cluster
controller to finish, then stops the manager. Nothing here skips: a failed build or start fails the test with Go's
or the manager's own words.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from ipam_provider.api.capi import CLUSTER_GROUP, CLUSTERS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tools.controlplane.assets import AssetError, capi_module_dir
from tools.controlplane.crds import install_crds
from tools.controlplane.pki import write_pki
from tools.controlplane.versions import REPO_ROOT, load_versions
from tools.prometheus import free_port

Object = dict[str, Any]
BUILD_SCRIPT = REPO_ROOT / "hack" / "clusterctl" / "build.sh"
HARNESS_CRDS = Path(__file__).with_name("topology_crds.yaml")
FEATURE_GATES = "ClusterTopology=true,RuntimeSDK=true"

CLUSTER_CLASSES = Resource(CLUSTER_GROUP, "v1beta2", "clusterclasses", "ClusterClass", namespaced=True)
EXTENSION_CONFIGS = Resource("runtime.cluster.x-k8s.io", "v1beta2", "extensionconfigs", "ExtensionConfig", False)
INFRA_GROUP = "infrastructure.topology.test"
CONTROL_PLANE_GROUP = "controlplane.topology.test"
INFRASTRUCTURE_CLUSTERS = Resource(INFRA_GROUP, "v1alpha1", "topologyclusters", "TopologyCluster", True)
INFRASTRUCTURE_CLUSTER_TEMPLATES = Resource(
    INFRA_GROUP, "v1alpha1", "topologyclustertemplates", "TopologyClusterTemplate", True
)
CONTROL_PLANES = Resource(CONTROL_PLANE_GROUP, "v1alpha1", "topologycontrolplanes", "TopologyControlPlane", True)
CONTROL_PLANE_TEMPLATES = Resource(
    CONTROL_PLANE_GROUP, "v1alpha1", "topologycontrolplanetemplates", "TopologyControlPlaneTemplate", True
)
ENDPOINT_VARIABLE = "controlPlaneIpAddr"
KUBE_VIP_MANIFEST = "/etc/kubernetes/manifests/kube-vip.yaml"
ENDPOINT_PORT = 6443
KUBERNETES_VERSION = "v1.34.2"  # the topology's version: only written into the control plane, never run


class CoreManagerError(RuntimeError):
    """The core manager could not be built or started; the message holds Go's output or the manager's log."""


def core_manager_binary() -> Path:
    """Build (or find in the cache) the core manager of the pinned Cluster API release; return its path."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "core-manager"], capture_output=True, text=True, timeout=1800, check=False
    )
    if result.returncode != 0:
        raise CoreManagerError(
            "could not build Cluster API's core manager (needs Go and the Go module proxy, or CAPI_CORE_MANAGER):\n"
            + result.stderr[-4000:]
        )
    return Path(result.stdout.strip().splitlines()[-1])


def topology_crd_paths() -> list[Path]:
    """Every CRD file of the pinned Cluster API release (config/crd/bases of its Go module), then the harness's."""
    base = capi_module_dir(load_versions()) / "config" / "crd" / "bases"
    paths = sorted(base.glob("*.yaml"))
    if not paths:
        raise AssetError(f"no Cluster API CRDs in {base}")
    return [*paths, HARNESS_CRDS]


async def install_topology_crds(kube: KubeClient) -> None:
    """Install what the core manager watches and the harness's kinds; a CRD that exists is left alone (the
    session's control plane is shared, and other tests installed the Cluster API CRDs of the same release)."""
    await install_crds(kube, topology_crd_paths(), only_missing=True)


@dataclass
class CoreManager:
    """A running core manager; `log` holds its output, `namespace` is the only one it watches."""

    process: subprocess.Popen[bytes]
    log: Path
    health_port: int
    namespace: str

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines of the manager's log."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; idempotent."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def core_manager_args(binary: Path, kubeconfig: Path, namespace: str, cert_dir: Path, health_port: int) -> list[str]:
    """The command line: one namespace, no leader election, free local ports, no CRD migration."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        "--leader-elect=false",
        f"--feature-gates={FEATURE_GATES}",
        f"--health-addr=127.0.0.1:{health_port}",
        f"--diagnostics-address=127.0.0.1:{free_port()}",
        "--insecure-diagnostics",
        f"--webhook-port={free_port()}",
        f"--webhook-cert-dir={cert_dir}",
        "--webhook-cert-name=server.crt",
        "--webhook-key-name=server.key",
        "--skip-crd-migration-phases=StorageVersionMigration,CleanupManagedFields",
    ]


def start_core_manager(binary: Path, kubeconfig: Path, namespace: str, directory: Path) -> CoreManager:
    """Start the manager for `namespace`, its certificate and log under `directory`; it is not ready yet."""
    cert_dir = directory / "webhook-certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    write_pki(cert_dir)
    health_port = free_port()
    log = directory / "capi-core-manager.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            core_manager_args(binary, kubeconfig, namespace, cert_dir, health_port),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return CoreManager(process, log, health_port, namespace)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


async def wait_ready(manager: CoreManager, timeout: float = 120.0) -> None:
    """Until the manager's `/readyz` answers 200; CoreManagerError with its log tail if it exits or times out."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(_ready, manager.health_port):
        code = manager.process.poll()
        if code is not None:
            raise CoreManagerError(f"the core manager exited with {code}:\n{manager.log_tail()}")
        if time.monotonic() > deadline:
            raise CoreManagerError(f"the core manager not ready after {timeout:.0f} s:\n{manager.log_tail()}")
        await asyncio.sleep(0.2)


async def delete_clusters(kube: KubeClient, namespace: str, timeout: float = 60.0) -> list[str]:
    """Delete every Cluster of `namespace` and wait until they are gone (the Cluster controller deletes what the
    topology created, then drops its finalizer). Returns the names still there after `timeout`, whose finalizers
    are then removed so that the namespace can go."""
    clusters, _ = await kube.list(CLUSTERS, namespace)
    for cluster in clusters:
        await kube.delete(CLUSTERS, cluster["metadata"]["name"], namespace)
    deadline = time.monotonic() + timeout
    while clusters and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        clusters, _ = await kube.list(CLUSTERS, namespace)
    for cluster in clusters:
        await kube.patch(CLUSTERS, cluster["metadata"]["name"], {"metadata": {"finalizers": None}}, namespace)
    return [cluster["metadata"]["name"] for cluster in clusters]


def _template(resource: Resource, name: str, spec: Object) -> Object:
    return {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {"name": name},
        "spec": {"template": {"spec": spec}},
    }


def _ref(resource: Resource, name: str) -> Object:
    return {"apiVersion": resource.api_version, "kind": resource.kind, "name": name}


def endpoint_patch() -> Object:
    """The ClusterClass patch: the variable into the infrastructure cluster's endpoint and the control plane's
    kube-vip manifest. Enabled only once the variable is set, so without it both render empty."""
    kube_vip = f"address: '{{{{ .{ENDPOINT_VARIABLE} }}}}'\nport: {ENDPOINT_PORT}\n"
    infra = {
        "selector": {**_selector(INFRASTRUCTURE_CLUSTER_TEMPLATES), "matchResources": {"infrastructureCluster": True}},
        "jsonPatches": [
            {
                "op": "add",
                "path": "/spec/template/spec/controlPlaneEndpoint",
                "valueFrom": {"template": f"host: '{{{{ .{ENDPOINT_VARIABLE} }}}}'\nport: {ENDPOINT_PORT}"},
            }
        ],
    }
    control_plane = {
        "selector": {**_selector(CONTROL_PLANE_TEMPLATES), "matchResources": {"controlPlane": True}},
        "jsonPatches": [
            {"op": "add", "path": "/spec/template/spec/files", "value": [{"path": KUBE_VIP_MANIFEST, "content": ""}]},
            # A template's output is read as YAML: a JSON string literal keeps the manifest a string.
            {
                "op": "replace",
                "path": "/spec/template/spec/files/0/content",
                "valueFrom": {"template": json.dumps(kube_vip)},
            },
        ],
    }
    return {
        "name": "control-plane-endpoint",
        "enabledIf": f"{{{{ if .{ENDPOINT_VARIABLE} }}}}true{{{{ end }}}}",
        "definitions": [infra, control_plane],
    }


def _selector(resource: Resource) -> Object:
    return {"apiVersion": resource.api_version, "kind": resource.kind}


def cluster_class(name: str) -> Object:
    """A ClusterClass named `name` over the templates `create_cluster_class` creates, with the optional string
    variable ENDPOINT_VARIABLE and `endpoint_patch()`."""
    return {
        "apiVersion": CLUSTER_CLASSES.api_version,
        "kind": CLUSTER_CLASSES.kind,
        "metadata": {"name": name},
        "spec": {
            "infrastructure": {"templateRef": _ref(INFRASTRUCTURE_CLUSTER_TEMPLATES, name)},
            "controlPlane": {"templateRef": _ref(CONTROL_PLANE_TEMPLATES, name)},
            "variables": [
                {"name": ENDPOINT_VARIABLE, "required": False, "schema": {"openAPIV3Schema": {"type": "string"}}}
            ],
            "patches": [endpoint_patch()],
        },
    }


def _reconciled(cluster_class: Object | None) -> bool:
    """Cluster API's ClusterClass controller has seen this generation and found its variables valid."""
    if not cluster_class:
        return False
    status = cluster_class.get("status") or {}
    variables_ready = any(
        c.get("type") == "VariablesReady" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return variables_ready and status.get("observedGeneration") == cluster_class["metadata"]["generation"]


async def create_cluster_class(
    kube: KubeClient, manager: CoreManager, name: str = "harness", timeout: float = 60.0
) -> Object:
    """Create the two templates and `cluster_class(name)` in the manager's namespace; answer the ClusterClass once
    the manager has reconciled it (the topology controller refuses a ClusterClass it has not)."""
    namespace = manager.namespace
    await kube.create(
        INFRASTRUCTURE_CLUSTER_TEMPLATES, _template(INFRASTRUCTURE_CLUSTER_TEMPLATES, name, {}), namespace
    )
    await kube.create(CONTROL_PLANE_TEMPLATES, _template(CONTROL_PLANE_TEMPLATES, name, {}), namespace)
    await kube.create(CLUSTER_CLASSES, cluster_class(name), namespace)
    deadline = time.monotonic() + timeout
    while not _reconciled(stored := await kube.get(CLUSTER_CLASSES, name, namespace)):
        if time.monotonic() > deadline:
            raise CoreManagerError(
                f"ClusterClass {namespace}/{name} not reconciled after {timeout:.0f} s: {(stored or {}).get('status')}"
                f"\n{manager.log_tail()}"
            )
        await asyncio.sleep(0.2)
    assert stored is not None
    return stored


def topology_cluster(
    name: str,
    class_name: str = "harness",
    *,
    variables: Mapping[str, Any] | None = None,
    replicas: int = 1,
    version: str = KUBERNETES_VERSION,
) -> Object:
    """A Cluster with `spec.topology` over `class_name`: `replicas` control-plane machines, `variables` by name."""
    topology: Object = {
        "classRef": {"name": class_name},
        "version": version,
        "controlPlane": {"replicas": replicas},
    }
    if variables:
        topology["variables"] = [{"name": key, "value": value} for key, value in variables.items()]
    return {
        "apiVersion": CLUSTERS.api_version,
        "kind": CLUSTERS.kind,
        "metadata": {"name": name},
        "spec": {"topology": topology},
    }


def rendered_endpoint_host(infrastructure_cluster: Object) -> str | None:
    """The host the patch wrote into an infrastructure cluster, or None (missing or empty)."""
    endpoint = (infrastructure_cluster.get("spec") or {}).get("controlPlaneEndpoint") or {}
    return endpoint.get("host") or None


def rendered_vip(control_plane: Object) -> str | None:
    """The address in a control plane's kube-vip manifest, or None (no manifest, or an empty address)."""
    for entry in (control_plane.get("spec") or {}).get("files") or []:
        if entry.get("path") == KUBE_VIP_MANIFEST:
            manifest = yaml.safe_load(entry.get("content") or "") or {}
            return str(manifest.get("address") or "") or None
    return None


def extension_config(name: str, url: str, ca_bundle: bytes, namespace: str) -> Object:
    """An ExtensionConfig for the Runtime Extension served at `url` (https, its certificate signed by the PEM
    `ca_bundle`), called only for objects in `namespace`."""
    return {
        "apiVersion": EXTENSION_CONFIGS.api_version,
        "kind": EXTENSION_CONFIGS.kind,
        "metadata": {"name": name},
        "spec": {
            "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        },
    }


@pytest_asyncio.fixture
async def capi_core_manager(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> AsyncIterator[CoreManager]:
    try:
        binary = core_manager_binary()
        await install_topology_crds(kube)
    except (CoreManagerError, AssetError, TimeoutError) as error:
        pytest.fail(str(error), pytrace=False)
    manager = start_core_manager(binary, kubeconfig, namespace, tmp_path)
    try:
        try:
            await wait_ready(manager)
        except CoreManagerError as error:
            pytest.fail(str(error), pytrace=False)
        yield manager
        await delete_clusters(kube, namespace)
    finally:
        manager.stop()
