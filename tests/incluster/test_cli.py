"""`ipam-provider run` as a process: flags, probes, metrics, and `status`."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import aiohttp

from ipam_provider.cli import _host_port, _split, build_parser
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.resources import CLAIMS
from tests.support.cluster import wait_for
from tests.support.objects import POOLS, claim, pool, wait_address


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_controller_runtime_flag_forms() -> None:
    args = build_parser().parse_args(
        [
            "run",
            "--namespace",
            "a,b",
            "--namespace",
            "c",
            "--watch-filter",
            "x",
            "--leader-elect",
            "--metrics-bind-address",
            "0",
            "--health-probe-bind-address",
            "127.0.0.1:9",
        ]
    )
    assert _split(args.namespace) == ["a", "b", "c"]
    assert args.watch_filter == "x" and args.leader_elect
    assert _host_port(args.metrics_bind_address) is None
    assert _host_port(args.health_probe_bind_address) == ("127.0.0.1", 9)
    assert _host_port(":8080") == ("0.0.0.0", 8080)


async def test_probes_metrics_and_status(kube: KubeClient, kubeconfig: Path, namespace: str) -> None:
    metrics_port, probe_port = free_port(), free_port()
    await kube.create(POOLS, pool("net", ["10.28.0.0/29"], 29), namespace)
    await kube.create(CLAIMS, claim("probed", "net"), namespace)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ipam_provider",
        "run",
        f"--kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        "--log-format=json",
        env={**os.environ},
    )
    try:
        await wait_address(kube, namespace, "probed")
        async with aiohttp.ClientSession() as session:

            async def get(url: str) -> tuple[int, str]:
                async with session.get(url) as response:
                    return response.status, await response.text()

            assert await get(f"http://127.0.0.1:{probe_port}/healthz") == (200, "ok")
            assert await get(f"http://127.0.0.1:{probe_port}/readyz") == (200, "ok")

            async def allocation_counted() -> str | None:
                _, text = await get(f"http://127.0.0.1:{metrics_port}/metrics")
                return text if 'ipam_provider_allocations_total{pool_kind="InClusterIPPool"} 1.0' in text else None

            text = await wait_for(allocation_counted, message="the allocation to be counted in /metrics")
            assert "ipam_provider_reconcile_duration_seconds_bucket" in text
        status = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ipam_provider",
            "status",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            stdout=asyncio.subprocess.PIPE,
        )
        output, _ = await status.communicate()
        line = next(row for row in output.decode().splitlines() if "probed" in row)
        assert "InClusterIPPool/net" in line and "10.28.0.1/29" in line and "AddressAllocated" in line
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 30) == 0
