"""config/prometheus: the ServiceMonitor scrapes the metrics endpoint as it is served (Service
capi-ipam-controller-manager-metrics-service in capi-ipam-system, port `https`, bearer token, pods labelled
control-plane: controller-manager), and Prometheus is bound to the ClusterRole that may read it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.prometheus import REPO
from tools.controlplane.assets import AssetError, binaries_dir

CONFIG = REPO / "config"
PROMETHEUS_CONFIG = CONFIG / "prometheus"
NAMESPACE = "capi-ipam-system"
SERVICE = "capi-ipam-controller-manager-metrics-service"
PORT_NAME = "https"
SELECTOR = {"control-plane": "controller-manager"}
METRICS_READER = "capi-ipam-metrics-reader"
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def objects_of(kind: str, root: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(root.rglob("*.yaml")):
        found += [d for d in documents(path) if isinstance(d, dict) and d.get("kind") == kind]
    return found


def test_the_kustomization_names_every_file_and_is_not_in_config_default() -> None:
    kustomization = documents(PROMETHEUS_CONFIG / "kustomization.yaml")[0]
    assert kustomization["namespace"] == NAMESPACE
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in PROMETHEUS_CONFIG.glob("*.yaml") if p.name not in ("kustomization.yaml", "rules.yaml")
    )
    default = documents(CONFIG / "default" / "kustomization.yaml")[0]
    assert not any("prometheus" in entry for entry in default["resources"]), "the operator's CRDs may be absent"


def test_the_service_monitor_scrapes_the_metrics_service_over_https_with_a_token() -> None:
    (monitor,) = objects_of("ServiceMonitor", PROMETHEUS_CONFIG)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["spec"]["selector"] == {"matchLabels": SELECTOR}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == (PORT_NAME, "https", "/metrics")
    assert endpoint["bearerTokenFile"] == TOKEN_FILE
    assert endpoint["tlsConfig"]["serverName"] == f"{SERVICE}.{NAMESPACE}.svc"
    # Every metrics Service the repository ships must be what the ServiceMonitor selects.
    for service in objects_of("Service", CONFIG):
        if service["metadata"]["name"] != SERVICE:
            continue
        labels = service["metadata"].get("labels", {})
        assert SELECTOR.items() <= labels.items(), f"{SERVICE} lacks the labels {SELECTOR}"
        assert PORT_NAME in {p.get("name") for p in service["spec"]["ports"]}, f"{SERVICE} has no port {PORT_NAME}"


def test_prometheus_is_bound_to_the_metrics_reader_role() -> None:
    (binding,) = objects_of("ClusterRoleBinding", PROMETHEUS_CONFIG)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": METRICS_READER,
    }
    assert [s["kind"] for s in binding["subjects"]] == ["ServiceAccount"]


@pytest.mark.apiserver  # kustomize: the kubectl built with the control plane
def test_kubectl_kustomize_builds_config_prometheus() -> None:
    try:
        kubectl = binaries_dir() / "kubectl"
    except AssetError as error:
        pytest.fail(f"cannot find the control plane's binaries: {error}", pytrace=False)
    result = subprocess.run(
        [str(kubectl), "kustomize", str(PROMETHEUS_CONFIG)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    built = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(result.stdout) if o}
    assert set(built) == {
        ("ServiceMonitor", "capi-ipam-controller-manager-metrics-monitor"),
        ("PrometheusRule", "capi-ipam-provider-rules"),
        ("ClusterRoleBinding", "capi-ipam-metrics-reader-prometheus"),
    }
    for (kind, _), obj in built.items():
        assert obj["metadata"]["labels"]["cluster.x-k8s.io/provider"] == "ipam-py"
        if kind != "ClusterRoleBinding":
            assert obj["metadata"]["namespace"] == NAMESPACE
