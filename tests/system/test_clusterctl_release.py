"""The clusterctl release, proved with the real clusterctl (built from the pinned Cluster API module).

`make release-manifests` writes the components and the metadata; laid out as a local `file://` repository,
`clusterctl generate provider --ipam py:<version>` describes and renders them (defaults, variables from the
environment and from the config file, image overrides, another target namespace); the rendered components install
on a fresh API server, where every object is accepted and every CRD becomes Established.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ipam_provider.flags import parse_args
from tests.support.cluster import dedicated_control_plane
from tests.support.clusterctl import Clusterctl, LocalRepository, documents
from tests.system.test_examples import built, kubectl_binary
from tools.controlplane.assets import cert_manager_crd_paths
from tools.controlplane.versions import load_versions
from tools.release import (
    CLUSTERCTL_LABEL,
    CONTRACT,
    PROVIDER_LABEL,
    Release,
    canonical,
    release_version,
    variables,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
CRDS = REPO / "crds"
DOCS = REPO / "docs" / "clusterctl.md"
SYSTEM_NAMESPACE = "capi-ipam-system"
MOVE = f"{CLUSTERCTL_LABEL}/move"
MOVE_HIERARCHY = f"{CLUSTERCTL_LABEL}/move-hierarchy"
# What `clusterctl move` does with each kind (docs/clusterctl.md says why).
EXPECTED_MOVE = {
    "InClusterIPPool": MOVE_HIERARCHY,
    "NetboxIPPool": MOVE_HIERARCHY,
    "InfobloxIPPool": MOVE_HIERARCHY,
    "InfobloxInstance": MOVE_HIERARCHY,
    "GlobalInClusterIPPool": MOVE,
    "GlobalNetboxIPPool": MOVE,
    "InClusterPrefixPool": MOVE_HIERARCHY,
    "GlobalInClusterPrefixPool": MOVE,
    "InClusterIPReservation": None,
}
# The variables and their defaults; " " stands for the empty string (see config/release/manager_variables.yaml).
EXPECTED_VARIABLES = {
    "IPAM_PY_IMAGE_PULL_POLICY": "IfNotPresent",
    "IPAM_PY_LOG_FORMAT": "json",
    "IPAM_PY_LOG_LEVEL": "info",
    "IPAM_PY_WATCH_NAMESPACE": " ",
    "IPAM_PY_WATCH_FILTER": " ",
    "IPAM_PY_BACKENDS": " ",
    "IPAM_PY_WORKERS": "8",
}
Object = dict[str, Any]


def key(obj: Object) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def by_key(objects: list[Object]) -> dict[tuple[str, str], Object]:
    found = {key(o): o for o in objects}
    assert len(found) == len(objects), "two objects of the same kind and name"
    return found


def manager(objects: list[Object]) -> Object:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "manager"
    return dict(container)


def settings(container: Object, namespace: str = SYSTEM_NAMESPACE) -> dict[str, Any]:
    """What the controller runs with, from its command line: the CLI's resolved options (every alias, precedence
    and default applied), with the empty forms clusterctl leaves (`--watch-filter=`, `--backends=`) read as the
    CLI reads them."""
    assert container["command"] == ["ipam-provider"]
    argv = [arg.replace("$(POD_NAMESPACE)", namespace) for arg in container["args"]]
    parsed = dataclasses.asdict(parse_args(argv).options)
    parsed["controller"]["watch_filter"] = parsed["controller"]["watch_filter"] or None
    parsed["backends"] = parsed["backends"] or None
    return parsed


def pruned(value: Any) -> Any:
    """`value` without the empty fields (null, {}, []) that a round trip through Go types adds, such as
    `creationTimestamp: null` or `strategy: {}`."""
    if isinstance(value, dict):
        kept = {k: pruned(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [pruned(item) for item in value]
    return value


def as_config_default(obj: Object) -> Object:
    """The object as config/default builds it: clusterctl adds `clusterctl.cluster.x-k8s.io: ""` to everything, and
    reads some kinds into Go types and back, which adds empty fields and a zero `status` (never applied: status is
    a subresource, or the server's own)."""
    copy: Object = pruned({k: v for k, v in obj.items() if k != "status"})
    labels = copy["metadata"].get("labels") or {}
    if copy["kind"] != "CustomResourceDefinition":  # the CRDs carry it from their generator
        assert labels.pop(CLUSTERCTL_LABEL) == "", obj["metadata"]
    return copy


# --- the release files -----------------------------------------------------------------------------------------


def test_release_manifests_writes_the_components_and_the_metadata(provider_release: Release) -> None:
    release = provider_release
    assert sorted(p.name for p in release.directory.iterdir()) == ["ipam-components.yaml", "metadata.yaml"]
    assert release.version == release_version() and re.fullmatch(r"v\d+\.\d+\.\d+", release.version)

    metadata = yaml.safe_load(release.metadata.read_text())
    assert (metadata["apiVersion"], metadata["kind"]) == ("clusterctl.cluster.x-k8s.io/v1alpha3", "Metadata")
    major, minor, _ = (int(part) for part in release.version[1:].split("."))
    assert {"major": major, "minor": minor, "contract": CONTRACT} in metadata["releaseSeries"]

    text = release.components.read_text()
    objects = documents(text)
    generated = [doc for path in sorted(CRDS.glob("*.yaml")) for doc in documents(path.read_text())]
    assert {key(o) for o in objects} == {key(o) for o in built(CONFIG / "default")}
    assert {key(o) for o in generated} <= {key(o) for o in objects}
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"] == [SYSTEM_NAMESPACE]
    for obj in objects:
        labels = obj["metadata"].get("labels") or {}
        assert labels.get(PROVIDER_LABEL[0]) == PROVIDER_LABEL[1], f"{key(obj)} lacks the provider label"
        if obj["metadata"].get("namespace") is not None:
            assert obj["metadata"]["namespace"] == SYSTEM_NAMESPACE, key(obj)

    crds = {o["spec"]["names"]["kind"]: o["metadata"]["labels"] for o in objects if o["kind"].startswith("Custom")}
    assert set(crds) == set(EXPECTED_MOVE)
    for kind, labels in crds.items():
        assert labels.get(CLUSTERCTL_LABEL) == "", f"clusterctl move does not discover {kind}"
        moves = [label for label in (MOVE, MOVE_HIERARCHY) if label in labels]
        assert moves == ([EXPECTED_MOVE[kind]] if EXPECTED_MOVE[kind] else []), (kind, labels)

    assert variables(text) == EXPECTED_VARIABLES
    image = manager(objects)["image"]
    assert canonical(image) and image.endswith(f":{release.version}"), image


def test_the_docs_list_every_variable_with_its_default() -> None:
    rows = re.findall(r"^\| `(IPAM_PY_[A-Z_]+)` \| ([^|]+) \|", DOCS.read_text(), re.MULTILINE)
    documented = {name: default.strip() for name, default in rows}
    assert set(documented) == set(EXPECTED_VARIABLES), documented
    for name, default in EXPECTED_VARIABLES.items():
        expected = f"`{default}`" if default.strip() else "empty"
        assert documented[name].startswith(expected), (name, documented[name])


# --- clusterctl ------------------------------------------------------------------------------------------------


def test_clusterctl_describes_the_provider(clusterctl: Clusterctl, clusterctl_repository: LocalRepository) -> None:
    """`--describe` reads the components as typed objects without substituting them, as `clusterctl init
    list-images` does: a variable in a typed field (replicas, image) would fail here."""
    out = clusterctl.generate_provider(clusterctl_repository, extra_args=["--describe"])
    fields = dict(re.findall(r"^(\w+):\s+(\S+)$", out, re.MULTILINE))
    assert fields["Name"] == "py" and fields["Type"] == "IPAMProvider", out
    assert fields["Version"] == clusterctl_repository.version and fields["TargetNamespace"] == SYSTEM_NAMESPACE
    listed = re.findall(r"^  - (\S+)$", out, re.MULTILINE)
    components = documents((clusterctl_repository.directory / "ipam-components.yaml").read_text())
    assert listed == [*sorted(EXPECTED_VARIABLES), manager(components)["image"]], out


def test_generate_provider_with_the_defaults_is_config_default(
    clusterctl: Clusterctl, clusterctl_repository: LocalRepository
) -> None:
    rendered = clusterctl.generate_provider(clusterctl_repository)
    assert "${" not in rendered
    objects = by_key(documents(rendered))
    expected = by_key(built(CONFIG / "default"))
    assert set(objects) == set(expected)
    for name, obj in objects.items():
        assert obj["metadata"]["labels"][PROVIDER_LABEL[0]] == PROVIDER_LABEL[1], name
        actual, wanted = as_config_default(obj), pruned(expected[name])
        if name[0] == "Deployment":
            # config/default leaves out the flags whose default is the CLI's; the release spells them out.
            assert settings(manager([actual])) == settings(manager([wanted]))
            for deployment in (actual, wanted):
                deployment["spec"]["template"]["spec"]["containers"][0]["args"] = None
        assert actual == wanted, f"clusterctl renders {name} unlike config/default"


def test_generate_provider_substitutes_variables_and_overrides(
    clusterctl: Clusterctl, clusterctl_repository: LocalRepository
) -> None:
    # Variables from the config file, one overridden by the environment; the image through clusterctl's `images:`.
    repository = clusterctl_repository.with_config(
        "custom.yaml",
        variables={"IPAM_PY_LOG_FORMAT": "console", "IPAM_PY_LOG_LEVEL": "warning"},
        images={PROVIDER_LABEL[1]: {"repository": "registry.example.com/mirror", "tag": "v0.2.0-custom"}},
    )
    env = {
        "IPAM_PY_LOG_LEVEL": "debug",
        "IPAM_PY_WATCH_NAMESPACE": "team-a,team-b",
        "IPAM_PY_WATCH_FILTER": "blue",
        "IPAM_PY_BACKENDS": "incluster",
        "IPAM_PY_WORKERS": "3",
        "IPAM_PY_IMAGE_PULL_POLICY": "Always",
    }
    target = "ipam-py-elsewhere"
    objects = documents(clusterctl.generate_provider(repository, env=env, extra_args=["--target-namespace", target]))
    container = manager(objects)
    run = settings(container, target)
    assert run["log_format"] == "console" and run["log_level"] == "debug"
    assert run["controller"]["namespaces"] == ["team-a", "team-b"] and run["controller"]["watch_filter"] == "blue"
    assert run["backends"] == ["incluster"] and run["controller"]["workers"] == 3
    assert run["leader_election"]["enabled"] and run["leader_election"]["namespace"] == target
    assert container["image"] == "registry.example.com/mirror/capi-ipam-provider-py:v0.2.0-custom"
    assert container["imagePullPolicy"] == "Always"

    # Everything namespaced follows the target namespace, and so do the bindings' subjects, the names the
    # metrics endpoint's and the webhook's certificates are issued for, the Service the API server calls for the
    # webhook and the Certificate whose CA cert-manager injects there.
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"] == [target]
    certificates = [o for o in objects if o["kind"] == "Certificate"]
    assert len(certificates) == 2
    for certificate in certificates:
        assert [name.split(".")[1] for name in certificate["spec"]["dnsNames"]] == [target, target]
    (configuration,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    assert (
        configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{target}/capi-ipam-serving-cert"
    )
    assert {webhook["clientConfig"]["service"]["namespace"] for webhook in configuration["webhooks"]} == {target}
    for obj in objects:
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "Issuer", "Certificate"):
            assert obj["metadata"]["namespace"] == target, key(obj)
        for subject in obj.get("subjects") or []:
            assert subject["namespace"] == target, key(obj)


# --- installing ------------------------------------------------------------------------------------------------


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl_binary(), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.apiserver  # its control plane is its own, not the `kubeconfig` fixture's
def test_the_rendered_components_install_on_a_fresh_api_server(
    clusterctl: Clusterctl, clusterctl_repository: LocalRepository
) -> None:
    """A control plane of its own: the components create cluster-scoped objects (CRDs, ClusterRole and binding,
    the namespace) that the session's control plane shares with other tests."""
    rendered = clusterctl.generate_provider(clusterctl_repository)
    objects = documents(rendered)
    crd_names = [o["metadata"]["name"] for o in objects if o["kind"] == "CustomResourceDefinition"]
    with dedicated_control_plane() as plane:
        kubeconfig = plane.kubeconfig_path
        # cert-manager's CRDs first, as `clusterctl init` installs cert-manager before any provider.
        certmanager_crds = [f"--filename={path}" for path in cert_manager_crd_paths(load_versions())]
        certmanager = kubectl(kubeconfig, "apply", "--server-side", *certmanager_crds)
        assert certmanager.returncode == 0, certmanager.stderr
        kinds = ("crd/issuers.cert-manager.io", "crd/certificates.cert-manager.io")
        waited = kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", *kinds)
        assert waited.returncode == 0, waited.stderr
        applied = kubectl(kubeconfig, "apply", "--server-side", "--validate=strict", "-f", "-", stdin=rendered)
        assert applied.returncode == 0, applied.stderr
        assert "PodSecurity" not in applied.stderr, f"the Deployment breaks its Pod Security level:\n{applied.stderr}"
        assert len(applied.stdout.strip().splitlines()) == len(objects), applied.stdout

        established = ("wait", "--for=condition=Established", "--timeout=60s")
        waited = kubectl(kubeconfig, *established, *[f"crd/{name}" for name in crd_names])
        assert waited.returncode == 0, waited.stderr
        selector = f"{PROVIDER_LABEL[0]}={PROVIDER_LABEL[1]},{CLUSTERCTL_LABEL}"
        listed = kubectl(kubeconfig, "get", "crd", "-l", selector, "-o", "name")
        prefix = "customresourcedefinition.apiextensions.k8s.io/"
        assert sorted(listed.stdout.split()) == sorted(prefix + name for name in crd_names)

        for obj in objects:
            meta = obj["metadata"]
            scope = ["-n", meta["namespace"]] if meta.get("namespace") else []
            group = obj["apiVersion"].rpartition("/")[0]
            kind = f"{obj['kind'].lower()}.{group}" if group else obj["kind"].lower()
            found = kubectl(kubeconfig, "get", *scope, kind, meta["name"], "-o", "name")
            assert found.returncode == 0, f"{key(obj)} was not stored: {found.stderr}"

        # Applying the same components again (an upgrade to the same version) changes nothing and is accepted.
        again = kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=rendered)
        assert again.returncode == 0, again.stderr
