"""The deployment manifests (config/) build, and the examples (examples/incluster/) are accepted by the real CRDs
and served by the controller exactly as a user would see them after `kubectl apply -f examples/incluster/`."""

from __future__ import annotations

import asyncio
import ipaddress
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.incluster.backend import GLOBAL_IN_CLUSTER_POOL, IN_CLUSTER_POOL
from backends.incluster.prefix_backend import GLOBAL_IN_CLUSTER_PREFIX_POOL, IN_CLUSTER_PREFIX_POOL
from backends.infoblox.spec import INFOBLOX_POOL
from backends.netbox.spec import GLOBAL_NETBOX_POOL, NETBOX_POOL
from ipam_provider.admission import webhook_path
from ipam_provider.api.capi import ADDRESSES, CLAIMS, CLUSTERS
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION
from ipam_provider.flags import RunOptions, build_parser, parse_args
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES
from ipam_provider.runtime.serving.certificates import CertificateFiles
from ipam_provider.version import __version__
from tests.support.cluster import wait_for
from tests.support.controller import run_controller
from tests.support.objects import GLOBAL_POOLS, POOLS, PREFIX_POOLS, wait_address
from tools.controlplane.assets import AssetError, binaries_dir

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
# Files under config/ that are not Kubernetes objects: the plain Prometheus rules file
# (tests/tools/test_prometheus_rules.py checks it).
NOT_MANIFESTS = frozenset({CONFIG / "prometheus" / "rules.yaml"})
EXAMPLES = REPO / "examples" / "incluster"
DEMO_NAMESPACE = "ipam-demo"
SYSTEM_NAMESPACE = "capi-ipam-system"
METRICS_SERVICE = "capi-ipam-controller-manager-metrics-service"
WEBHOOK_SERVICE = "capi-ipam-webhook-service"
WEBHOOK_CERTIFICATE = "capi-ipam-serving-cert"
WEBHOOK_CONFIGURATION = "capi-ipam-validating-webhook-configuration"
WEBHOOK_POOL_KINDS = (
    IN_CLUSTER_POOL,
    GLOBAL_IN_CLUSTER_POOL,
    IN_CLUSTER_PREFIX_POOL,
    GLOBAL_IN_CLUSTER_PREFIX_POOL,
    NETBOX_POOL,
    GLOBAL_NETBOX_POOL,
    INFOBLOX_POOL,
)
CLUSTER_SCOPED = (
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "ValidatingWebhookConfiguration",
)
PROVIDER_LABEL = ("cluster.x-k8s.io/provider", "ipam-py")
RESOURCES = {r.kind: r for r in (NAMESPACES, POOLS, GLOBAL_POOLS, PREFIX_POOLS, CLUSTERS, CLAIMS)}
POOL_KINDS = ("InClusterIPPool", "GlobalInClusterIPPool", "InClusterPrefixPool")
Object = dict[str, Any]


def kubectl_binary() -> str:
    """The kubectl built with the test control plane (same version as the API server), else one on PATH."""
    try:
        candidate = binaries_dir() / "kubectl"
    except AssetError as error:
        pytest.fail(f"cannot find the control plane's binaries: {error}", pytrace=False)
    found = str(candidate) if candidate.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.fail(f"kubectl is neither in {candidate.parent} nor on PATH", pytrace=False)
    return found


def kubectl(*args: str) -> str:
    """Run kubectl without a cluster (kustomize builds); fail the test with its stderr if it fails."""
    result = subprocess.run([kubectl_binary(), *args], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"kubectl {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


async def kubectl_against(
    kubeconfig: Path, *args: str, context: str = "admin", stdin: str | None = None
) -> tuple[int, str, str]:
    """Run kubectl against the test API server without blocking the event loop (a controller may be running)."""
    process = await asyncio.create_subprocess_exec(
        kubectl_binary(),
        f"--kubeconfig={kubeconfig}",
        f"--context={context}",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), 120)
    return process.returncode or 0, stdout.decode(), stderr.decode()


def load_yaml(path: Path) -> list[Object]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def example_documents() -> list[Object]:
    return [doc for path in sorted(EXAMPLES.glob("*.yaml")) for doc in load_yaml(path)]


