"""Render docs/images/dashboard.png from a real run: the Grafana dashboard's panels over real Prometheus data.

1. A fresh local control plane (`tools.controlplane`), the Cluster API and provider CRDs, namespace `dashboard`,
   and three InClusterIPPools: `nodes` (a /26), `vips` (a /27) and `small` (a /29, 6 addresses).
2. The WAPI simulator (`tools.wapi_simulator`, TLS, in a thread of this process) seeded with network view
   `dashboard` and network 10.30.0.0/24 in it; an InfobloxInstance pointing at it (its CA in `caBundle`), its
   credentials Secret and the InfobloxIPPool `grid` (fixed addresses) in the namespace.
3. Our controller as a subprocess with plain-HTTP metrics on a loopback port (`--metrics-bind-address`) and
   `--leader-elect` (its Lease in the same namespace).
4. The Prometheus server of PROMETHEUS_VERSION (hack/prometheus/build.sh) scraping it every 5 s.
5. A workload in waves, a few seconds apart: claims on all four pools, `small` over its size (claims then wait
   with PoolExhausted), some claims released, more created. One fault phase on the grid (its fault injection):
   every request answered 503 for 12 s, then every connection dropped unanswered for 12 s, then it recovers;
   claims created and released meanwhile are served once it does.
6. `tools.dashboard_render` draws every panel over the run into the PNG, `$__rate_interval` = 20 s (what Grafana
   makes of it for a 5 s scrape interval, so the fault phase's rates end with it).

Run from the repository root: `.venv/bin/python benchmarks/dashboard_screenshot.py [--out docs/images/dashboard.png]
[--keep-logs DIR]` (about 2.5 minutes warm). Every process and the simulator are stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.infoblox.spec import INFOBLOX_POOL, INSTANCES
from benchmarks._support import log_tail, start_process, stop_process
from ipam_provider.api.capi import CLAIMS, IPAM_GROUP
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS, Resource
from tools.controller_command import controller_command
from tools.controlplane.assets import binaries_dir, capi_crd_paths, our_crd_paths
from tools.controlplane.cluster import LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import REPO_ROOT, load_versions
from tools.dashboard_render import render
from tools.prometheus import PrometheusServer, free_port, prometheus_binaries
from tools.wapi_simulator import WapiSimulator

NAMESPACE = "dashboard"
POOLS = Resource(IPAM_GROUP, "v1alpha2", "inclusterippools", "InClusterIPPool", namespaced=True)
GRID_POOLS = pool_resource(INFOBLOX_POOL)
LAYOUT = {"nodes": ("10.20.0.0/26", 26), "vips": ("10.21.0.0/27", 27), "small": ("10.22.0.0/29", 29)}
GRID_POOL, GRID_VIEW, GRID_NETWORK, GRID_GATEWAY = "grid", "dashboard", "10.30.0.0/24", "10.30.0.1"
SCRAPE_INTERVAL = "5s"
# Grafana's $__rate_interval over a data source scraped every 5 s: max(4 x 5 s, step + 5 s).
RATE_INTERVAL = "20s"


@dataclass(frozen=True)
class Wave:
    """Wait `pause` seconds, set the grid's fault mode (when given), then create and delete claims per pool."""

    pause: float
    creates: dict[str, int]
    deletes: dict[str, int] = field(default_factory=dict)
    grid: str | None = None  # "refuse" (503 answers), "drop" (connections closed unanswered) or "restore"


WAVES = [
    Wave(0, {"nodes": 12, "vips": 6, "small": 3, GRID_POOL: 8}),
    Wave(20, {"nodes": 12, "vips": 6, "small": 3, GRID_POOL: 8}),
    Wave(20, {"nodes": 10, "vips": 4, "small": 4, GRID_POOL: 6}),  # small: 10 claims for 6 addresses
    Wave(25, {GRID_POOL: 4}, {"nodes": 15, "vips": 6, GRID_POOL: 8}, grid="refuse"),
    Wave(12, {"nodes": 8, "vips": 6, GRID_POOL: 4}, {"small": 2}, grid="drop"),
    Wave(12, {"nodes": 8, GRID_POOL: 4}, grid="restore"),
]


def set_grid_fault(grid: WapiSimulator, mode: str) -> None:
    """Every WAPI request from now on answers 503 ("refuse") or loses its connection ("drop"); "restore" ends it."""
    grid.faults.clear()
    if mode == "refuse":
        grid.faults.fail_rate(1.0)
    elif mode == "drop":
        grid.faults.drop_rate(1.0)
    elif mode != "restore":
        raise ValueError(f"unknown grid fault mode {mode!r}")


def start_grid() -> WapiSimulator:
    """A TLS WAPI simulator with network view GRID_VIEW holding GRID_NETWORK."""
    grid = WapiSimulator().start()
    grid.state.add_network_view(GRID_VIEW)
    grid.state.add_network(GRID_NETWORK, GRID_VIEW)
    return grid


def controller_argv(kubeconfig: Path, metrics_port: int) -> list[str]:
    return controller_command(
        kubeconfig,
        NAMESPACE,
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        "--health-probe-bind-address=0",
        "--leader-elect",
        f"--leader-election-namespace={NAMESPACE}",
        "--log-level=warning",
    )


