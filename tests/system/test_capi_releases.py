"""The contract flow against the CRDs of every Cluster API release in the compatibility matrix.

`CAPI_COMPAT_VERSIONS` in hack/versions.env lists the releases: the newest patch of each minor still in use that the
Go module proxy serves. For each one, a control plane of its own (etcd + kube-apiserver, as the session's, in its
own directory) gets that release's IPAddressClaim, IPAddress, Cluster and Machine CRDs, read from its Go module
(`sigs.k8s.io/cluster-api@<version>`, downloaded into the module cache on first use), and ours; the controller
runs in-process against it, and tests/support/contract.py's flow runs: allocate, pause, release, re-create.
One result per release. A release whose module cannot be fetched fails its test with the reason; nothing skips.

`CAPI_CRD_DIR` (one directory of CRDs for machines without Go) fails these tests instead of being used: it would
run every release of the matrix against the same CRDs.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from ipam_provider.api.capi import ADDRESSES, CLAIMS, CLUSTERS, MACHINES
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import CRDS, NAMESPACES, Resource
from tests.support.contract import contract_flow
from tests.support.controller import run_controller
from tools.controlplane.assets import AssetError, binaries_dir, capi_crd_paths_of, our_crd_paths
from tools.controlplane.cluster import ControlPlaneError, LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import REPO_ROOT, load_versions

VERSIONS = load_versions()
# The minors the matrix must cover at least: v1.11 (the first to store IPAM v1beta2), v1.12, v1.13, v1.14.
REQUIRED_MINORS = {11, 12, 13, 14}
# Cluster API's resources the controller reads and writes, each in one API version.
SPOKEN: tuple[Resource, ...] = (CLAIMS, ADDRESSES, CLUSTERS, MACHINES)


def version_problem(crd: dict[str, Any], resource: Resource, capi_version: str) -> str | None:
    """Why the controller cannot work with this Cluster API CRD, or None. It must serve the version the controller
    speaks and, since these CRDs carry no conversion webhook, store it: otherwise the test API server would hand out
    objects of another schema unconverted."""
    served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
    stored = next(v["name"] for v in crd["spec"]["versions"] if v["storage"])
    if resource.version not in served:
        return (
            f"Cluster API {capi_version} does not serve {resource.api_version} {resource.kind} (it serves "
            f"{', '.join(served)}): this provider reads and writes {resource.api_version} only, so users of this "
            "release must upgrade Cluster API to v1.11 or later"
        )
    if stored != resource.version:
        return (
            f"Cluster API {capi_version} stores {resource.kind} as {stored}, not {resource.version}; without "
            "Cluster API's conversion webhook this test cannot run the controller against it"
        )
    return None


async def assert_speaks_our_versions(kube: KubeClient, capi_version: str) -> None:
    for resource in SPOKEN:
        name = f"{resource.plural}.{resource.group}"
        crd = await kube.get(CRDS, name)
        assert crd is not None, f"Cluster API {capi_version} has no CRD {name}"
        problem = version_problem(crd, resource, capi_version)
        assert problem is None, problem


@dataclass
class ReleasePlane:
    """A control plane with one Cluster API release's CRDs and ours installed, and an admin client for it."""

    version: str
    plane: LocalControlPlane
    kube: KubeClient
    timings: str


class ReleasePlanes:
    """Starts the control plane of each release in the order the tests run, one release ahead of the test that
    needs it: the next plane starts and gets its CRDs while the current test's flow runs (the flow mostly waits
    on watches, so the two share the machine's two cores well). At most two of these planes run at once."""

    def __init__(self, versions: list[str], root: Path) -> None:
        self.versions = versions
        self.root = root
        self.started: dict[str, asyncio.Task[ReleasePlane]] = {}

    async def get(self, version: str) -> ReleasePlane:
        task = self._start(version)
        position = self.versions.index(version) if version in self.versions else len(self.versions)
        if position + 1 < len(self.versions):
            self._start(self.versions[position + 1])
        return await task

    def _start(self, version: str) -> asyncio.Task[ReleasePlane]:
        if version not in self.started:
            self.started[version] = asyncio.create_task(self._up(version))
        return self.started[version]

    async def _up(self, version: str) -> ReleasePlane:
        """Fetch the release's CRDs, start a control plane and install them. Raises `AssetError`,
        `ControlPlaneError` or an `AssertionError` saying what is wrong with the release."""
        started = time.monotonic()
        crds = await asyncio.to_thread(capi_crd_paths_of, version)
        binaries = await asyncio.to_thread(binaries_dir)
        plane = LocalControlPlane(self.root / version, binaries)
        try:
            await asyncio.to_thread(plane.start)
            ready = time.monotonic()
            kube = await KubeClient.from_kubeconfig(str(plane.kubeconfig_path))
        except BaseException:
            await asyncio.to_thread(plane.stop)
            raise
        try:
            await install_crds(kube, [*crds, *our_crd_paths()])
            await assert_speaks_our_versions(kube, version)
        except BaseException:
            await kube.close()
            await asyncio.to_thread(plane.stop)
            raise
        timings = f"control plane {ready - started:.1f} s, CRDs {time.monotonic() - ready:.1f} s"
        return ReleasePlane(version, plane, kube, timings)

    async def stop(self, version: str) -> None:
        task = self.started.get(version)
        if task is None:
            return
        try:
            release = await task
        except BaseException:
            return  # _up cleaned up after itself
        await release.kube.close()
        await asyncio.to_thread(release.plane.stop)

    async def close(self) -> None:
        for version in list(self.started):
            await self.stop(version)