def built(directory: Path, *flags: str) -> list[Object]:
    return [doc for doc in yaml.safe_load_all(kubectl("kustomize", *flags, str(directory))) if doc]


# --- config/ -------------------------------------------------------------------------------------------------


def test_every_config_manifest_parses_and_every_kustomization_resource_exists() -> None:
    paths = sorted(set(CONFIG.rglob("*.yaml")) - NOT_MANIFESTS)
    assert len(paths) >= 10, f"config/ looks incomplete: {[str(p) for p in paths]}"
    for path in paths:
        documents = load_yaml(path)
        assert documents, f"{path} holds no document"
        if path.name == "kustomization.yaml":
            for entry in documents[0].get("resources", []):
                assert (path.parent / entry).exists(), f"{path} names {entry}, which does not exist"
            continue
        for doc in documents:
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), f"{path}: not a Kubernetes object: {doc}"
            assert doc["metadata"].get("name"), f"{path}: {doc['kind']} without a name"


def generated_crds() -> list[Object]:
    return [doc for path in sorted((REPO / "crds").glob("*.yaml")) for doc in load_yaml(path)]


@pytest.mark.apiserver  # kustomize: the kubectl built with the control plane
def test_config_default_builds_into_the_provider_components() -> None:
    """With plain `kubectl kustomize` (no load-restrictor flag), CRDs included."""
    objects = built(CONFIG / "default")
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    crds = {("CustomResourceDefinition", doc["metadata"]["name"]) for doc in generated_crds()}
    assert len(crds) == 9
    assert set(by_kind) == crds | {
        ("Namespace", SYSTEM_NAMESPACE),
        ("ServiceAccount", "capi-ipam-controller-manager"),
        ("ClusterRole", "capi-ipam-manager-role"),
        ("ClusterRoleBinding", "capi-ipam-manager-rolebinding"),
        ("Role", "capi-ipam-leader-election-role"),
        ("RoleBinding", "capi-ipam-leader-election-rolebinding"),
        ("Deployment", "capi-ipam-controller-manager"),
        ("Service", METRICS_SERVICE),
        ("ClusterRole", "capi-ipam-metrics-reader"),
        ("Issuer", "capi-ipam-selfsigned-issuer"),
        ("Certificate", "capi-ipam-metrics-certs"),
        ("Certificate", WEBHOOK_CERTIFICATE),
        ("Service", WEBHOOK_SERVICE),
        ("ValidatingWebhookConfiguration", WEBHOOK_CONFIGURATION),
    }
    for obj in objects:
        labels = obj["metadata"].get("labels") or {}
        assert labels.get(PROVIDER_LABEL[0]) == PROVIDER_LABEL[1], f"{obj['kind']} lacks the provider label"
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == SYSTEM_NAMESPACE, obj["metadata"]
    for crd in generated_crds():  # exactly as generated: they carry the provider label already
        assert by_kind[("CustomResourceDefinition", crd["metadata"]["name"])] == crd
    service_account = ("ServiceAccount", SYSTEM_NAMESPACE, "capi-ipam-controller-manager")
    for binding in ("ClusterRoleBinding", "RoleBinding"):
        subjects = next(o for (kind, _), o in by_kind.items() if kind == binding)["subjects"]
        assert [(s["kind"], s["namespace"], s["name"]) for s in subjects] == [service_account]

    deployment = by_kind[("Deployment", "capi-ipam-controller-manager")]
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["serviceAccountName"] == service_account[2]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == f"localhost/capi-ipam-provider-py:v{__version__}"  # named in full, as clusterctl wants
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8443, "healthz": 8081, "webhook-server": 9443}
    assert {container["livenessProbe"]["httpGet"]["port"], container["readinessProbe"]["httpGet"]["port"]} == {
        "healthz"
    }
    # The command line must be one the CLI accepts, with leader election on (two replicas) and JSON logs.
    assert container["command"] == ["ipam-provider"]
    argv = [arg.replace("$(POD_NAMESPACE)", SYSTEM_NAMESPACE) for arg in container["args"]]
    args = build_parser().parse_args(argv)
    assert args.command == "run" and args.leader_elect and args.log_format == "json"
    assert (args.diagnostics_address, args.health_probe_bind_address) == (":8443", ":8081")
    options = parse_args(argv).options
    assert options.metrics.secure and args.metrics_bind_address is None
    assert args.leader_election_namespace == SYSTEM_NAMESPACE
    assert_metrics_are_served_securely(by_kind, pod, options.metrics.cert)
    assert_the_webhook_is_wired(by_kind, pod, options)


