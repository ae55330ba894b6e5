"""A separately installed package adds a pool kind through the `ipam_provider.backends` entry-point group.

The example package under tests/plugin_package is installed into a temporary directory (not this repo's
environment), and the real `ipam-provider run` process, given that directory on its path, discovers it and
serves claims on its `StaticIPPool` kind next to the built-in kinds.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tests.support.controller import controller_command
from tests.support.objects import claim, wait_address
from tools.controlplane.crds import install_crds

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugin_package"
STATIC_POOLS = Resource("ipam.example.com", "v1alpha1", "staticippools", "StaticIPPool", namespaced=True)


async def run(*command: str, env: dict[str, str] | None = None) -> str:
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env
    )
    output, _ = await process.communicate()
    assert process.returncode == 0, f"{command} failed:\n{output.decode()}"
    return output.decode()


async def test_an_installed_package_adds_a_pool_kind(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    target, source = tmp_path / "site", tmp_path / "source"
    shutil.copytree(PLUGIN_DIR, source)  # building writes next to the sources: keep the work tree clean
    await run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--target",
        str(target),
        str(source),
    )
    assert list(target.glob("ipam_static_pool-*.dist-info")) or list(target.glob("ipam_static_pool_example-*"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *sys.path])}
    # Without the package on its path, the controller does not know the kind.
    plain = await run(
        sys.executable,
        "-c",
        "from ipam_provider.backend.registry import discover_factories; print(sorted(discover_factories()))",
    )
    assert "static" not in plain
    found = await run(
        sys.executable,
        "-c",
        "from ipam_provider.backend.registry import discover_factories; print(sorted(discover_factories()))",
        env=env,
    )
    assert "static" in found and "incluster" in found

    await install_crds(kube, [PLUGIN_DIR / "ipam_static_pool" / "crd.yaml"])
    await kube.create(
        STATIC_POOLS,
        {
            "apiVersion": "ipam.example.com/v1alpha1",
            "kind": "StaticIPPool",
            "metadata": {"name": "static"},
            "spec": {"addresses": ["192.0.2.7", "192.0.2.9"], "prefix": 24},
        },
        namespace,
    )
    await kube.create(CLAIMS, claim("plugged", "static", kind="StaticIPPool", group="ipam.example.com"), namespace)
    controller = await asyncio.create_subprocess_exec(
        *controller_command(kubeconfig, namespace),
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
        "--log-level=warning",
        env=env,
    )
    try:
        address = await wait_address(kube, namespace, "plugged")
        assert address["spec"]["address"] == "192.0.2.7"
        assert address["spec"]["poolRef"] == {"apiGroup": "ipam.example.com", "kind": "StaticIPPool", "name": "static"}
        assert address["metadata"]["annotations"]["ipam.example.com/served-by"] == "static"
        await kube.delete(CLAIMS, "plugged", namespace)

        async def released() -> bool:
            return await kube.get(ADDRESSES, "plugged", namespace) is None

        from tests.support.cluster import wait_for

        await wait_for(released, message="the plugin's claim to be released")
    finally:
        controller.terminate()
        assert await asyncio.wait_for(controller.wait(), 30) == 0


def test_the_historical_contract_path_still_serves_plugins() -> None:
    from backends import protocol
    from ipam_provider.backend import contract
    from ipam_provider.backend import protocol as core

    assert protocol.Backend is core.Backend and protocol.PoolReport is contract.PoolReport
