"""Where the control plane's binaries and the Cluster API CRDs come from.

Binaries are built by `hack/control-plane/build-binaries.sh` (cached by version outside the work tree, or taken
from KUBEBUILDER_ASSETS). The Cluster API CRDs are read from the pinned `sigs.k8s.io/cluster-api` Go module in
the module cache, and cert-manager's from the pinned `github.com/cert-manager/cert-manager` module; they are never
copied into the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

from tools.controlplane.versions import REPO_ROOT, Versions, load_versions

BUILD_SCRIPT = REPO_ROOT / "hack" / "control-plane" / "build-binaries.sh"
CAPI_CRD_FILES = (
    "ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
    "ipam.cluster.x-k8s.io_ipaddresses.yaml",
    "cluster.x-k8s.io_clusters.yaml",
    "cluster.x-k8s.io_machines.yaml",
)
CAPI_MODULE = "sigs.k8s.io/cluster-api"
CERT_MANAGER_MODULE = "github.com/cert-manager/cert-manager"
# cert-manager.io's kinds, which the provider's components (config/certmanager) use; the acme.cert-manager.io ones
# (Order, Challenge) serve only ACME issuers.
CERT_MANAGER_CRD_FILES = (
    "cert-manager.io_certificates.yaml",
    "cert-manager.io_issuers.yaml",
    "cert-manager.io_clusterissuers.yaml",
    "cert-manager.io_certificaterequests.yaml",
)
OUR_CRD_DIR = REPO_ROOT / "crds"


class AssetError(RuntimeError):
    """A binary or CRD needed by the local control plane cannot be had; the message says what is missing."""


def binaries_dir() -> Path:
    """Build (or find) kube-apiserver, etcd, kubectl and kube-controller-manager; return their directory."""
    try:
        result = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as error:
        raise AssetError(
            "could not build kube-apiserver/etcd/kubectl/kube-controller-manager from their Go modules "
            f"(needs Go 1.26+ and the Go module proxy, or KUBEBUILDER_ASSETS):\n{error.stderr[-4000:]}"
        ) from error
    directory = Path(result.stdout.strip().splitlines()[-1])
    for name in ("kube-apiserver", "etcd"):
        if not (directory / name).is_file():
            raise AssetError(f"{name} is missing from {directory}")
    return directory


def go_module_dir(module: str, version: str, *, hint: str = "") -> Path:
    """The directory of Go module `module`@`version` in the Go module cache, downloaded through the Go module proxy
    if it is not there yet. Raises AssetError naming the module and Go's reason when Go is missing (followed by
    `hint`, if given) or the download fails."""
    go = shutil.which("go")
    if go is None:
        raise AssetError(f"Go is needed to fetch {module}@{version}{hint}")
    fetched = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True, cwd="/", check=False
    )
    if fetched.returncode != 0:
        try:
            detail = str(json.loads(fetched.stdout)["Error"])  # with -json, Go reports the error on stdout
        except (ValueError, KeyError, TypeError):
            detail = (fetched.stderr or fetched.stdout).strip()
        raise AssetError(f"go mod download {module}@{version} failed: {detail}")
    return Path(json.loads(fetched.stdout)["Dir"])


def capi_module_dir(versions: Versions) -> Path:
    """The pinned `sigs.k8s.io/cluster-api` module's directory in the Go module cache (downloaded if needed)."""
    return go_module_dir(CAPI_MODULE, versions.capi, hint=" (or set CAPI_CRD_DIR to a directory of CRDs)")


def cert_manager_crd_paths(versions: Versions) -> list[Path]:
    """cert-manager's cert-manager.io CRD files (Certificate, Issuer, ClusterIssuer, CertificateRequest) of the
    pinned release, read from its Go module (deploy/crds), downloaded into the Go module cache if needed."""
    base = go_module_dir(CERT_MANAGER_MODULE, versions.cert_manager) / "deploy" / "crds"
    paths = [base / name for name in CERT_MANAGER_CRD_FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise AssetError(f"cert-manager {versions.cert_manager}'s CRDs not found: {', '.join(missing)}")
    return paths


def capi_crd_paths(versions: Versions) -> list[Path]:
    """The Cluster API CRD files of the pinned release, downloaded into the Go module cache if needed."""
    override = os.environ.get("CAPI_CRD_DIR")
    if override:
        base = Path(override)
    else:
        module_dir = capi_module_dir(versions)
        candidates = [
            module_dir / "config" / "crd" / "bases",
            module_dir / "core" / "config" / "crd" / "bases",
        ]
        base = next((c for c in candidates if (c / CAPI_CRD_FILES[0]).is_file()), candidates[0])
    paths = [base / name for name in CAPI_CRD_FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise AssetError(f"Cluster API CRDs not found: {', '.join(missing)}")
    return paths


def clusterctl_inventory_crd_path(versions: Versions) -> Path:
    """clusterctl's provider inventory CRD (`providers.clusterctl.cluster.x-k8s.io`), from the pinned module."""
    path = capi_module_dir(versions) / "cmd" / "clusterctl" / "config" / "manifest" / "clusterctl-api.yaml"
    if not path.is_file():
        raise AssetError(f"clusterctl's inventory CRD not found: {path}")
    return path


def our_crd_paths() -> list[Path]:
    return sorted(OUR_CRD_DIR.glob("*.yaml"))


def capi_crd_paths_of(capi_version: str) -> list[Path]:
    """The Cluster API CRD files of release `capi_version` (e.g. "v1.12.10"), read from its Go module, downloaded
    into the module cache if needed: for the releases of the compatibility matrix (CAPI_COMPAT_VERSIONS). The error
    says which release and why; CAPI_CRD_DIR, the CRDs of one release, cannot stand in for several and is refused."""
    if os.environ.get("CAPI_CRD_DIR"):
        raise AssetError(
            f"CAPI_CRD_DIR is set, but the CRDs of Cluster API {capi_version} must come from its own Go module: "
            "unset CAPI_CRD_DIR"
        )
    return capi_crd_paths(replace(load_versions(), capi=capi_version))  # CAPI_CRD_DIR unset: from the module