def assert_the_webhook_is_wired(by_kind: dict[tuple[str, str], Object], pod: Object, options: RunOptions) -> None:
    """The configuration calls the webhook Service at the controller's paths for our pool kinds only, with the CA
    of the Certificate whose Secret is mounted at --webhook-cert-dir; the Service reaches the webhook port."""
    (container,) = pod["containers"]
    assert options.webhook.bind == ("0.0.0.0", 9443)
    service = by_kind[("Service", WEBHOOK_SERVICE)]["spec"]
    assert service["selector"] == pod_labels(by_kind)
    (port,) = service["ports"]
    assert (port["port"], port["targetPort"]) == (443, "webhook-server")
    certificate = by_kind[("Certificate", WEBHOOK_CERTIFICATE)]
    assert certificate["spec"]["dnsNames"] == [
        f"{WEBHOOK_SERVICE}.{SYSTEM_NAMESPACE}.svc",
        f"{WEBHOOK_SERVICE}.{SYSTEM_NAMESPACE}.svc.cluster.local",
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == options.webhook.cert.directory]
    assert volumes[mount["name"]]["secret"]["secretName"] == certificate["spec"]["secretName"]
    configuration = by_kind[("ValidatingWebhookConfiguration", WEBHOOK_CONFIGURATION)]
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{SYSTEM_NAMESPACE}/{WEBHOOK_CERTIFICATE}"
    }
    served = {kind.plural: kind for kind in WEBHOOK_POOL_KINDS}
    for webhook in configuration["webhooks"]:
        assert (webhook["failurePolicy"], webhook["sideEffects"], webhook["matchPolicy"]) == (
            "Fail",
            "None",
            "Equivalent",
        )
        assert webhook["admissionReviewVersions"] == ["v1"] and webhook["timeoutSeconds"] == 5
        (rule,) = webhook["rules"]
        (resource,) = rule["resources"]
        kind = served[resource]  # only pool kinds of this provider, no subresource, no wildcard
        assert rule["apiGroups"] == [kind.group] and rule["apiVersions"] == [kind.version]
        assert rule["scope"] == ("Namespaced" if kind.namespaced else "Cluster")
        assert webhook["clientConfig"] == {
            "service": {"name": WEBHOOK_SERVICE, "namespace": SYSTEM_NAMESPACE, "path": webhook_path(kind)}
        }
    operations = {
        webhook["rules"][0]["resources"][0]: webhook["rules"][0]["operations"] for webhook in configuration["webhooks"]
    }
    assert operations == {
        "inclusterippools": ["CREATE", "UPDATE", "DELETE"],
        "globalinclusterippools": ["CREATE", "UPDATE", "DELETE"],
        "inclusterprefixpools": ["CREATE", "UPDATE", "DELETE"],
        "globalinclusterprefixpools": ["CREATE", "UPDATE", "DELETE"],
        "netboxippools": ["CREATE", "UPDATE", "DELETE"],
        "globalnetboxippools": ["CREATE", "UPDATE", "DELETE"],
        "infobloxippools": ["DELETE"],
    }


