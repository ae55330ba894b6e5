"""`ipam-provider run` as cluster-api-operator starts it (Go-form flags), against the real API server: the lease
it takes is the one --leader-election-id names, with the lease duration given; claims are served; the metrics
endpoint takes the TLS minimum version given; the start-up line carries the version; SIGTERM gives the lease up."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
from pathlib import Path
from typing import Any

from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import LEASES
from ipam_provider.version import __version__
from tests.support.cluster import wait_for
from tests.support.controller import controller_command
from tests.support.objects import POOLS, claim, pool, wait_address
from tests.support.tlsclient import handshake, refused


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_operators_flags_drive_a_running_controller(
    kube: KubeClient, kubeconfig: Path, namespace: str
) -> None:
    await kube.create(POOLS, pool("net", ["10.29.0.0/29"], 29), namespace)
    await kube.create(CLAIMS, claim("operated", "net"), namespace)
    diagnostics_port = free_port()
    process = await asyncio.create_subprocess_exec(
        *controller_command(kubeconfig, namespace),
        "--leader-elect=true",
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=3s",
        "--leader-elect-retry-period=500ms",
        f"--diagnostics-address=127.0.0.1:{diagnostics_port}",  # the operator's :8443, on a free port here
        "--insecure-diagnostics=false",
        "--tls-min-version=VersionTLS13",
        f"--health-addr=127.0.0.1:{free_port()}",
        "--v=2",
        "--sync-period=10m",
        f"--leader-election-id={namespace}/ipam-lock",
        "--leader-election-namespace=capi-ipam-system",  # the id's namespace wins
        "--ipaddressclaim-concurrency=3",
        "--logging-format=json",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ},
    )
    try:
        await wait_address(kube, namespace, "operated")
        # --tls-min-version acts on the HTTPS metrics endpoint: a TLS 1.2 client is refused, a TLS 1.3 one served.
        assert (await asyncio.to_thread(handshake, diagnostics_port))[0] == "TLSv1.3"
        await asyncio.to_thread(refused, diagnostics_port, ssl.TLSVersion.TLSv1_2)

        async def held() -> dict[str, Any] | None:
            lease = await kube.get(LEASES, "ipam-lock", namespace)
            return lease if lease and (lease.get("spec") or {}).get("holderIdentity") else None

        lease = await wait_for(held, message="the lease named by --leader-election-id to be held")
        assert lease["spec"]["leaseDurationSeconds"] == 4
        first_renewal = lease["spec"]["renewTime"]

        async def renewed() -> bool:
            current = await held()
            return current is not None and current["spec"]["renewTime"] != first_renewal

        await wait_for(renewed, timeout=15, message="the leader to renew its lease")
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr.decode()[-3000:]
    records = [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]
    (starting,) = [r for r in records if r["event"] == "controller starting"]
    assert starting["version"] == __version__ and starting["workers"] == 3 and starting["leader_elect"] is True
    assert starting["sync_period"] == 600.0, "--sync-period=10m acts"
    assert not [r for r in records if r["event"] == "flags accepted but not acted on"]
    assert not [r for r in records if r["level"] == "debug"], "--v=2 logs at info"
    lease_after = await kube.get(LEASES, "ipam-lock", namespace)
    assert lease_after is not None and not lease_after["spec"].get("holderIdentity"), "SIGTERM gives the lease up"
    assert await kube.get(LEASES, "ipam-lock", "capi-ipam-system") is None
