"""Build the clusterctl release files: `python -m tools.release --out out` (what `make release-manifests` runs).

- `<out>/ipam-components.yaml`: `kubectl kustomize config/release`, one YAML stream with the Namespace, the CRDs,
  the RBAC and the Deployment, with `${VAR:=default}` variables for clusterctl to substitute;
- `<out>/metadata.yaml`: a copy of `metadata.yaml`, which maps each release series to its Cluster API contract.

The version is the package's (`v` + `ipam_provider.version.__version__`). The build fails, writing nothing, if the
components break a rule clusterctl or this project relies on (see `check`).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ipam_provider.version import __version__
from tools.controlplane.assets import AssetError, binaries_dir
from tools.controlplane.versions import REPO_ROOT

PROVIDER_NAME = "py"  # clusterctl's name for this provider: `clusterctl init --ipam py:v0.2.0`
PROVIDER_TYPE = "IPAMProvider"
PROVIDER_LABEL = ("cluster.x-k8s.io/provider", "ipam-py")  # what clusterctl labels an IPAM provider named `py` with
CLUSTERCTL_LABEL = "clusterctl.cluster.x-k8s.io"
CONTRACT = "v1beta2"
COMPONENTS = "ipam-components.yaml"
METADATA = "metadata.yaml"
RELEASE_KUSTOMIZATION = REPO_ROOT / "config" / "release"
# ${NAME:=default}; clusterctl also knows ${NAME} (required) and other forms, which the components do not use.
VARIABLE = re.compile(r"\$\{([A-Za-z0-9_]+)(:=([^}]*))?\}")
# What else clusterctl's substitution (drone/envsubst) rewrites: a bare $NAME (a variable too), and the escapes
# $$, \\ and \/ (each loses its first character). In a CRD's description, pattern or CEL rule that would be a change.
SUBSTITUTED = re.compile(r"\$[A-Za-z_][A-Za-z0-9_]*|\$\$|\\[\\/]")

Object = dict[str, Any]


class ReleaseError(RuntimeError):
    """The release files cannot be built; the message says why."""


@dataclass(frozen=True)
class Release:
    version: str  # v0.2.0
    components: Path
    metadata: Path

    @property
    def directory(self) -> Path:
        return self.components.parent


def release_version() -> str:
    """`v` + the package version (written once, in ipam_provider/version.py): the tag of the release and of its
    image."""
    return "v" + __version__


def variables(text: str) -> dict[str, str | None]:
    """The clusterctl variables of a components YAML, each with its default (None: required)."""
    return {match[1]: match[3] if match[2] else None for match in VARIABLE.finditer(text)}


def canonical(image: str) -> bool:
    """Whether an image reference names its registry, as clusterctl requires (`localhost/x:v1`, `a.io/x:v1`)."""
    first, slash, _ = image.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost") and "$" not in image


def kubectl() -> str:
    """The kubectl built with the test control plane (cached by version), else one on PATH."""
    try:
        candidate = binaries_dir() / "kubectl"
    except AssetError:
        candidate = Path("/nonexistent")
    found = str(candidate) if candidate.is_file() else shutil.which("kubectl")
    if found is None:
        raise ReleaseError("kubectl is needed: `make binaries` builds it, or put one on PATH")
    return found


def build_components() -> str:
    result = subprocess.run(
        [kubectl(), "kustomize", str(RELEASE_KUSTOMIZATION)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise ReleaseError(f"kubectl kustomize {RELEASE_KUSTOMIZATION} failed:\n{result.stderr}")
    return result.stdout


def check(components: str, metadata: Object, version: str) -> None:
    """What clusterctl needs of the release, and what this project promises about it."""
    problems: list[str] = []
    objects: list[Object] = [doc for doc in yaml.safe_load_all(components) if doc]
    namespaces = [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"]
    if len(namespaces) != 1:
        problems.append(f"clusterctl needs exactly one Namespace in the components, not {namespaces}")
    for obj in objects:
        name = f"{obj['kind']} {obj['metadata'].get('name')}"
        labels = obj["metadata"].get("labels") or {}
        if labels.get(PROVIDER_LABEL[0]) != PROVIDER_LABEL[1]:
            problems.append(f"{name} is not labelled {PROVIDER_LABEL[0]}={PROVIDER_LABEL[1]}")
        if obj["kind"] == "CustomResourceDefinition" and CLUSTERCTL_LABEL not in labels:
            problems.append(f"{name} lacks the {CLUSTERCTL_LABEL} label, without which clusterctl move ignores it")
        namespace = obj["metadata"].get("namespace")
        if namespace is not None and namespaces and namespace != namespaces[0]:
            problems.append(f"{name} is in namespace {namespace}, not the components' {namespaces[0]}")
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    containers = [c for d in deployments for c in d["spec"]["template"]["spec"]["containers"]]
    if [c["name"] for c in containers] != ["manager"]:
        problems.append(f"clusterctl expects one Deployment whose one container is `manager`: {containers}")
    for container in containers:
        image = container["image"]
        if not canonical(image) or not image.endswith(f":{version}"):
            problems.append(f"the image {image} must be named in full (clusterctl requires it) and tagged {version}")
    required = sorted(name for name, default in variables(components).items() if not default)
    if required:
        problems.append(f"variables without a default (clusterctl would demand them): {required}")
    rewritten = sorted(set(SUBSTITUTED.findall(components)))
    if rewritten:
        problems.append(f"clusterctl's variable substitution would rewrite {rewritten} in the components")
    if (metadata.get("apiVersion"), metadata.get("kind")) != ("clusterctl.cluster.x-k8s.io/v1alpha3", "Metadata"):
        problems.append("metadata.yaml must be a clusterctl.cluster.x-k8s.io/v1alpha3 Metadata")
    major, minor = (int(part) for part in version.lstrip("v").split(".")[:2])
    series = [s for s in metadata.get("releaseSeries") or [] if (s.get("major"), s.get("minor")) == (major, minor)]
    if [s.get("contract") for s in series] != [CONTRACT]:
        problems.append(f"metadata.yaml must map the release series {major}.{minor} to {CONTRACT} once: {series}")
    if problems:
        raise ReleaseError("the release is broken:\n  " + "\n  ".join(problems))


def build(out: Path) -> Release:
    version = release_version()
    components = build_components()
    metadata_text = (REPO_ROOT / METADATA).read_text()
    check(components, yaml.safe_load(metadata_text), version)
    out.mkdir(parents=True, exist_ok=True)
    release = Release(version, out / COMPONENTS, out / METADATA)
    release.components.write_text(components)
    release.metadata.write_text(metadata_text)
    return release


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.release", description="Build the clusterctl release files.")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "out", help="directory to write (default: out/)")
    args = parser.parse_args(argv)
    try:
        release = build(args.out)
    except ReleaseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{release.components}\n{release.metadata}")
    print(f"release {release.version} of the IPAM provider `{PROVIDER_NAME}`", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
