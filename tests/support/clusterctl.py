"""pytest plugin: the real clusterctl, and this provider's release as a local clusterctl repository.

- `clusterctl_binary()` builds clusterctl from the pinned Cluster API module (hack/clusterctl/build.sh; cached by
  version outside the work tree, so only the first run builds).
- `build_release(out)` runs `make release-manifests` into `out` (out/ipam-components.yaml, out/metadata.yaml).
- `LocalRepository.create(root, release)` lays the release out as clusterctl's `file://` repository,
  `<root>/ipam-py/<version>/{ipam-components.yaml,metadata.yaml}`, and writes a clusterctl configuration file
  naming it (`providers:` with `type: IPAMProvider`), with optional variables and `images:` overrides.
- `Clusterctl` runs the binary with a HOME of its own and without the caller's environment, so neither the user's
  ~/.config/cluster-api nor stray IPAM_PY_* variables change what it renders.
- `init_management_cluster(kube)` makes a bare control plane look as `clusterctl init --ipam py` would leave it, for
  `clusterctl move`: Cluster API's CRDs with the labels clusterctl gives them, ours, clusterctl's inventory CRD
  (from the pinned module) and the inventory's Provider records (cluster-api core and this provider). No provider
  is deployed: tests run the controller in-process.

Fixtures:
- `clusterctl` (session): a `Clusterctl`.
- `provider_release` (session): the release files, built once per session.
- `clusterctl_repository` (session): a `LocalRepository` holding `provider_release`.

Nothing here skips: if clusterctl or the release cannot be built, the fixture fails with the reason.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import NAMESPACES, Resource
from tools.controlplane.assets import capi_crd_paths, clusterctl_inventory_crd_path, our_crd_paths
from tools.controlplane.crds import CLUSTERCTL_INIT_LABELS, install_crds
from tools.controlplane.versions import REPO_ROOT, load_versions
from tools.release import COMPONENTS, METADATA, PROVIDER_LABEL, PROVIDER_NAME, PROVIDER_TYPE, Release, release_version

BUILD_SCRIPT = REPO_ROOT / "hack" / "clusterctl" / "build.sh"
Object = dict[str, Any]


class ClusterctlError(RuntimeError):
    """clusterctl could not be built or failed; the message holds its output."""


def clusterctl_binary() -> Path:
    """Build (or find in the cache) clusterctl of the pinned Cluster API release; return its path."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ClusterctlError(
            f"could not build clusterctl (needs Go and the Go module proxy, or CLUSTERCTL):\n{result.stderr[-4000:]}"
        )
    return Path(result.stdout.strip().splitlines()[-1])


