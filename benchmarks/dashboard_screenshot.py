"""Render docs/images/dashboard.png from a real run: the Grafana dashboard's panels over real Prometheus data.

1. A fresh local control plane (`tools.controlplane`), the Cluster API and provider CRDs, namespace `dashboard`,
   and three InClusterIPPools: `nodes` (a /26), `vips` (a /27) and `small` (a /29, 6 addresses).
2. Our controller as a subprocess with plain-HTTP metrics on a loopback port (`--metrics-bind-address`) and
   `--leader-elect` (its Lease in the same namespace).
3. The Prometheus server of PROMETHEUS_VERSION (hack/prometheus/build.sh) scraping it every 5 s.
4. A workload in waves, a few seconds apart: claims on all three pools, `small` over its size (claims then wait
   with PoolExhausted), some claims released, more created.
5. `tools.dashboard_render` draws every panel over the run into the PNG.

Run from the repository root: `.venv/bin/python benchmarks/dashboard_screenshot.py [--out docs/images/dashboard.png]
[--keep-logs DIR]` (about 3 minutes warm). Every process started is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import log_tail, start_process, stop_process
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.resources import CLAIMS, IPAM_GROUP, NAMESPACES, Resource
from tools.controlplane.assets import binaries_dir, capi_crd_paths, our_crd_paths
from tools.controlplane.cluster import LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import REPO_ROOT, load_versions
from tools.dashboard_render import render
from tools.prometheus import PrometheusServer, free_port, prometheus_binaries

NAMESPACE = "dashboard"
POOLS = Resource(IPAM_GROUP, "v1alpha2", "inclusterippools", "InClusterIPPool", namespaced=True)
LAYOUT = {"nodes": ("10.20.0.0/26", 26), "vips": ("10.21.0.0/27", 27), "small": ("10.22.0.0/29", 29)}
SCRAPE_INTERVAL = "5s"
# (pause before the wave in seconds, claims to create per pool, claims to delete per pool)
WAVES: list[tuple[float, dict[str, int], dict[str, int]]] = [
    (0, {"nodes": 12, "vips": 6, "small": 3}, {}),
    (20, {"nodes": 12, "vips": 6, "small": 3}, {}),
    (20, {"nodes": 10, "vips": 4, "small": 4}, {}),  # small: 10 claims for 6 addresses
    (25, {}, {"nodes": 15, "vips": 6}),
    (20, {"nodes": 8, "vips": 6}, {"small": 2}),
    (20, {"nodes": 8}, {}),
]


def controller_argv(kubeconfig: Path, metrics_port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ipam_provider",
        "run",
        f"--kubeconfig={kubeconfig}",
        f"--namespace={NAMESPACE}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        "--health-probe-bind-address=0",
        "--leader-elect",
        f"--leader-election-namespace={NAMESPACE}",
        "--log-level=warning",
    ]


def prometheus_config(path: Path, metrics_port: int) -> Path:
    path.write_text(
        f"global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  evaluation_interval: {SCRAPE_INTERVAL}\n"
        "scrape_configs:\n- job_name: capi-ipam-controller-manager-metrics-service\n"
        f"  static_configs:\n  - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    return path


async def prepare(kubeconfig: Path) -> None:
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        await install_crds(kube, [*capi_crd_paths(load_versions()), *our_crd_paths()])
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for name, (cidr, prefix) in LAYOUT.items():
            body = {"apiVersion": POOLS.api_version, "kind": POOLS.kind, "metadata": {"name": name}}
            await kube.create(POOLS, {**body, "spec": {"addresses": [cidr], "prefix": prefix}}, NAMESPACE)
    finally:
        await kube.close()


def claim_body(name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": CLAIMS.api_version,
        "kind": CLAIMS.kind,
        "metadata": {"name": name},
        "spec": {"poolRef": {"apiGroup": IPAM_GROUP, "kind": POOLS.kind, "name": pool}},
    }


async def workload(kubeconfig: Path, alive: Any) -> None:
    """Create and delete claims in the waves of WAVES; raise if the controller exits meanwhile."""
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    live: dict[str, list[str]] = {pool: [] for pool in LAYOUT}
    serial = 0
    try:
        for number, (pause, creates, deletes) in enumerate(WAVES, 1):
            await asyncio.sleep(pause)
            if not alive():
                raise RuntimeError("the controller exited")
            for pool, count in creates.items():
                for _ in range(count):
                    serial += 1
                    name = f"{pool}-claim-{serial}"
                    await kube.create(CLAIMS, claim_body(name, pool), NAMESPACE)
                    live[pool].append(name)
            for pool, count in deletes.items():
                for name in live[pool][:count]:
                    await kube.delete(CLAIMS, name, NAMESPACE)
                del live[pool][:count]
            print(f"wave {number}: created {sum(creates.values())}, deleted {sum(deletes.values())}", flush=True)
        await asyncio.sleep(30)  # the last wave's effects, over a few scrapes
    finally:
        await kube.close()


def run(out: Path, work: Path) -> list[str]:
    """The whole run; returns the titles of the panels that had no data."""
    bins = prometheus_binaries()
    plane = LocalControlPlane(work / "control-plane", binaries_dir())
    metrics_port = free_port()
    controller = None
    try:
        plane.start()
        asyncio.run(prepare(plane.kubeconfig_path))
        controller = start_process(controller_argv(plane.kubeconfig_path, metrics_port), work / "controller.log")
        config = prometheus_config(work / "prometheus.yml", metrics_port)
        with PrometheusServer(bins.prometheus, config, work / "tsdb", work / "prometheus.log") as prometheus:
            started = time.time()
            process = controller
            asyncio.run(workload(plane.kubeconfig_path, lambda: process.poll() is None))
            results = render(prometheus.url, started - 30, time.time(), out)
    except Exception:
        print(f"--- controller.log (tail)\n{log_tail(work / 'controller.log')}", file=sys.stderr)
        raise
    finally:
        stop_process(controller)
        plane.stop()
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
        print("\ninterrupted: control plane, controller and Prometheus stopped", file=sys.stderr)
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
