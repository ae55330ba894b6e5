"""The local control plane tool: KUBEBUILDER_ASSETS, two instances side by side, and a clean `down`."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tools.controlplane.assets import AssetError, binaries_dir, cert_manager_crd_paths
from tools.controlplane.cluster import LocalControlPlane, _alive
from tools.controlplane.versions import REPO_ROOT, load_versions

BUILD = REPO_ROOT / "hack" / "control-plane" / "build-binaries.sh"


def test_kubebuilder_assets_are_used_as_they_are(tmp_path: Path) -> None:
    for name in ("kube-apiserver", "etcd"):
        binary = tmp_path / name
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    env = {**os.environ, "KUBEBUILDER_ASSETS": str(tmp_path), "PATH": "/usr/bin:/bin"}  # no Go on PATH
    result = subprocess.run(["bash", str(BUILD)], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == str(tmp_path)


def test_versions_are_pinned_in_one_place() -> None:
    versions = load_versions()
    text = (REPO_ROOT / "hack" / "control-plane" / "modules" / "kubernetes" / "go.mod").read_text()
    assert f"k8s.io/kubernetes {versions.kubernetes}" in text
    etcd = (REPO_ROOT / "hack" / "control-plane" / "modules" / "etcd" / "go.mod").read_text()
    assert f"go.etcd.io/etcd/server/v3 {versions.etcd}" in etcd


def test_cert_manager_crds_are_the_pinned_release_s_own() -> None:
    """The cert-manager.io kinds config/certmanager uses (and their siblings), from the pinned Go module."""
    versions = load_versions()
    paths = cert_manager_crd_paths(versions)
    assert all(f"github.com/cert-manager/cert-manager@{versions.cert_manager}" in str(p) for p in paths), paths
    crds = [doc for p in paths for doc in yaml.safe_load_all(p.read_text()) if doc]
    assert {c["kind"] for c in crds} == {"CustomResourceDefinition"}
    names = sorted(c["metadata"]["name"] for c in crds)
    kinds = ("certificaterequests", "certificates", "clusterissuers", "issuers")
    assert names == [f"{kind}.cert-manager.io" for kind in kinds]
    for crd in crds:
        served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
        assert served == ["v1"], f"{crd['metadata']['name']} serves {served}"


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("GOPROXY", "off", "module lookup disabled by GOPROXY=off"),  # a release no cache holds, and no network
        ("PATH", "/nowhere", "Go is needed to fetch github.com/cert-manager/cert-manager@v1.21.999"),
    ],
)
def test_cert_manager_crds_that_cannot_be_had_fail_with_the_reason(
    variable: str, value: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(AssetError) as failed:
        cert_manager_crd_paths(replace(load_versions(), cert_manager="v1.21.999"))
    assert reason in str(failed.value), str(failed.value)
    assert "github.com/cert-manager/cert-manager@v1.21.999" in str(failed.value), str(failed.value)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.controlplane", *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300
    )


@pytest.mark.apiserver  # starts two control planes of its own
def test_two_instances_side_by_side_and_down_leaves_nothing(tmp_path: Path) -> None:
    dirs = [tmp_path / "one", tmp_path / "two"]
    states = []
    try:
        for directory in dirs:
            result = _cli("up", "--dir", str(directory))
            assert result.returncode == 0, result.stderr
            assert f"export KUBECONFIG={directory}/kubeconfig" in result.stdout
            assert load_versions().kubernetes in result.stderr, "versions are printed at start"
            states.append(json.loads((directory / "state.json").read_text()))
        assert states[0]["apiserver_port"] != states[1]["apiserver_port"]
        for directory, state in zip(dirs, states, strict=True):
            context = ssl.create_default_context(cafile=str(directory / "pki" / "ca.crt"))
            request = urllib.request.Request(f"https://127.0.0.1:{state['apiserver_port']}/readyz")
            request.add_header("Authorization", f"Bearer {state['admin_token']}")
            with urllib.request.urlopen(request, context=context, timeout=5) as response:
                assert response.status == 200
    finally:
        for directory in dirs:
            _cli("down", "--dir", str(directory))
    for directory, state in zip(dirs, states, strict=True):
        assert not directory.exists(), "down removes the instance's directory"
        for pid in (state["etcd_pid"], state["apiserver_pid"]):
            assert not _alive(pid), f"process {pid} survived `down`"


@pytest.mark.apiserver  # starts a control plane of its own
def test_external_install_leaves_existing_capi_crds_alone_and_up_replaces_a_dead_instance(tmp_path: Path) -> None:
    """`make run` on someone else's cluster must not overwrite its Cluster API CRDs; and a recorded control plane
    whose processes died (a reboot) must give way to a fresh one instead of failing."""
    directory = tmp_path / "cp"
    try:
        assert _cli("up", "--dir", str(directory)).returncode == 0
        state = json.loads((directory / "state.json").read_text())
        kubectl = [str(directory / "bin" / "kubectl"), f"--kubeconfig={directory / 'kubeconfig'}"]
        crd = "clusters.cluster.x-k8s.io"
        patch = '{"spec":{"names":{"categories":["cluster-api","theirs"]}}}'
        subprocess.run([*kubectl, "patch", "crd", crd, "--type=merge", "-p", patch], check=True, capture_output=True)
        result = _cli("install-crds", "--external", "--kubeconfig", str(directory / "kubeconfig"))
        assert result.returncode == 0, result.stderr
        categories = subprocess.run(
            [*kubectl, "get", "crd", crd, "-o", "jsonpath={.spec.names.categories}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert "theirs" in categories, "an existing Cluster API CRD must be left as it is"

        for pid in (state["apiserver_pid"], state["etcd_pid"]):
            os.kill(pid, 9)
        for pid in (state["apiserver_pid"], state["etcd_pid"]):
            for _ in range(100):
                if not _alive(pid):
                    break
                time.sleep(0.05)
        result = _cli("up", "--dir", str(directory))
        assert result.returncode == 0, result.stderr
        fresh = json.loads((directory / "state.json").read_text())
        assert fresh["apiserver_pid"] != state["apiserver_pid"]
        subprocess.run([*kubectl, "get", "--raw=/readyz"], check=True, capture_output=True)
    finally:
        _cli("down", "--dir", str(directory))


@pytest.mark.apiserver  # starts a control plane of its own
def test_etcd_and_the_api_server_restart_alone_on_their_ports_keeping_the_data(tmp_path: Path) -> None:
    plane = LocalControlPlane(tmp_path / "plane", binaries_dir())
    state = plane.start()
    try:
        context = ssl.create_default_context(cafile=str(state.ca_path))

        def call(method: str, path: str, body: bytes | None = None) -> int:
            request = urllib.request.Request(f"{state.server}{path}", data=body, method=method)
            request.add_header("Authorization", f"Bearer {state.admin_token}")
            request.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(request, context=context, timeout=10) as response:
                    return int(response.status)
            except urllib.error.HTTPError as error:
                return int(error.code)

        namespace = json.dumps({"metadata": {"name": "kept"}}).encode()
        assert call("POST", "/api/v1/namespaces", namespace) == 201
        pids = (state.etcd_pid, state.apiserver_pid)
        plane.restart_etcd(kill=True)
        assert state.etcd_pid != pids[0] and state.apiserver_pid == pids[1], "only etcd was restarted"
        assert call("GET", "/api/v1/namespaces/kept") == 200, "etcd kept its data"
        plane.restart_apiserver()
        assert state.apiserver_pid != pids[1] and not _alive(pids[0]) and not _alive(pids[1])
        assert call("GET", "/api/v1/namespaces/kept") == 200, "the API server came back on its port"
    finally:
        plane.stop()
