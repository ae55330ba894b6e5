"""`ipam-provider run` as a process: flags, probes, metrics, and `status`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from ipam_provider.api.capi import CLAIMS
from ipam_provider.flags import build_parser
from ipam_provider.runtime.flagforms import host_port, split_list
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.controller import controller_command
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
    assert split_list(args.namespace) == ["a", "b", "c"]
    assert args.watch_filter == "x" and args.leader_elect
    assert host_port(args.metrics_bind_address) is None
    assert host_port(args.health_probe_bind_address) == ("127.0.0.1", 9)
    assert host_port(":8080") == ("0.0.0.0", 8080)


async def test_probes_metrics_and_status(kube: KubeClient, kubeconfig: Path, namespace: str) -> None:
    metrics_port, probe_port = free_port(), free_port()
    await kube.create(POOLS, pool("net", ["10.28.0.0/29"], 29), namespace)
    await kube.create(CLAIMS, claim("probed", "net"), namespace)
    process = await asyncio.create_subprocess_exec(
        *controller_command(kubeconfig, namespace),
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
                # The allocation is counted during the claim's reconcile, the reconcile itself when it ends: wait
                # for both, or a scrape between the two sees no reconcile yet.
                _, text = await get(f"http://127.0.0.1:{metrics_port}/metrics")
                pool_labels = f'backend="incluster",kind="InClusterIPPool",name="net",namespace="{namespace}"'
                allocated = f"ipam_provider_allocation_total{{{pool_labels}}} 1.0" in text  # labels sorted
                reconciled = 'controller_runtime_reconcile_total{controller="ipaddressclaim",result="success"}' in text
                return text if allocated and reconciled else None

            text = await wait_for(allocation_counted, message="the allocation and its reconcile to be counted")
            assert 'controller_runtime_reconcile_time_seconds_bucket{controller="ipaddressclaim"' in text
            assert 'workqueue_adds_total{controller="ipam",name="ipam"}' in text
            assert "rest_client_requests_total{" in text
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


def _kubeconfig_variant(
    kubeconfig: Path, directory: Path, *, server: str | None = None, token: str | None = None
) -> Path:
    """A copy of the session's kubeconfig with its server and every user's token replaced as asked."""
    config = json.loads(kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = server or entry["cluster"]["server"]
    for entry in config["users"]:
        entry["user"]["token"] = token or entry["user"]["token"]
    path = directory / "kubeconfig"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("broken", ["closed-port", "unauthorized"])
async def test_sigterm_stops_a_controller_whose_caches_never_sync(
    kubeconfig: Path, tmp_path: Path, broken: str
) -> None:
    """An unreachable API server or a refused token keeps the caches from syncing; SIGTERM must still stop the
    process promptly and cleanly (exit 0), as it does with controller-runtime."""
    if broken == "closed-port":
        variant = _kubeconfig_variant(kubeconfig, tmp_path, server=f"https://127.0.0.1:{free_port()}")
    else:
        variant = _kubeconfig_variant(kubeconfig, tmp_path, token="not-a-valid-token")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ipam_provider",
        "run",
        f"--kubeconfig={variant}",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
        "--webhook-port=0",
        "--log-format=json",
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        env={**os.environ},
    )
    drain: asyncio.Task[None] | None = None
    try:
        # SIGTERM is handled from the "controller starting" line on (a loaded machine takes seconds to import);
        # then the informers fail and back off for a while.
        assert process.stderr is not None
        await asyncio.wait_for(_line_with(process.stderr, '"controller starting"'), 30)
        drain = asyncio.create_task(_line_with(process.stderr, "\0never"))
        await asyncio.sleep(2.0)
        assert process.returncode is None, "the controller must keep retrying, not exit, while it cannot sync"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if drain is not None:
            drain.cancel()


async def _line_with(stream: asyncio.StreamReader, text: str) -> None:
    """Read lines until one contains `text` (or the stream ends); reading also keeps the pipe from filling."""
    while True:
        line = await stream.readline()
        if not line or text in line.decode(errors="replace"):
            return


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (
            ["run", "--kubeconfig=/nonexistent"],
            {},
            "cannot load the kubeconfig /nonexistent (--kubeconfig): no such file",
        ),
        (["run", "--kubeconfig=/etc/hostname"], {}, "cannot load the kubeconfig /etc/hostname: not a kubeconfig"),
        (["status", "--kubeconfig=/etc/hostname"], {}, "cannot load the kubeconfig /etc/hostname: not a kubeconfig"),
        (["run"], {"HOME": "/nonexistent"}, "no kubeconfig: give one with --kubeconfig=<file> or KUBECONFIG"),
        (["status"], {"HOME": "/nonexistent"}, "no kubeconfig: give one with --kubeconfig=<file> or KUBECONFIG"),
    ],
    ids=["missing-file", "not-a-kubeconfig", "status-not-a-kubeconfig", "none-at-all", "status-none-at-all"],
)
def test_a_bad_or_missing_kubeconfig_is_one_line_and_exit_2_before_any_listener(
    args: list[str], env: dict[str, str], says: str
) -> None:
    """The metrics address is taken: had a listener been started before the kubeconfig loaded, the run would fail
    on the address (exit 1) instead."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        clean = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
        listen = [f"--metrics-bind-address=127.0.0.1:{port}"] if args[0] == "run" else []
        result = subprocess.run(
            [sys.executable, "-m", "ipam_provider", *args, *listen],
            env={**clean, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2, lines
    assert len(lines) == 1 and says in lines[0], lines