def prometheus_config(path: Path, metrics_port: int) -> Path:
    path.write_text(
        f"global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  evaluation_interval: {SCRAPE_INTERVAL}\n"
        "scrape_configs:\n- job_name: capi-ipam-controller-manager-metrics-service\n"
        f"  static_configs:\n  - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    return path


async def prepare(kubeconfig: Path, grid: WapiSimulator) -> None:
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        await install_crds(kube, [*capi_crd_paths(load_versions()), *our_crd_paths()])
        lend = {"ipam.cluster.x-k8s.io/allow-cluster-scoped-secret-refs": "true"}  # the grid's Secret, to its instance
        await kube.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": lend}}
        )
        for name, (cidr, prefix) in LAYOUT.items():
            body = {"apiVersion": POOLS.api_version, "kind": POOLS.kind, "metadata": {"name": name}}
            await kube.create(POOLS, {**body, "spec": {"addresses": [cidr], "prefix": prefix}}, NAMESPACE)
        for resource, body, namespace in grid_objects(grid):
            await kube.create(resource, body, namespace)
    finally:
        await kube.close()


def grid_objects(grid: WapiSimulator) -> list[tuple[Resource, dict[str, Any], str | None]]:
    """The credentials Secret, the InfobloxInstance pointing at `grid` and the InfobloxIPPool on its network."""
    assert grid.ca_path is not None
    credentials = {"username": grid.username, "password": grid.password}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "grid-credentials"},
        "type": "kubernetes.io/basic-auth",
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in credentials.items()},
    }
    instance_spec = {
        "host": grid.host,
        "port": grid.port,
        "wapiVersion": grid.wapi_version,
        "credentialsSecretRef": {"name": "grid-credentials", "namespace": NAMESPACE},
        "caBundle": grid.ca_path.read_text(),
        "defaultNetworkView": GRID_VIEW,
        "allowedNamespaces": {"list": [NAMESPACE]},
    }
    instance = {"apiVersion": INSTANCES.api_version, "kind": INSTANCES.kind, "metadata": {"name": "dashboard-grid"}}
    pool_spec = {
        "instanceRef": {"name": "dashboard-grid"},
        "subnets": [{"cidr": GRID_NETWORK, "gateway": GRID_GATEWAY}],
        "mode": "fixedAddress",
    }
    pool = {"apiVersion": GRID_POOLS.api_version, "kind": GRID_POOLS.kind, "metadata": {"name": GRID_POOL}}
    return [
        (SECRETS, secret, NAMESPACE),
        (INSTANCES, {**instance, "spec": instance_spec}, None),
        (GRID_POOLS, {**pool, "spec": pool_spec}, NAMESPACE),
    ]


def claim_body(name: str, pool: str) -> dict[str, Any]:
    kind = GRID_POOLS.kind if pool == GRID_POOL else POOLS.kind
    return {
        "apiVersion": CLAIMS.api_version,
        "kind": CLAIMS.kind,
        "metadata": {"name": name},
        "spec": {"poolRef": {"apiGroup": IPAM_GROUP, "kind": kind, "name": pool}},
    }


async def workload(kubeconfig: Path, grid: WapiSimulator, alive: Callable[[], bool]) -> None:
    """Create and delete claims in the waves of WAVES, faulting the grid as they say; raise if the controller
    exits meanwhile."""
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    live: dict[str, list[str]] = {pool: [] for pool in [*LAYOUT, GRID_POOL]}
    serial = 0
    try:
        for number, wave in enumerate(WAVES, 1):
            await asyncio.sleep(wave.pause)
            if not alive():
                raise RuntimeError("the controller exited")
            if wave.grid:
                set_grid_fault(grid, wave.grid)
            for pool, count in wave.creates.items():
                for _ in range(count):
                    serial += 1
                    name = f"{pool}-claim-{serial}"
                    await kube.create(CLAIMS, claim_body(name, pool), NAMESPACE)
                    live[pool].append(name)
            for pool, count in wave.deletes.items():
                for name in live[pool][:count]:
                    await kube.delete(CLAIMS, name, NAMESPACE)
                del live[pool][:count]
            grid_note = f", grid {wave.grid}" if wave.grid else ""
            print(
                f"wave {number}: created {sum(wave.creates.values())}, deleted {sum(wave.deletes.values())}{grid_note}",
                flush=True,
            )
        await asyncio.sleep(30)  # the last wave's effects, over a few scrapes
    finally:
        await kube.close()


def run(out: Path, work: Path) -> list[str]:
    """The whole run; returns the titles of the panels that had no data."""
    bins = prometheus_binaries()
    plane = LocalControlPlane(work / "control-plane", binaries_dir())
    metrics_port = free_port()
    controller = None
    grid = start_grid()
    try:
        plane.start()
        asyncio.run(prepare(plane.kubeconfig_path, grid))
        controller = start_process(controller_argv(plane.kubeconfig_path, metrics_port), work / "controller.log")
        config = prometheus_config(work / "prometheus.yml", metrics_port)
        with PrometheusServer(bins.prometheus, config, work / "tsdb", work / "prometheus.log") as prometheus:
            started = time.time()
            process = controller
            asyncio.run(workload(plane.kubeconfig_path, grid, lambda: process.poll() is None))
            results = render(
                prometheus.url, started - 30, time.time(), out, overrides={"__rate_interval_min": RATE_INTERVAL}
            )
    except Exception:
        print(f"--- controller.log (tail)\n{log_tail(work / 'controller.log')}", file=sys.stderr)
        raise
    finally:
        stop_process(controller)
        plane.stop()
        grid.stop()
    for result in results:
        print(f"{result.title}: {len(result.series)} series" + (f", errors {result.errors}" if result.errors else ""))
    return [r.title for r in results if not r.series]


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "images" / "dashboard.png")
    parser.add_argument("--keep-logs", type=Path, help="copy the controller's and Prometheus's logs here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    work = Path(tempfile.mkdtemp(prefix="ipam-dashboard-"))
    try:
        empty = run(args.out, work)
    except KeyboardInterrupt:
        print("\ninterrupted: control plane, controller, WAPI simulator and Prometheus stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in work.glob("*.log"):
                shutil.copy(log, args.keep_logs / log.name)
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out}; panels without data: {', '.join(empty) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
