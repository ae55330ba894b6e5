"""End-to-end throughput of our controller against the Go in-cluster provider and a speed-of-light client, measured
in the same run.

For each: a fresh local control plane (etcd + kube-apiserver, `tools.controlplane`), the CRDs it speaks, P
InClusterIPPools in namespace `bench`. A controller runs as a subprocess, gets one warm-up claim (caches synced,
workers running), then N claims created at once (20 in flight) across the pools; measured: the time until every
claim has `status.addressRef`, claims/second, the API requests the controller made per allocation
(apiserver_request_total before/after, less the benchmark's own requests and the API server's upkeep), its peak
RSS (VmHWM) and CPU time from /proc, and addresses handed out twice within a pool.

Ours runs `python -m ipam_provider run --workers 8` against CAPI v1beta2 CRDs (hack/versions.env). The Go baseline
is sigs.k8s.io/cluster-api-ipam-provider-in-cluster v1.1.0 (IPAM v1beta2, CAPI v1.11.7 CRDs) or, with
`--go-version v1.0.3`, v1.0.3 (v1beta1, CAPI v1.10.10 CRDs), built once per version into a cache outside the work
tree by hack/go-incluster/build.sh. The limit (benchmarks/speed_of_light.py) makes our controller's writes for the
N pre-created claims, `--workers` at a time, and nothing else; its clock covers only those writes. None of the
three runs at the same time as another.

Run from the repository root: `.venv/bin/python benchmarks/incluster_throughput.py [--claims 300] [--pools 3]
[--go-version v1.1.0] [--skip-go] [--skip-limit]`. Exit status: 0 when our run succeeded (a baseline's failure is
reported, not fatal), 1 when our run failed, 130 when interrupted. Every process started is stopped on the way
out, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import math
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import (
    GoPeer,
    GoPeerUnavailable,
    RequestCounts,
    RunResult,
    build_go_peer,
    log_tail,
    our_controller_argv,
    print_report,
    proc_figures,
    request_delta,
    scrape_requests,
    settled_counts,
    start_process,
    stop_process,
)
from benchmarks.fulfilment import wait_fulfilled
from benchmarks.speed_of_light import write_all
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.resources import IPAM_GROUP, NAMESPACES, Resource
from tools.controlplane.assets import AssetError, binaries_dir, capi_crd_paths, capi_crd_paths_of, our_crd_paths
from tools.controlplane.cluster import LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import load_versions

NAMESPACE = "bench"
WARMUP = "warmup"
IN_FLIGHT = 20
POOLS = Resource(IPAM_GROUP, "v1alpha2", "inclusterippools", "InClusterIPPool", namespaced=True)


@dataclass(frozen=True)
class GoVersion:
    """What one release of the Go in-cluster provider needs: CAPI CRDs, the claim API version, its flags."""

    capi: str
    claim_version: str
    flags: tuple[str, ...]


GO_VERSIONS = {
    "v1.1.0": GoVersion("v1.11.7", "v1beta2", ("--diagnostics-address=0", "--health-probe-bind-address=0")),
    "v1.0.3": GoVersion("v1.10.10", "v1beta1", ("--metrics-bind-address=0", "--health-probe-bind-address=0")),
}


@dataclass(frozen=True)
class Target:
    """One controller under test and the API it speaks."""

    name: str
    slug: str
    claim_version: str
    crd_paths: list[Path]
    argv: Callable[[Path], list[str]]

    @property
    def claims(self) -> Resource:
        return Resource(IPAM_GROUP, self.claim_version, "ipaddressclaims", "IPAddressClaim", namespaced=True)

    @property
    def addresses(self) -> Resource:
        return Resource(IPAM_GROUP, self.claim_version, "ipaddresses", "IPAddress", namespaced=True)


def ours(workers: int) -> Target:
    def argv(kubeconfig: Path) -> list[str]:
        return our_controller_argv(
            kubeconfig,
            NAMESPACE,
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            f"--workers={workers}",
            "--log-level=warning",
        )

    return Target("ours (python)", "ours", "v1beta2", [*capi_crd_paths(load_versions()), *our_crd_paths()], argv)


def go_baseline(peer: GoPeer) -> Target:
    spec = GO_VERSIONS[peer.version]

    def argv(kubeconfig: Path) -> list[str]:
        # --webhook-port=0 skips the pool webhooks, which would need cert-manager's serving certificate
        return [
            str(peer.binary),
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            "--webhook-port=0",
            *spec.flags,
        ]

    crds = [*capi_crd_paths_of(spec.capi), *sorted(peer.pool_crds.glob("*.yaml"))]
    return Target(f"Go in-cluster {peer.version}", "go", spec.claim_version, crds, argv)


def pool_layout(claims: int, pools: int) -> tuple[int, list[tuple[str, str]]]:
    """The smallest prefix (at most a /16) whose subnet holds each pool's share, and (name, CIDR) per pool."""
    share = math.ceil(claims / pools) + 2  # the network and broadcast addresses are never handed out
    prefix = 32 - max(1, math.ceil(math.log2(share)))
    if prefix < 16:
        raise SystemExit(f"{claims} claims over {pools} pools need more than a /16 per pool; add pools")
    return prefix, [(f"pool-{i}", f"10.{100 + i}.0.0/{prefix}") for i in range(pools)]


