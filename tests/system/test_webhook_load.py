"""A flood of the admission webhook's port does not stop the leader: `ipam-provider run --leader-elect` as a process,
its webhook registered as config/default registers it, serving claims; then, for FLOOD_SECONDS, another process
(`webhook_flood.py`) posts 8 MiB bodies (with and without Content-Length) and gzip bombs, keeps slowloris
connections trickling their headers and holds more idle connections than the server takes.

Throughout, the leader keeps its Lease (one holder; renewTime moves, no gap as long as the lease's duration), every
claim created once a second is fulfilled within CLAIM_SECONDS, the oversized bodies are answered 413, the slow
connections are dropped after the header timeout, and the process's RSS grows by less than RSS_GROWTH_MIB. Short
timeouts (flags) keep it within a minute. The figures are printed (`-s` shows them); `benchmarks/webhook_flood.py`
measures the same at length.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import LEASES
from tests.ipam_provider.test_admission import configuration, labelled, refused, registered, serving_pki
from tests.ipam_provider.test_cli import free_port
from tests.support.objects import POOLS, pool
from tests.support.webhook_flood import (
    POSTS,
    Observed,
    claims_at_pace,
    fulfilment_seconds,
    observe,
    percentile,
    rss_kib,
    run_flood,
)
from tests.system.test_admission_process import controller_process, tail, wait_ready

LEASE = "webhook-load"
LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS = 8.0, 5.0, 1.0
HEADER_SECONDS, IDLE_SECONDS = 2.0, 3.0
FLOOD_SECONDS = 20.0
CLAIM_SECONDS = 10.0
RSS_GROWTH_MIB = 200


def flags(port: int, health: int, certs: str, namespace: str) -> list[str]:
    return [
        f"--health-probe-bind-address=127.0.0.1:{health}",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={port}",
        f"--webhook-cert-dir={certs}",
        "--leader-elect",
        f"--leader-election-id={namespace}/{LEASE}",
        f"--leader-elect-lease-duration={LEASE_SECONDS:g}s",
        f"--leader-elect-renew-deadline={RENEW_SECONDS:g}s",
        f"--leader-elect-retry-period={RETRY_SECONDS:g}s",
        f"--http-read-header-timeout={HEADER_SECONDS:g}s",
        f"--http-idle-timeout={IDLE_SECONDS:g}s",
    ]


async def flooded(kube: KubeClient, namespace: str, pid: int, port: int) -> tuple[Observed, list[float], Any]:
    """The flood, with claims at one a second and the lease and RSS watched: what was seen."""
    observed, stop = Observed(), asyncio.Event()

    async def read_lease() -> Object | None:
        return await kube.get(LEASES, LEASE, namespace)

    watcher = asyncio.create_task(observe(read_lease, pid, observed, stop))
    flood = asyncio.create_task(run_flood(port, FLOOD_SECONDS))
    await asyncio.sleep(1.0)  # the flood under way
    latencies = await claims_at_pace(kube, namespace, "flood", int(FLOOD_SECONDS) - 3, 1.0, CLAIM_SECONDS * 3)
    figures = await flood
    stop.set()
    await watcher
    return observed, latencies, figures


def report(idle: list[float], latencies: list[float], observed: Observed, figures: Any, before: int) -> str:
    gaps = observed.renewal_gaps()
    return (
        f"claims idle: p50 {percentile(idle, 0.5):.3f} s, max {max(idle):.3f} s; under the flood: "
        f"p50 {percentile(latencies, 0.5):.3f} s, max {max(latencies):.3f} s\n"
        f"lease renewals {len(observed.renewals)}, largest gap {max(gaps, default=float('nan')):.2f} s, "
        f"holders {sorted(observed.holders)}\n"
        f"RSS before {before // 1024} MiB, peak {max(observed.rss_kib) // 1024} MiB\n"
        f"flood: {figures}"
    )


@pytest.mark.apiserver
async def test_a_flood_of_the_webhook_port_leaves_the_leader_serving(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    files, ca = serving_pki(tmp_path)
    assert files.directory is not None
    port, health, log = free_port(), free_port(), tmp_path / "controller.log"
    async with controller_process(kubeconfig, namespace, log, flags(port, health, files.directory, namespace)) as cp:
        await wait_ready(cp, health, log)
        body = configuration(f"ipam-load-{namespace}", f"https://127.0.0.1:{port}", ca, namespace)
        async with registered(kube, body, namespace):
            await kube.create(POOLS, labelled(pool("net", ["10.72.0.0/20"], 20), namespace), namespace)
            idle = [await fulfilment_seconds(kube, namespace, f"idle-{n}", "net", 60) for n in range(5)]  # leader now
            before = rss_kib(cp.pid)
            observed, latencies, figures = await flooded(kube, namespace, cp.pid, port)
            print(report(idle, latencies, observed, figures, before))
            assert cp.returncode is None, tail(log)
            # Still serving reviews: a spec the backend cannot use is refused with its message.
            error = await refused(kube.patch(POOLS, "net", {"spec": {"addresses": ["10.72.0.9-10.72.0.1"]}}, namespace))
            assert "10.72.0.9-10.72.0.1" in error.message, error.message
    holders = observed.holders - {""}
    assert len(holders) == 1, f"the lease changed hands: {holders}"
    gaps = observed.renewal_gaps()
    assert len(observed.renewals) >= FLOOD_SECONDS / LEASE_SECONDS and max(gaps) < LEASE_SECONDS, gaps
    assert max(latencies) < CLAIM_SECONDS, latencies
    for kind in POSTS:
        statuses = figures["statuses"][kind]
        assert statuses.get("413", 0) >= 1 and set(statuses) <= {"413", "429", "0", "-1"}, (kind, statuses)
    slowest = 2 * HEADER_SECONDS + 3  # the handshake, then the headers, each within the header timeout
    assert figures["slow_dropped"] >= 1 and figures["slow_max_seconds"] < slowest, figures
    assert figures["idle_refused"] >= 1, figures  # more connections than the server keeps open
    assert (max(observed.rss_kib) - before) / 1024 < RSS_GROWTH_MIB, (before, max(observed.rss_kib))
