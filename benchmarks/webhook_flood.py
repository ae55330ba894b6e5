"""What a flood of the admission webhook's port costs the leader, against an idle baseline in the same run.

On a fresh local control plane (`tools.controlplane`), namespace `bench`: our controller as a subprocess with
`--leader-elect` (the production durations: lease 15 s, renewal every 2 s) and its webhook on a loopback port with the
self-signed certificate (the API server does not call it here: the port is attacked directly), and one
InClusterIPPool. Two phases of `--seconds` each, one after the other: idle, then with `tests/support/webhook_flood.py`
flooding the webhook port (8 MiB bodies with and without Content-Length, gzip bombs, slowloris connections, more
idle connections than the server keeps). In each phase a claim is created every `--claim-every` seconds, and the
Lease and the controller's RSS are read every 0.2 s. Figures per phase: claims' create→fulfilled latency (p50, p95,
max), the Lease's renewals and the largest gap between two renewTimes, the RSS at the start and its peak; for the
flood: answers per second by status, connections refused at accept per second, slowloris connections dropped and
their longest life.

Run from the repository root: `.venv/bin/python benchmarks/webhook_flood.py [--seconds 30] [--claim-every 0.5]
[--header-timeout 32s]`. Exit status 0 on success, 1 when a phase failed.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import log_tail, start_process, stop_process
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import LEASES, NAMESPACES
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
from tools.controller_command import controller_command
from tools.controlplane.assets import AssetError, binaries_dir, capi_crd_paths, our_crd_paths
from tools.controlplane.cluster import LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import load_versions

NAMESPACE = "bench"
LEASE = "webhook-flood"
CLAIM_TIMEOUT = 60.0


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def phase(kube: KubeClient, pid: int, args: argparse.Namespace, port: int | None) -> dict[str, Any]:
    """One phase: claims at pace with the lease and RSS watched, and the flood when `port` is given."""
    observed, stop = Observed(), asyncio.Event()

    async def read_lease() -> Any:
        return await kube.get(LEASES, LEASE, NAMESPACE)

    started_rss = rss_kib(pid)
    watcher = asyncio.create_task(observe(read_lease, pid, observed, stop))
    flood = asyncio.create_task(run_flood(port, args.seconds, *args.flood)) if port is not None else None
    prefix = "flood" if port is not None else "idle"
    count = max(int(args.seconds / args.claim_every) - 2, 1)
    latencies = await claims_at_pace(kube, NAMESPACE, prefix, count, args.claim_every, CLAIM_TIMEOUT)
    figures = await flood if flood is not None else None
    stop.set()
    await watcher
    return {"latencies": latencies, "observed": observed, "rss_start": started_rss, "flood": figures}


async def measure(kubeconfig: Path, pid: int, port: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        await kube.create(POOLS, pool("net", ["10.80.0.0/16"], 16), NAMESPACE)
        await fulfilment_seconds(kube, NAMESPACE, "first", "net", CLAIM_TIMEOUT)  # the leader serves
        return [await phase(kube, pid, args, None), await phase(kube, pid, args, port)]
    finally:
        await kube.close()


async def install(kubeconfig: Path) -> None:
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        await install_crds(kube, [*capi_crd_paths(load_versions()), *our_crd_paths()])
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    finally:
        await kube.close()


def run(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    plane = LocalControlPlane(work / "plane", binaries_dir())
    log, process = work / "controller.log", None
    try:
        plane.start()
        kubeconfig = plane.kubeconfig_path
        asyncio.run(install(kubeconfig))
        port = free_port()
        argv = controller_command(
            kubeconfig,
            NAMESPACE,
            "--health-probe-bind-address=0",
            "--metrics-bind-address=0",
            "--log-level=warning",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={port}",
            f"--webhook-cert-dir={work / 'no-certs'}",  # absent: the self-signed certificate
            "--leader-elect",
            f"--leader-election-id={NAMESPACE}/{LEASE}",
            f"--http-read-header-timeout={args.header_timeout}",
        )
        process = start_process(argv, log)
        return asyncio.run(measure(kubeconfig, process.pid, port, args))
    except Exception as error:
        print(f"error: {type(error).__name__}: {error}\n--- controller log (tail)\n{log_tail(log)}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        stop_process(process)
        plane.stop()


def report(phases: list[dict[str, Any]]) -> None:
    print("| phase | claims | p50 s | p95 s | max s | renewals | largest renewal gap s | RSS start MiB | peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, figures in zip(("idle", "flood"), phases, strict=True):
        latencies, observed = figures["latencies"], figures["observed"]
        gaps = observed.renewal_gaps()
        print(
            f"| {name} | {len(latencies)} | {percentile(latencies, 0.5):.3f} | {percentile(latencies, 0.95):.3f} | "
            f"{max(latencies):.3f} | {len(observed.renewals)} | {max(gaps, default=float('nan')):.2f} | "
            f"{figures['rss_start'] // 1024} | {max(observed.rss_kib) // 1024} |"
        )
    flood = phases[1]["flood"]
    seconds = flood["seconds"]
    for kind in POSTS:
        rates = ", ".join(
            f"{status}: {count / seconds:.1f}/s" for status, count in sorted(flood["statuses"][kind].items())
        )
        print(f"{kind} bodies answered: {rates} (0: closed without an answer, -1: could not connect)")
    print(
        f"connections refused at accept: {flood['idle_refused'] / seconds:.1f}/s; idle connections dropped after "
        f"the handshake timeout: {flood['idle_dropped'] / seconds:.1f}/s; slowloris connections dropped: "
        f"{flood['slow_dropped']}, longest life {flood['slow_max_seconds']} s"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase (default 30)")
    parser.add_argument("--claim-every", type=float, default=0.5, help="seconds between claims (default 0.5)")
    parser.add_argument("--header-timeout", default="32s", help="the controller's --http-read-header-timeout")
    parser.add_argument("flood", nargs="*", help="flags for webhook_flood.py after --, e.g. -- --slow=100")
    args = parser.parse_args(argv)
    if args.seconds < 5 or args.claim_every <= 0:
        parser.error("need --seconds >= 5 and --claim-every > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ipam-flood-"))
    try:
        try:
            binaries_dir()
        except AssetError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        phases = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(phases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