def claim_body(target: Target, name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": target.claims.api_version,
        "kind": "IPAddressClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"apiGroup": IPAM_GROUP, "kind": POOLS.kind, "name": pool}},
    }


async def prepare(kubeconfig: Path, target: Target, claims: int, pools: int) -> None:
    """CRDs, the namespace, the pools and the warm-up pool."""
    prefix, layout = pool_layout(claims, pools)
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        await install_crds(kube, target.crd_paths)
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for name, cidr, bits in [*((n, c, prefix) for n, c in layout), (WARMUP, "10.99.0.0/24", 24)]:
            body = {"apiVersion": POOLS.api_version, "kind": POOLS.kind, "metadata": {"name": name}}
            await kube.create(POOLS, {**body, "spec": {"addresses": [cidr], "prefix": bits}}, NAMESPACE)
    finally:
        await kube.close()


async def check_addresses(kube: KubeClient, addresses: Resource, claims: int, result: RunResult) -> None:
    """Record addresses handed out twice within a pool, and an error unless there is one IPAddress per claim."""
    items, _ = await kube.list(addresses, NAMESPACE, limit=100_000)
    by_pool: dict[str, list[str]] = collections.defaultdict(list)
    for address in items:
        by_pool[address["spec"]["poolRef"]["name"]].append(address["spec"]["address"])
    by_pool.pop(WARMUP, None)
    for pool, values in by_pool.items():
        twice = sorted(a for a, n in collections.Counter(values).items() if n > 1)
        if twice:
            result.duplicates[pool] = twice
    if (count := sum(map(len, by_pool.values()))) != claims:
        result.error = f"{count} IPAddresses for {claims} fulfilled claims"


async def measure(
    plane: LocalControlPlane, target: Target, args: argparse.Namespace, result: RunResult, alive: Callable[[], bool]
) -> None:
    state = plane.state
    assert state is not None
    kube = await KubeClient.from_kubeconfig(str(plane.kubeconfig_path))
    try:
        await kube.create(target.claims, claim_body(target, WARMUP, WARMUP), NAMESPACE)
        await wait_fulfilled(kube, target.claims, NAMESPACE, {WARMUP}, 90, alive)
        _, layout = pool_layout(args.claims, args.pools)
        work = [(f"claim-{i}", layout[i % len(layout)][0]) for i in range(args.claims)]
        semaphore = asyncio.Semaphore(IN_FLIGHT)

        async def create(name: str, pool: str) -> None:
            async with semaphore:
                await kube.create(target.claims, claim_body(target, name, pool), NAMESPACE)

        before = await asyncio.to_thread(scrape_requests, state.server, state.admin_token, state.ca_path)
        started = time.monotonic()
        async with asyncio.TaskGroup() as group:  # a failure anywhere cancels the rest
            waiter = group.create_task(
                wait_fulfilled(kube, target.claims, NAMESPACE, {n for n, _ in work}, args.timeout, alive)
            )
            for name, pool in work:
                group.create_task(create(name, pool))
        lists = waiter.result()
        result.seconds = time.monotonic() - started
        after = await settled_counts(state.server, state.admin_token, state.ca_path)
        claims_key = f"{IPAM_GROUP}/{target.claims.plural}"
        driver: RequestCounts = collections.Counter({("POST", claims_key): args.claims, ("LIST", claims_key): lists})
        result.requests = request_delta(before, after, driver)
        await check_addresses(kube, target.addresses, args.claims, result)
    finally:
        await kube.close()


async def measure_limit(plane: LocalControlPlane, target: Target, args: argparse.Namespace, result: RunResult) -> None:
    """Create the claims, then time benchmarks/speed_of_light.py's writes for all of them (its CPU: this process's)."""
    state = plane.state
    assert state is not None
    kube = await KubeClient.from_kubeconfig(str(plane.kubeconfig_path))
    try:
        _, layout = pool_layout(args.claims, args.pools)
        semaphore = asyncio.Semaphore(IN_FLIGHT)

        async def create(index: int) -> dict[str, Any]:
            async with semaphore:
                body = claim_body(target, f"claim-{index}", layout[index % len(layout)][0])
                return await kube.create(target.claims, body, NAMESPACE)

        claims = await asyncio.gather(*(create(i) for i in range(args.claims)))
        pools, _ = await kube.list(POOLS, NAMESPACE)
        before = await asyncio.to_thread(scrape_requests, state.server, state.admin_token, state.ca_path)
        started, cpu = time.monotonic(), time.process_time()
        await write_all(kube, list(claims), {p["metadata"]["name"]: p for p in pools}, args.workers)
        result.seconds, result.cpu_seconds = time.monotonic() - started, time.process_time() - cpu
        after = await settled_counts(state.server, state.admin_token, state.ca_path)
        result.requests = request_delta(before, after, collections.Counter())
        await check_addresses(kube, target.addresses, args.claims, result)
    finally:
        await kube.close()


