"""`ipam-provider run` as a process: with `--webhook-port` and `--webhook-cert-dir` it serves the webhook (and the
Runtime SDK lifecycle hook's discovery), /readyz counts it, and the API server calls it; once no process answers,
the shipped configuration (failurePolicy Fail, scoped to our pool kinds) refuses pool changes with the reason and
leaves every other object alone; with `--webhook-port=0` nothing is served, and the pool's status reports what the
webhook would have refused."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from ipam_provider.api.capi import CLAIMS
from ipam_provider.common import Object
from ipam_provider.lifecycle_hook import DISCOVERY_PATH, HANDLER, HOOKS_API_VERSION
from ipam_provider.runtime.kube.client import KubeClient
from tests.ipam_provider.test_admission import (
    CONFIG_MAPS,
    DENIED,
    configuration,
    labelled,
    refused,
    registered,
    serving_pki,
)
from tests.ipam_provider.test_cli import free_port
from tests.support.cluster import wait_for
from tests.support.controller import controller_command
from tests.support.objects import POOLS, claim, pool, wait_address


@contextlib.asynccontextmanager
async def controller_process(
    kubeconfig: Path, namespace: str, log: Path, flags: Sequence[str]
) -> AsyncIterator[asyncio.subprocess.Process]:
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            *controller_command(kubeconfig, namespace, "--metrics-bind-address=0", "--log-format=json", *flags),
            stdout=sink,
            stderr=sink,
        )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)


async def hook_discovery(port: int, ca: bytes) -> Object:
    """The lifecycle hook's discovery answer, over HTTPS verified with `ca`, as Cluster API's Runtime SDK asks."""
    request = {"apiVersion": HOOKS_API_VERSION, "kind": "DiscoveryRequest"}
    context = ssl.create_default_context(cadata=ca.decode())
    url = f"https://127.0.0.1:{port}{DISCOVERY_PATH}"
    async with aiohttp.ClientSession() as session, session.post(url, json=request, ssl=context) as reply:
        assert reply.status == 200, await reply.text()
        answer: Object = await reply.json()
        return answer


def whole(log: Path) -> str:
    return log.read_text(errors="replace")


def tail(log: Path) -> str:
    return whole(log)[-3000:]


async def wait_ready(process: asyncio.subprocess.Process, health: int, log: Path) -> None:
    async def ready() -> bool:
        assert process.returncode is None, tail(log)
        try:
            async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{health}/readyz") as reply:
                return reply.status == 200
        except aiohttp.ClientError:
            return False

    await wait_for(ready, timeout=60, interval=0.25, message=lambda: f"/readyz to answer 200:\n{tail(log)}")


@pytest.mark.apiserver
async def test_the_process_serves_the_webhook_and_a_dead_one_refuses_only_pool_changes(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    files, ca = serving_pki(tmp_path)
    port, health, log = free_port(), free_port(), tmp_path / "controller.log"
    flags = [
        f"--health-probe-bind-address=127.0.0.1:{health}",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={port}",
        f"--webhook-cert-dir={files.directory}",
    ]
    body = configuration(f"ipam-test-{namespace}", f"https://127.0.0.1:{port}", ca, namespace)
    await kube.create(POOLS, labelled(pool("net", ["10.66.0.10-10.66.0.20"], 24), namespace), namespace)
    async with controller_process(kubeconfig, namespace, log, flags) as process:
        await wait_ready(process, health, log)
        assert '"serving the admission webhook over HTTPS"' in whole(log)
        assert [h["name"] for h in (await hook_discovery(port, ca))["handlers"]] == [HANDLER]
        async with registered(kube, body, namespace):
            await kube.create(CLAIMS, claim("m1", "net"), namespace)
            assert (await wait_address(kube, namespace, "m1"))["spec"]["address"] == "10.66.0.10"
            error = await refused(
                kube.patch(POOLS, "net", {"spec": {"addresses": ["10.66.0.11-10.66.0.20"]}}, namespace)
            )
            assert "do not contain allocated addresses: the new spec leaves out 1 address" in error.message

            process.terminate()
            assert await asyncio.wait_for(process.wait(), 30) == 0

            # No process answers: changes to the pool are refused, saying the webhook could not be called...
            error = await refused(
                kube.patch(POOLS, "net", {"spec": {"addresses": ["10.66.0.10-10.66.0.30"]}}, namespace)
            )
            assert "failed calling webhook" in error.message and DENIED not in error.message, error.message
            error = await refused(kube.delete(POOLS, "net", namespace))
            assert "failed calling webhook" in error.message
            # ...and nothing else is: an object of another kind with the same label, and claims (never sent).
            config_map = labelled({"metadata": {"name": "unrelated"}, "data": {"a": "b"}}, namespace)
            await kube.create(CONFIG_MAPS, config_map, namespace)
            await kube.patch(CONFIG_MAPS, "unrelated", {"data": {"a": "c"}}, namespace)
            assert await kube.delete(CONFIG_MAPS, "unrelated", namespace)
            await kube.create(CLAIMS, claim("m2", "net"), namespace)
            assert await kube.delete(CLAIMS, "m2", namespace)


@pytest.mark.apiserver
async def test_without_the_webhook_the_pool_status_reports_what_it_would_have_refused(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    health, log = free_port(), tmp_path / "controller.log"
    await kube.create(POOLS, pool("net", ["10.67.0.10-10.67.0.20"], 24), namespace)
    await kube.create(CLAIMS, claim("m1", "net"), namespace)
    flags = [f"--health-probe-bind-address=127.0.0.1:{health}"]  # controller_command's --webhook-port=0
    async with controller_process(kubeconfig, namespace, log, flags) as process:
        await wait_ready(process, health, log)
        assert (await wait_address(kube, namespace, "m1"))["spec"]["address"] == "10.67.0.10"
        assert "admission webhook" not in whole(log)
        await kube.patch(POOLS, "net", {"spec": {"addresses": ["10.67.0.11-10.67.0.20"]}}, namespace)

        async def out_of_range() -> bool:
            found = await kube.get(POOLS, "net", namespace)
            return bool(((found or {}).get("status") or {}).get("ipAddresses", {}).get("outOfRange") == 1)

        await wait_for(out_of_range, timeout=60, message="the pool's status to count the stranded address")
        assert await kube.delete(POOLS, "net", namespace)  # accepted: the ProtectPool finalizer holds it while in use
        assert await kube.get(POOLS, "net", namespace) is not None
