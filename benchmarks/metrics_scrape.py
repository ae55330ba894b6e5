"""What one Prometheus scrape of our controller costs, with few pools and with many, measured in the same run.

On a fresh local control plane (`tools.controlplane`): namespace `bench`, our controller as a subprocess serving
its metrics the default way (HTTPS on --diagnostics-address, every scrape authenticated by a TokenReview and
authorised by a SubjectAccessReview), a ServiceAccount allowed to `get` `/metrics`, and its token. Then, for each
step of pools (default 1, then 100), each pool with `--claims-per-pool` fulfilled claims and one claim left
waiting on an exhausted pool:

- the exposition's size (bytes) and its number of samples and of series families;
- the time of one scrape, as the scraper sees it (median and p95 over `--scrapes` sequential scrapes, the first
  one, whose reviews miss the cache, reported apart);
- the controller's CPU seconds per scrape (from /proc, over the scrape loop, less an idle loop of the same length).

Run from the repository root: `.venv/bin/python benchmarks/metrics_scrape.py [--pools 1,100] [--claims-per-pool 3]
[--scrapes 50]`. Exit status 0 on success, 1 when a step failed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import socket
import ssl
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.parser import text_string_to_metric_families

from benchmarks._support import log_tail, proc_figures, start_process, stop_process
from benchmarks.fulfilment import wait_fulfilled
from ipam_provider.api.capi import CLAIMS, IPAM_GROUP
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES, Resource
from tools.controller_command import controller_command
from tools.controlplane.assets import AssetError, binaries_dir, capi_crd_paths, our_crd_paths
from tools.controlplane.cluster import LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import load_versions

NAMESPACE = "bench"
SCRAPER = "scraper"
POOLS = Resource(IPAM_GROUP, "v1alpha2", "inclusterippools", "InClusterIPPool", namespaced=True)
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTER_ROLE_BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)


@dataclass
class ScrapeFigures:
    pools: int
    claims: int
    size_bytes: int
    samples: int
    families: int
    first_seconds: float
    median_seconds: float
    p95_seconds: float
    cpu_per_scrape: float | None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@functools.cache
def unverified_context() -> ssl.SSLContext:
    """Made once: building a context loads the system's CA store, which would cost more than a scrape."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def scrape(url: str, token: str) -> tuple[int, bytes]:
    """One GET of `url` with `token` on a new connection, as Prometheus makes after an idle interval; (HTTP status,
    body). The serving certificate is not verified: this measures cost, not trust."""
    context = unverified_context()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return int(answer.status), answer.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()


async def install(kube: KubeClient) -> None:
    await install_crds(kube, [*capi_crd_paths(load_versions()), *our_crd_paths()])
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    await kube.create(
        SERVICE_ACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SCRAPER}}, NAMESPACE
    )
    rbac = "rbac.authorization.k8s.io/v1"
    rule = {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}
    await kube.create(
        CLUSTER_ROLES, {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": SCRAPER}, "rules": [rule]}
    )
    await kube.create(
        CLUSTER_ROLE_BINDINGS,
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": SCRAPER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SCRAPER},
            "subjects": [{"kind": "ServiceAccount", "name": SCRAPER, "namespace": NAMESPACE}],
        },
    )


def request_token(server: str, admin_token: str, ca_path: Path) -> str:
    """A token of the scraper ServiceAccount, from the TokenRequest API."""
    body = json.dumps(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    ).encode()
    request = urllib.request.Request(
        f"{server}/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{SCRAPER}/token",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=str(ca_path))
    with urllib.request.urlopen(request, context=context, timeout=30) as answer:
        return str(json.loads(answer.read())["status"]["token"])


async def add_pools(kube: KubeClient, first: int, last: int, claims_per_pool: int) -> list[str]:
    """Pools `first`..`last - 1`, each a /24 with `claims_per_pool` claims; every tenth pool holds exactly its
    claims plus one, which then waits on the exhausted pool. Returns the claim names."""
    names: list[str] = []
    for index in range(first, last):
        pool = f"pool-{index}"
        exhausted = index % 10 == 0
        net = f"10.{index // 250}.{index % 250}"
        addresses = f"{net}.1-{net}.{claims_per_pool}" if exhausted else f"{net}.0/24"
        spec: dict[str, Any] = {"addresses": [addresses], "prefix": 24}
        body = {"apiVersion": POOLS.api_version, "kind": POOLS.kind, "metadata": {"name": pool}, "spec": spec}
        await kube.create(POOLS, body, NAMESPACE)
        for number in range(claims_per_pool + (1 if exhausted else 0)):
            name = f"{pool}-claim-{number}"
            claim = {
                "apiVersion": CLAIMS.api_version,
                "kind": "IPAddressClaim",
                "metadata": {"name": name},
                "spec": {"poolRef": {"apiGroup": IPAM_GROUP, "kind": POOLS.kind, "name": pool}},
            }
            await kube.create(CLAIMS, claim, NAMESPACE)
            if number < claims_per_pool:
                names.append(name)
    return names