def run_limit(target: Target, binaries: Path, work: Path, args: argparse.Namespace) -> RunResult:
    """The speed-of-light client on its own control plane with our CRDs; never raises except on interruption."""
    result = RunResult(f"limit (our writes, {args.workers} in flight)", args.claims, args.pools)
    plane = LocalControlPlane(work / "limit", binaries)
    try:
        plane.start()
        asyncio.run(prepare(plane.kubeconfig_path, target, args.claims, args.pools))
        asyncio.run(measure_limit(plane, target, args, result))
        print(f"[limit] {args.claims} claims written in {result.seconds:.1f} s", flush=True)
    except Exception as error:
        while isinstance(error, ExceptionGroup) and error.exceptions:
            error = error.exceptions[0]
        result.error = f"{type(error).__name__}: {error}"
    finally:
        plane.stop()
    return result


def run_one(target: Target, binaries: Path, work: Path, args: argparse.Namespace) -> RunResult:
    """Measure one controller on its own control plane; never raises except on interruption."""
    result = RunResult(target.name, args.claims, args.pools)
    plane = LocalControlPlane(work / target.slug, binaries)
    log = work / f"{target.slug}-controller.log"
    process = None
    try:
        started = time.monotonic()
        plane.start()
        asyncio.run(prepare(plane.kubeconfig_path, target, args.claims, args.pools))
        print(f"[{target.name}] control plane and CRDs ready in {time.monotonic() - started:.1f} s", flush=True)
        process = start_process(target.argv(plane.kubeconfig_path), log)
        alive = process.poll
        asyncio.run(measure(plane, target, args, result, lambda: alive() is None))
        result.peak_rss_kib, result.cpu_seconds = proc_figures(process.pid)
        print(f"[{target.name}] {args.claims} claims fulfilled in {result.seconds:.1f} s", flush=True)
    except Exception as error:
        while isinstance(error, ExceptionGroup) and error.exceptions:
            error = error.exceptions[0]
        result.error = f"{type(error).__name__}: {error}\n--- {log.name} (tail)\n{log_tail(log)}"
    finally:
        stop_process(process)
        plane.stop()
    return result


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=300, help="claims created at once (default 300)")
    parser.add_argument("--pools", type=int, default=3, help="pools they are spread over (default 3)")
    parser.add_argument("--workers", type=int, default=8, help="our controller's --workers (default 8)")
    parser.add_argument("--timeout", type=float, default=150, help="seconds allowed per run to fulfil all claims")
    parser.add_argument("--go-version", choices=sorted(GO_VERSIONS), default="v1.1.0", help="Go baseline release")
    parser.add_argument("--skip-go", action="store_true", help="do not measure the Go provider")
    parser.add_argument("--skip-limit", action="store_true", help="do not measure the speed-of-light client")
    parser.add_argument("--keep-logs", type=Path, help="copy the controllers' logs into this directory")
    args = parser.parse_args(argv)
    if args.claims < 1 or not 1 <= args.pools <= 100:
        parser.error("need --claims >= 1 and 1 <= --pools <= 100")
    pool_layout(args.claims, args.pools)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    wall = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ipam-bench-"))
    results: list[RunResult] = []
    try:
        peer: GoPeer | None = None
        go_problem = "skipped (--skip-go)" if args.skip_go else None
        if not args.skip_go:
            try:
                peer = build_go_peer(args.go_version, GO_VERSIONS[args.go_version].capi)
                print(f"Go peer ready in {peer.build_seconds:.1f} s: {peer.binary}", flush=True)
            except GoPeerUnavailable as error:
                go_problem = str(error)
        try:
            binaries, target = binaries_dir(), ours(args.workers)
        except AssetError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        results.append(run_one(target, binaries, work, args))
        if peer is not None:
            try:
                results.append(run_one(go_baseline(peer), binaries, work, args))
            except AssetError as error:
                go_problem = str(error)
        if not args.skip_limit:
            results.append(run_limit(target, binaries, work, args))
    except KeyboardInterrupt:
        print("\ninterrupted: control planes and controllers stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in work.glob("*.log"):
                shutil.copy(log, args.keep_logs / log.name)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.claims} claims across {args.pools} pools, our controller with --workers {args.workers}")
    print_report(results)
    if go_problem:
        print(f"\nGo baseline not measured: {go_problem}")
    print(f"\nbenchmark wall time {time.monotonic() - wall:.0f} s")
    return 0 if results and results[0].error is None else 1


if __name__ == "__main__":
    sys.exit(main())