def build_release(out: Path) -> Release:
    """`make release-manifests RELEASE_DIR=<out>`: the entry point the docs give, not a shortcut around it."""
    result = subprocess.run(
        ["make", "-s", "-C", str(REPO_ROOT), "release-manifests", f"RELEASE_DIR={out}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if result.returncode != 0:
        raise ClusterctlError(f"make release-manifests failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return Release(release_version(), out / COMPONENTS, out / METADATA)


@dataclass(frozen=True)
class LocalRepository:
    """A clusterctl `file://` repository holding one release of this provider, and a config file naming it."""

    root: Path
    config: Path
    version: str
    provider: str = PROVIDER_NAME

    @property
    def directory(self) -> Path:
        """Where the release's files are: `<root>/<provider label>/<version>`."""
        return self.root / PROVIDER_LABEL[1] / self.version

    @property
    def spec(self) -> str:
        """What `--ipam` takes: `py:v0.2.0`."""
        return f"{self.provider}:{self.version}"

    @classmethod
    def create(
        cls,
        root: Path,
        release: Release,
        *,
        variables: Mapping[str, str] | None = None,
        images: Mapping[str, Mapping[str, str]] | None = None,
        config_name: str = "clusterctl.yaml",
    ) -> LocalRepository:
        """Copy `release` into `root` and write `root/<config_name>`; `variables` become top-level keys of the
        config (clusterctl reads variables there after the environment), `images` its `images:` section."""
        repository = cls(root, root / config_name, release.version)
        repository.directory.mkdir(parents=True, exist_ok=True)
        for source in (release.components, release.metadata):
            (repository.directory / source.name).write_bytes(source.read_bytes())
        return repository.with_config(config_name, variables=variables, images=images)

    def with_config(
        self,
        config_name: str,
        *,
        variables: Mapping[str, str] | None = None,
        images: Mapping[str, Mapping[str, str]] | None = None,
    ) -> LocalRepository:
        """The same repository with another config file beside it (other variables or image overrides)."""
        url = (self.directory / COMPONENTS).as_uri()
        config: Object = {"providers": [{"name": self.provider, "url": url, "type": PROVIDER_TYPE}]}
        config.update(variables or {})
        if images:
            config["images"] = {name: dict(values) for name, values in images.items()}
        path = self.root / config_name
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return LocalRepository(self.root, path, self.version, self.provider)


@dataclass(frozen=True)
class Clusterctl:
    """The clusterctl binary, run with its own HOME and only the environment it is given."""

    binary: Path
    home: Path

    def run(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            # No request to GitHub for a newer clusterctl.
            "CLUSTERCTL_DISABLE_VERSIONCHECK": "true",
            **(env or {}),
        }
        return subprocess.run(
            [str(self.binary), *args], env=environment, capture_output=True, text=True, timeout=timeout, check=False
        )

    def check(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 300) -> str:
        """Run clusterctl; its stdout, or ClusterctlError with its stderr if it fails."""
        result = self.run(*args, env=env, timeout=timeout)
        if result.returncode != 0:
            raise ClusterctlError(f"clusterctl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result.stdout

    def generate_provider(
        self,
        repository: LocalRepository,
        *,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> str:
        """`clusterctl generate provider --ipam <name>:<version>`: the components as `clusterctl init` would apply
        them (variables substituted, target namespace set, clusterctl's labels added)."""
        args = ["generate", "provider", "--ipam", repository.spec, "--config", str(repository.config)]
        return self.check(*args, *extra_args, env=env)


# clusterctl's provider inventory (cmd/clusterctl/api/v1alpha3).
PROVIDERS = Resource("clusterctl.cluster.x-k8s.io", "v1alpha3", "providers", "Provider", namespaced=True)
CORE_NAMESPACE = "capi-system"
IPAM_NAMESPACE = "capi-ipam-system"


def inventory() -> list[Object]:
    """The Provider records `clusterctl init --ipam py:<version>` writes: core cluster-api and this provider."""
    entries = [
        (CORE_NAMESPACE, "cluster-api", "cluster-api", "CoreProvider", load_versions().capi),
        (IPAM_NAMESPACE, PROVIDER_LABEL[1], PROVIDER_NAME, PROVIDER_TYPE, release_version()),
    ]
    return [
        {
            "apiVersion": PROVIDERS.api_version,
            "kind": PROVIDERS.kind,
            "metadata": {
                "name": label,  # clusterctl names a record by its manifest label
                "namespace": namespace,
                "labels": {"clusterctl.cluster.x-k8s.io": "", PROVIDER_LABEL[0]: label},
            },
            "providerName": name,
            "type": provider_type,
            "version": version,
        }
        for namespace, label, name, provider_type, version in entries
    ]


async def init_management_cluster(kube: KubeClient) -> list[Object]:
    """Install what `clusterctl init --ipam py` leaves in a management cluster, except the deployments (see the
    module docstring); answer the inventory records."""
    versions = load_versions()
    await install_crds(kube, capi_crd_paths(versions), labels=CLUSTERCTL_INIT_LABELS)
    await install_crds(kube, our_crd_paths())
    await install_crds(kube, [clusterctl_inventory_crd_path(versions)])
    records = inventory()
    for record in records:
        namespace = record["metadata"]["namespace"]
        try:
            await kube.create(NAMESPACES, {"metadata": {"name": namespace}})
        except ApiError as error:
            if not error.already_exists:
                raise
        await kube.create(PROVIDERS, record, namespace)
    return records


def documents(text: str) -> list[Object]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.fixture(scope="session")
def clusterctl() -> Iterator[Clusterctl]:
    try:
        binary = clusterctl_binary()
    except ClusterctlError as error:
        pytest.fail(str(error), pytrace=False)
    with tempfile.TemporaryDirectory(prefix="clusterctl-home-") as home:
        yield Clusterctl(binary, Path(home))


@pytest.fixture(scope="session")
def provider_release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    try:
        return build_release(tmp_path_factory.mktemp("release"))
    except ClusterctlError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="session")
def clusterctl_repository(tmp_path_factory: pytest.TempPathFactory, provider_release: Release) -> LocalRepository:
    return LocalRepository.create(tmp_path_factory.mktemp("clusterctl-repository"), provider_release)