def assert_metrics_are_served_securely(
    by_kind: dict[tuple[str, str], Object], pod: Object, cert: CertificateFiles
) -> None:
    """The metrics Service reaches the HTTPS port of the controller pods; cert-manager's Secret for the Service's
    names is mounted, optionally, where --metrics-cert-path points; the reader role grants get on /metrics; the
    controller may make the reviews."""
    service = by_kind[("Service", METRICS_SERVICE)]["spec"]
    (container,) = pod["containers"]
    assert service["selector"] == pod_labels(by_kind)
    (port,) = service["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("https", 8443, "metrics")
    certificate = by_kind[("Certificate", "capi-ipam-metrics-certs")]["spec"]
    assert certificate["issuerRef"] == {"kind": "Issuer", "name": "capi-ipam-selfsigned-issuer"}
    assert certificate["dnsNames"] == [
        f"{METRICS_SERVICE}.{SYSTEM_NAMESPACE}.svc",
        f"{METRICS_SERVICE}.{SYSTEM_NAMESPACE}.svc.cluster.local",
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == cert.directory]
    secret = volumes[mount["name"]]["secret"]
    assert secret == {"secretName": certificate["secretName"], "optional": True}
    assert (cert.cert_name, cert.key_name) == ("tls.crt", "tls.key")  # the keys of cert-manager's Secret
    reader = by_kind[("ClusterRole", "capi-ipam-metrics-reader")]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    rules = by_kind[("ClusterRole", "capi-ipam-manager-role")]["rules"]
    reviews = (("authentication.k8s.io", "tokenreviews"), ("authorization.k8s.io", "subjectaccessreviews"))
    for group, resource in reviews:
        assert {"apiGroups": [group], "resources": [resource], "verbs": ["create"]} in rules


def pod_labels(by_kind: dict[tuple[str, str], Object]) -> dict[str, str]:
    deployment = by_kind[("Deployment", "capi-ipam-controller-manager")]
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return {k: v for k, v in labels.items() if k == "control-plane"}


@pytest.mark.apiserver  # kustomize: the kubectl built with the control plane
def test_config_crd_builds_every_generated_crd() -> None:
    kustomization = yaml.safe_load((REPO / "crds" / "Kustomization").read_text())
    generated = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    assert kustomization["resources"] == generated, "crds/Kustomization is out of date: run `make generate`"
    objects = built(CONFIG / "crd")
    assert sorted(o["metadata"]["name"] for o in objects) == sorted(d["metadata"]["name"] for d in generated_crds())
    assert {o["kind"] for o in objects} == {"CustomResourceDefinition"}


async def test_the_documented_crd_install_applies(kube: KubeClient, kubeconfig: Path) -> None:
    """`kubectl apply --server-side -f crds/` is accepted (server-side dry run): it skips crds/Kustomization."""
    crds = REPO / "crds"
    code, out, err = await kubectl_against(kubeconfig, "apply", "--server-side", "--dry-run=server", "-f", str(crds))
    assert code == 0, err
    assert len(out.strip().splitlines()) == sum(len(load_yaml(p)) for p in crds.glob("*.yaml")), out


# --- examples/incluster/ -------------------------------------------------------------------------------------


def allocatable(spec: Object, count: int) -> list[str]:
    """The `count` first addresses an in-cluster pool may hand out, in the order of a LowestFree dynamic allocation,
    computed from the documented rules with nothing but the standard library (an oracle independent of the
    backend's interval arithmetic): the lowest first, and with `reserveStaticBand` the static band (the lowest
    min(max(16, size/16), 256) of them, none under 16) after every other one."""

    def expand(entries: list[str]) -> set[int]:
        found: set[int] = set()
        for entry in entries:
            if "/" in entry:
                network = ipaddress.ip_network(entry, strict=False)
                found.update(range(int(network.network_address), int(network.broadcast_address) + 1))
            elif "-" in entry:
                first, last = (int(ipaddress.ip_address(part.strip())) for part in entry.split("-"))
                found.update(range(first, last + 1))
            else:
                found.add(int(ipaddress.ip_address(entry)))
        return found

    first_entry = spec["addresses"][0].split("-")[0].split("/")[0]
    subnet = ipaddress.ip_network(f"{first_entry}/{spec['prefix']}", strict=False)
    free = expand(spec["addresses"]) - expand(spec.get("excludedAddresses", []))
    free -= {int(subnet.network_address), int(ipaddress.ip_address(spec["gateway"]))}
    if subnet.version == 4:
        free.discard(int(subnet.broadcast_address))
    ordered = sorted(free)
    if spec.get("reserveStaticBand"):
        band = 0 if len(ordered) < 16 else min(max(16, len(ordered) // 16), 256)
        ordered = ordered[band:] + ordered[:band]
    return [str(ipaddress.ip_address(value)) for value in ordered[:count]]


def fixed_address(claim: Object, pool: Object) -> str | None:
    """The address an example claim must get: the one its pool pre-allocates to it, else the one it requests."""
    meta = claim["metadata"]
    key = meta["name"] if pool["kind"] == "InClusterIPPool" else f"{meta['namespace']}/{meta['name']}"
    pre_allocated = (pool["spec"].get("preAllocations") or {}).get(key)
    requested = (meta.get("annotations") or {}).get(REQUESTED_ADDRESS_ANNOTATION)
    return str(pre_allocated or requested) if pre_allocated or requested else None


def children(spec: Object, count: int) -> list[str]:
    """The first addresses of the `count` lowest child prefixes a prefix pool may hand out, by enumeration."""
    length = spec["allocationPrefixLength"]
    excluded = [ipaddress.ip_network(entry) for entry in spec.get("excludedPrefixes", [])]
    found = []
    for prefix in spec["prefixes"]:
        for child in ipaddress.ip_network(prefix).subnets(new_prefix=length):
            if not any(child.overlaps(e) for e in excluded):
                found.append(str(child.network_address))
            if len(found) == count:
                return found
    return found


def is_subset(expected: Any, actual: Any) -> bool:
    """Whether every field of `expected` is in `actual` with the same value (the server may add defaults)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(is_subset(v, actual.get(k)) for k, v in expected.items())
    return bool(expected == actual)


def test_examples_are_consistent() -> None:
    documents = example_documents()
    files = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert files[0] == "00-namespace.yaml" and files == sorted(files), files
    pools = {(d["kind"], d["metadata"]["name"]) for d in documents if d["kind"] in POOL_KINDS}
    claims = [d for d in documents if d["kind"] == "IPAddressClaim"]
    assert {kind for kind, _ in pools} == set(POOL_KINDS)
    assert len(claims) >= 3 and any("clusterName" in c["spec"] for c in claims)
    for doc in documents:
        if doc["kind"] not in ("Namespace", "GlobalInClusterIPPool"):
            assert doc["metadata"]["namespace"] == DEMO_NAMESPACE, doc["metadata"]
    for claim in claims:
        ref = claim["spec"]["poolRef"]
        assert ref["apiGroup"] == "ipam.cluster.x-k8s.io" and (ref["kind"], ref["name"]) in pools, ref
    # Fixed addresses are shown both ways: a pool's preAllocations and a claim's requested-address annotation.
    assert any(d["spec"].get("preAllocations") for d in documents if d["kind"].endswith("InClusterIPPool"))
    assert any(REQUESTED_ADDRESS_ANNOTATION in (c["metadata"].get("annotations") or {}) for c in claims)


async def test_examples_apply_cleanly_and_every_claim_is_served(kube: KubeClient, kubeconfig: Path) -> None:
    documents = example_documents()
    claims = [d for d in documents if d["kind"] == "IPAddressClaim"]
    pools = {(d["kind"], d["metadata"]["name"]): d for d in documents if d["kind"] in POOL_KINDS}
    leftovers, _ = await kube.list(CLAIMS, DEMO_NAMESPACE)
    assert not leftovers, f"namespace {DEMO_NAMESPACE} already holds claims (from `make run`?); remove them first"

    async with run_controller(kubeconfig, namespaces=[DEMO_NAMESPACE]):
        try:
            # What `make run` does: one kubectl apply of the directory, field validation strict.
            code, out, err = await kubectl_against(kubeconfig, "apply", "--validate=strict", "-f", str(EXAMPLES))
            assert code == 0, f"kubectl apply -f {EXAMPLES} failed:\n{err}"
            assert "Warning" not in err, err
            assert len(out.strip().splitlines()) == len(documents), out
            for doc in documents:
                meta = doc["metadata"]
                stored = await kube.get(RESOURCES[doc["kind"]], meta["name"], meta.get("namespace"))
                assert stored is not None, f"{doc['kind']} {meta['name']} was not stored"
                assert is_subset(doc.get("spec", {}), stored.get("spec")), (doc.get("spec"), stored.get("spec"))

            served: dict[tuple[str, str], list[str]] = {}
            fixed: dict[tuple[str, str], set[str]] = {}  # by pool: addresses pre-allocated or requested
            for claim in claims:
                name, ref = claim["metadata"]["name"], claim["spec"]["poolRef"]
                address = await wait_address(kube, DEMO_NAMESPACE, name, timeout=60)
                pool_spec = pools[(ref["kind"], ref["name"])]["spec"]
                assert address["spec"]["poolRef"] == ref
                assert address["spec"]["claimRef"] == {"name": name}
                assert address["spec"]["prefix"] == pool_spec.get("prefix", pool_spec.get("allocationPrefixLength"))
                assert address["spec"]["gateway"] == pool_spec["gateway"]
                cluster = (claim["metadata"].get("labels") or {}).get("cluster.x-k8s.io/cluster-name")
                assert (address["metadata"].get("labels") or {}).get("cluster.x-k8s.io/cluster-name") == cluster
                key = (ref["kind"], ref["name"])
                served.setdefault(key, []).append(address["spec"]["address"])
                wanted = fixed_address(claim, pools[key])
                if wanted is not None:
                    assert address["spec"]["address"] == wanted, (name, address["spec"]["address"], wanted)
                    fixed.setdefault(key, set()).add(wanted)
            for key, addresses in served.items():
                assert len(set(addresses)) == len(addresses), f"{key} handed out an address twice: {addresses}"
                spec = pools[key]["spec"]
                if "addresses" not in spec:  # a prefix pool: the lowest children, first fit
                    first_fit = children(spec, len(addresses))
                    assert sorted(addresses, key=ipaddress.ip_address) == first_fit, (key, addresses)
                    continue
                pinned = fixed.get(key, set()) | set((spec.get("preAllocations") or {}).values())
                dynamic = [a for a in addresses if a not in pinned]
                lowest = allocatable(spec, len(dynamic) + len(pinned))
                expected = sorted([a for a in lowest if a not in pinned][: len(dynamic)], key=ipaddress.ip_address)
                assert sorted(dynamic, key=ipaddress.ip_address) == expected, (key, addresses)

            v4 = pools[("InClusterIPPool", "demo-v4")]

            async def pool_counts() -> Object | None:
                stored = await kube.get(POOLS, "demo-v4", DEMO_NAMESPACE)
                counts = ((stored or {}).get("status") or {}).get("ipAddresses") or {}
                return counts if counts.get("used") == len(served[("InClusterIPPool", "demo-v4")]) else None

            counts = await wait_for(pool_counts, message="demo-v4's status to count its addresses")
            assert counts["total"] == len(allocatable(v4["spec"], 1 << 16))
            assert counts["free"] == counts["total"] - counts["used"]
        finally:
            await remove_examples(kube, documents)


async def remove_examples(kube: KubeClient, documents: list[Object]) -> None:
    """Delete claims first (the running controller releases them), then pools, then the Cluster. The namespace
    stays: the test control plane runs no namespace controller, so a deleted namespace would stay Terminating."""
    order = ["IPAddressClaim", *POOL_KINDS, "Cluster"]
    for kind in order:
        batch = [d for d in documents if d["kind"] == kind]
        for doc in batch:
            meta = doc["metadata"]
            await kube.delete(RESOURCES[kind], meta["name"], meta.get("namespace"))

        async def gone(batch: list[Object] = batch, kind: str = kind) -> bool:
            for doc in batch:
                meta = doc["metadata"]
                if await kube.get(RESOURCES[kind], meta["name"], meta.get("namespace")) is not None:
                    return False
            return True

        await wait_for(gone, timeout=30, message=f"the example {kind}s to be deleted")
    remaining, _ = await kube.list(ADDRESSES, DEMO_NAMESPACE)
    assert not remaining, f"IPAddresses outlived their claims: {[a['metadata']['name'] for a in remaining]}"


async def test_strict_apply_refuses_a_misspelt_field(kube: KubeClient, kubeconfig: Path, namespace: str) -> None:
    """The apply above can fail: with strict field validation the real schema refuses a field it does not know."""
    claim = next(d for d in example_documents() if d["kind"] == "IPAddressClaim")
    typo = {**claim, "metadata": {"name": "typo", "namespace": namespace}, "spec": {**claim["spec"], "poolref": {}}}
    args = ("apply", "--dry-run=server", "--validate=strict", "-f", "-")
    code, _, err = await kubectl_against(kubeconfig, *args, stdin=yaml.safe_dump(typo))
    assert code != 0 and 'unknown field "spec.poolref"' in err, err