def measure_scrapes(url: str, token: str, pid: int, scrapes: int) -> tuple[list[float], bytes, float | None]:
    """Scrape `scrapes` times in a row; (durations, last body, controller CPU seconds per scrape net of idling)."""
    durations: list[float] = []
    body = b""
    _, cpu_before = proc_figures(pid)
    loop_started = time.monotonic()
    for _ in range(scrapes):
        started = time.perf_counter()
        status, body = scrape(url, token)
        durations.append(time.perf_counter() - started)
        if status != 200:
            raise RuntimeError(f"scrape answered {status}: {body[:200]!r}")
    _, cpu_after = proc_figures(pid)
    elapsed = time.monotonic() - loop_started
    time.sleep(elapsed)  # the same span idle, to subtract what the controller spends anyway
    _, cpu_idle = proc_figures(pid)
    if cpu_before is None or cpu_after is None or cpu_idle is None:
        return durations, body, None
    scraping = (cpu_after - cpu_before) - (cpu_idle - cpu_after)
    return durations, body, max(scraping, 0.0) / scrapes


def figures_of(pools: int, claims: int, durations: list[float], body: bytes, cpu: float | None) -> ScrapeFigures:
    families = list(text_string_to_metric_families(body.decode()))
    ordered = sorted(durations[1:])
    return ScrapeFigures(
        pools=pools,
        claims=claims,
        size_bytes=len(body),
        samples=sum(len(f.samples) for f in families),
        families=len(families),
        first_seconds=durations[0],
        median_seconds=statistics.median(ordered),
        p95_seconds=ordered[max(0, round(0.95 * len(ordered)) - 1)],
        cpu_per_scrape=cpu,
    )


def report(rows: list[ScrapeFigures]) -> None:
    print("\npools  claims  bytes     samples  families  first scrape  median   p95      controller CPU/scrape")
    for row in rows:
        cpu = f"{row.cpu_per_scrape * 1000:.1f} ms" if row.cpu_per_scrape is not None else "-"
        print(
            f"{row.pools:<6} {row.claims:<7} {row.size_bytes:<9} {row.samples:<8} {row.families:<9} "
            f"{row.first_seconds * 1000:8.1f} ms  {row.median_seconds * 1000:5.1f} ms  "
            f"{row.p95_seconds * 1000:5.1f} ms  {cpu}"
        )
    if len(rows) >= 2 and rows[0].size_bytes:
        first, last = rows[0], rows[-1]
        print(
            f"\n{last.pools} pools vs {first.pools}: {last.size_bytes / first.size_bytes:.2f}x bytes, "
            f"{last.median_seconds / first.median_seconds:.2f}x median scrape time, "
            f"{(last.size_bytes - first.size_bytes) / max(1, last.pools - first.pools):.0f} bytes per added pool"
        )


def run(args: argparse.Namespace, work: Path) -> list[ScrapeFigures]:
    plane = LocalControlPlane(work / "plane", binaries_dir())
    log = work / "controller.log"
    process = None
    rows: list[ScrapeFigures] = []
    try:
        plane.start()
        state = plane.state
        assert state is not None
        kubeconfig = plane.kubeconfig_path
        asyncio.run(_with_kube(kubeconfig, install))
        token = request_token(state.server, state.admin_token, state.ca_path)
        port = free_port()
        argv = controller_command(
            kubeconfig,
            NAMESPACE,
            serving_flag(args.plain, port),
            "--health-probe-bind-address=0",
            "--log-level=warning",
        )
        process = start_process(argv, log)
        url = f"{'http' if args.plain else 'https'}://127.0.0.1:{port}/metrics"
        created = 0
        claims: list[str] = []
        for target in args.pools:
            claims += asyncio.run(_with_kube(kubeconfig, add_pools, created, target, args.claims_per_pool))
            created = target
            asyncio.run(_with_kube(kubeconfig, wait_fulfilled, CLAIMS, NAMESPACE, set(claims), args.timeout))
            time.sleep(3)  # let the pool reconciles that follow the last allocation write their status
            durations, body, cpu = measure_scrapes(url, token, process.pid, args.scrapes)
            rows.append(figures_of(target, len(claims), durations, body, cpu))
            print(
                f"[{target} pools] {len(body)} bytes, median {statistics.median(durations) * 1000:.1f} ms", flush=True
            )
    except Exception as error:
        print(f"error: {type(error).__name__}: {error}\n--- controller log (tail)\n{log_tail(log)}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        stop_process(process)
        plane.stop()
    return rows


def serving_flag(plain: bool, port: int) -> str:
    """Secure (HTTPS, TokenReview and SubjectAccessReview per scrape) by default; plain HTTP with --plain."""
    return f"--metrics-bind-address=127.0.0.1:{port}" if plain else f"--diagnostics-address=127.0.0.1:{port}"


async def _with_kube(kubeconfig: Path, action: Any, *args: Any) -> Any:
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        return await action(kube, *args)
    finally:
        await kube.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", default="1,100", help="increasing pool counts to measure at (default 1,100)")
    parser.add_argument("--claims-per-pool", type=int, default=3, help="fulfilled claims per pool (default 3)")
    parser.add_argument("--scrapes", type=int, default=50, help="scrapes per step (default 50)")
    parser.add_argument("--plain", action="store_true", help="serve and scrape plain HTTP (--metrics-bind-address)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds allowed to fulfil each step's claims")
    args = parser.parse_args(argv)
    args.pools = [int(p) for p in args.pools.split(",")]
    if args.pools != sorted(set(args.pools)) or args.pools[0] < 1 or args.pools[-1] > 2500:
        parser.error("--pools must be increasing counts between 1 and 2500")
    if not 1 <= args.claims_per_pool <= 200 or args.scrapes < 2:
        parser.error("need 1 <= --claims-per-pool <= 200 and --scrapes >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ipam-scrape-"))
    try:
        try:
            binaries_dir()
        except AssetError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        rows = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
