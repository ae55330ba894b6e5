"""pytest plugin: a real kube-apiserver + etcd for the whole session, with the CRDs installed.

Fixtures:
- `control_plane` (session): the local control plane, built and started on first use. With
  IPAM_TEST_KUBECONFIG set, that cluster is used instead (it must already have the CRDs, or accept them).
- `kubeconfig` (session): the path of an admin kubeconfig.
- `kube` (session): a `KubeClient` with admin rights.
- `namespace` (function): a fresh namespace for one test.

`dedicated_control_plane()` starts another control plane, with nothing installed, for a test that must not share
the session's (installing the provider from scratch, or the two management clusters of a `clusterctl move`).

Nothing here ever skips: if the control plane cannot be built or started the fixture fails with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
import pytest_asyncio

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES
from tools.controlplane.assets import AssetError, binaries_dir, capi_crd_paths, our_crd_paths
from tools.controlplane.cluster import ControlPlaneError, LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import load_versions

T = TypeVar("T")


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[Path]:
    existing = os.environ.get("IPAM_TEST_KUBECONFIG")
    if existing:
        yield Path(existing)
        return
    print(f"\nlocal control plane: {load_versions().describe()}")
    started = time.monotonic()
    try:
        binaries = binaries_dir()
    except AssetError as error:
        pytest.fail(f"cannot build the local control plane: {error}", pytrace=False)
    directory = Path(tempfile.mkdtemp(prefix="ipam-cp-"))
    plane = LocalControlPlane(directory, binaries)
    try:
        plane.start()
    except ControlPlaneError as error:
        pytest.fail(f"cannot start the local control plane: {error}", pytrace=False)
    server = plane.state.server if plane.state else ""
    print(f"local control plane ready in {time.monotonic() - started:.1f} s at {server}")
    try:
        yield plane.kubeconfig_path
    finally:
        plane.stop()


@contextlib.contextmanager
def dedicated_control_plane(*, audit: bool = False) -> Iterator[LocalControlPlane]:
    """A control plane of its own (etcd + kube-apiserver, no CRDs), stopped and removed on exit. Its admin
    kubeconfig is `plane.kubeconfig_path`; with `audit`, its audit log is `plane.audit_log_path`
    (tests/support/audit.py reads it). Fails the test if it cannot start."""
    try:
        binaries = binaries_dir()
    except AssetError as error:
        pytest.fail(f"cannot build the local control plane: {error}", pytrace=False)
    plane = LocalControlPlane(Path(tempfile.mkdtemp(prefix="ipam-cp-dedicated-")), binaries, audit=audit)
    try:
        try:
            plane.start()
        except ControlPlaneError as error:
            pytest.fail(f"cannot start a dedicated control plane: {error}", pytrace=False)
        yield plane
    finally:
        plane.stop()


@pytest_asyncio.fixture(scope="session")
async def kube(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        await install_crds(client, [*capi_crd_paths(load_versions()), *our_crd_paths()])
    except (AssetError, TimeoutError) as error:
        await client.close()
        pytest.fail(f"cannot install the CRDs: {error}", pytrace=False)
    yield client
    await client.close()


@pytest_asyncio.fixture
async def namespace(kube: KubeClient) -> AsyncIterator[str]:
    name = f"t-{secrets.token_hex(4)}"
    await kube.create(NAMESPACES, {"metadata": {"name": name, "labels": {"ipam-provider-test": "true"}}})
    yield name
    await kube.delete(NAMESPACES, name)


async def wait_for(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = 30.0,
    interval: float = 0.1,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Poll `probe` until it returns something truthy, and return it; fail the test with `message` (and the
    last value seen) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = await probe()
        if last:
            return cast(T, last)
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {text}; last value: {last!r}")
        await asyncio.sleep(interval)