@pytest_asyncio.fixture(scope="module")
async def release_planes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ReleasePlanes]:
    """The releases in the order this run's tests use them (a `-k` selection starts only the selected ones)."""
    selected = [
        str(item.callspec.params["capi_version"])
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is request.module
        and item.originalname == "test_contract_flow_on_a_capi_release"
        and hasattr(item, "callspec")
    ]
    planes = ReleasePlanes(selected, tmp_path_factory.mktemp("capi-releases"))
    try:
        yield planes
    finally:
        await planes.close()


@pytest.mark.apiserver  # starts control planes of its own, not through the `kubeconfig` fixture
@pytest.mark.parametrize("capi_version", VERSIONS.capi_compat)
async def test_contract_flow_on_a_capi_release(capi_version: str, release_planes: ReleasePlanes) -> None:
    started = time.monotonic()
    problem: str | None = None
    try:
        release = await release_planes.get(capi_version)
    except AssetError as error:
        problem = (
            f"Cluster API {capi_version}: cannot fetch its CRDs (module sigs.k8s.io/cluster-api@{capi_version}, "
            f"listed in CAPI_COMPAT_VERSIONS in hack/versions.env) or build the control plane: {error}"
        )
    except ControlPlaneError as error:
        problem = f"cannot start a control plane for Cluster API {capi_version}: {error}"
    if problem is not None:
        pytest.fail(problem, pytrace=False)  # outside the except: the message alone, no chained traceback
    waited = time.monotonic()
    try:
        namespace = f"compat-{secrets.token_hex(3)}"
        await release.kube.create(NAMESPACES, {"metadata": {"name": namespace}})
        async with run_controller(release.plane.kubeconfig_path, namespaces=[namespace]) as controller:
            await contract_flow(release.kube, namespace, controller)
    finally:
        await release_planes.stop(capi_version)
    print(
        f"\nCluster API {capi_version}: contract flow passed in {time.monotonic() - started:.1f} s "
        f"(waited {waited - started:.1f} s for its control plane: {release.timings})"
    )


def test_the_matrix_covers_the_pinned_release_and_every_supported_minor() -> None:
    releases = VERSIONS.capi_compat
    assert all(re.fullmatch(r"v1\.\d+\.\d+", v) for v in releases), f"exact releases only: {releases}"
    minors = [int(v.split(".")[1]) for v in releases]
    assert len(set(minors)) == len(minors), f"one patch release per minor: {releases}"
    assert set(minors) >= REQUIRED_MINORS, f"CAPI_COMPAT_VERSIONS lacks a minor of {sorted(REQUIRED_MINORS)}"
    assert VERSIONS.capi in releases, "the release the rest of the suite runs against is in the matrix"


def test_the_readme_publishes_the_matrix() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.partition("\n## Compatibility\n")[2].partition("\n## ")[0]
    assert section, "README.md has a `## Compatibility` section"
    missing = [v for v in VERSIONS.capi_compat if v not in section]
    assert not missing, f"README.md's compatibility matrix does not list {missing}"


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("GOPROXY", "off", "module lookup disabled by GOPROXY=off"),  # no network; the release is in no cache
        ("CAPI_CRD_DIR", "/nowhere", "unset CAPI_CRD_DIR"),  # one release's CRDs cannot stand in for another's
    ],
)
async def test_a_release_whose_crds_cannot_be_had_fails_its_test(
    variable: str, value: str, reason: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Fails, never skips, and says which release and why; no control plane is started for it."""
    monkeypatch.setenv(variable, value)
    planes = ReleasePlanes(["v1.11.999"], tmp_path)
    try:
        with pytest.raises(pytest.fail.Exception) as failed:
            await test_contract_flow_on_a_capi_release("v1.11.999", planes)
    finally:
        await planes.close()
    message = str(failed.value)
    assert "Cluster API v1.11.999" in message and "CAPI_COMPAT_VERSIONS" in message, message
    assert reason in message or "Go is needed" in message, message
    assert not any(tmp_path.iterdir()), "no control plane was started"  # noqa: ASYNC240 (a tmp dir)


def test_a_release_before_v1beta2_is_refused_with_what_its_users_must_do() -> None:
    """As Cluster API v1.10's IPAddressClaim CRD: v1alpha1 and v1beta1 served, v1beta1 stored."""
    versions = [
        {"name": "v1alpha1", "served": True, "storage": False},
        {"name": "v1beta1", "served": True, "storage": True},
    ]
    problem = version_problem({"spec": {"versions": versions}}, CLAIMS, "v1.10.0")
    assert problem is not None
    assert "does not serve ipam.cluster.x-k8s.io/v1beta2 IPAddressClaim (it serves v1alpha1, v1beta1)" in problem
    assert "must upgrade Cluster API to v1.11 or later" in problem
    stored_elsewhere = [
        {"name": "v1beta1", "served": True, "storage": True},
        {"name": "v1beta2", "served": True, "storage": False},
    ]
    problem = version_problem({"spec": {"versions": stored_elsewhere}}, CLAIMS, "v1.x")
    assert problem is not None and "stores IPAddressClaim as v1beta1" in problem
    ours = [{"name": "v1beta1", "served": True, "storage": False}, {"name": "v1beta2", "served": True, "storage": True}]
    assert version_problem({"spec": {"versions": ours}}, CLAIMS, "v1.11.7") is None
