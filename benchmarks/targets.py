"""What `benchmarks/incluster_throughput.py` measures and on what: the controllers under test (ours, the Go
in-cluster provider), the pools and claims, and a session: one fresh control plane with a target's CRDs and pools,
and at most one controller process on it."""

from __future__ import annotations

import asyncio
import collections
import ctypes.util
import math
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from benchmarks._support import GoPeer, log_tail, start_process, stop_process
from benchmarks.report import RunResult
from ipam_provider.api.capi import IPAM_GROUP
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES, Resource
from ipam_provider.runtime.memory import ALLOCATOR_ENV
from tools.controller_command import controller_command
from tools.controlplane.assets import capi_crd_paths, capi_crd_paths_of, our_crd_paths
from tools.controlplane.cluster import ControlPlaneState, LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import load_versions

NAMESPACE = "bench"
WARMUP = "warmup"
IN_FLIGHT = 20
LIST_PAGE = 1000
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
    """One controller under test, the API it speaks, its command line (`verbose`: log at info level, which
    includes the caches-synced line) and the regular expression of that line."""

    name: str
    slug: str
    claim_version: str
    crd_paths: list[Path]
    argv: Callable[[Path, bool], list[str]]
    synced_line: str = ""
    env: dict[str, str] | None = None  # the process environment; None: the benchmark's own

    @property
    def claims(self) -> Resource:
        return Resource(IPAM_GROUP, self.claim_version, "ipaddressclaims", "IPAddressClaim", namespaced=True)

    @property
    def addresses(self) -> Resource:
        return Resource(IPAM_GROUP, self.claim_version, "ipaddresses", "IPAddress", namespaced=True)


def ours(workers: int, metrics_address: str = "0") -> Target:
    """Our controller; `metrics_address`: where it serves its metrics over plain HTTP ("0": not at all)."""

    def argv(kubeconfig: Path, verbose: bool) -> list[str]:
        return controller_command(
            kubeconfig,
            NAMESPACE,
            f"--metrics-bind-address={metrics_address}",
            "--health-probe-bind-address=0",
            f"--workers={workers}",
            f"--log-level={'info' if verbose else 'warning'}",
        )

    crds = [*capi_crd_paths(load_versions()), *our_crd_paths()]
    return Target("ours (python)", "ours", "v1beta2", crds, argv, r"caches synced", image_allocator())


def image_allocator() -> dict[str, str]:
    """The benchmark's environment with the image's allocator (jemalloc, ALLOCATOR_ENV), so that ours runs as the
    image runs it; exits, saying why, where libjemalloc2 is not installed."""
    if ctypes.util.find_library("jemalloc") is None:
        raise SystemExit("ours runs under the image's allocator: install libjemalloc2 (apt-get install libjemalloc2)")
    return {**os.environ, **ALLOCATOR_ENV}


def go_baseline(peer: GoPeer) -> Target:
    spec = GO_VERSIONS[peer.version]

    def argv(kubeconfig: Path, verbose: bool) -> list[str]:
        # --webhook-port=0 skips the pool webhooks, which would need cert-manager's serving certificate; it logs at
        # info level anyway
        return [
            str(peer.binary),
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            "--webhook-port=0",
            *spec.flags,
        ]

    crds = [*capi_crd_paths_of(spec.capi), *sorted(peer.pool_crds.glob("*.yaml"))]
    # controller-runtime logs "Starting workers" once a controller's caches have synced
    synced = r"Starting workers.*(?i:ipaddressclaim)"
    return Target(f"Go in-cluster {peer.version}", "go", spec.claim_version, crds, argv, synced_line=synced)


def limit_target(workers: int) -> Target:
    """The speed-of-light client: our CRDs, no process of its own."""
    crds = [*capi_crd_paths(load_versions()), *our_crd_paths()]
    return Target(f"limit (our writes, {workers} in flight)", "limit", "v1beta2", crds, lambda _k, _v: [])


def pool_layout(claims: int, pools: int) -> tuple[int, list[tuple[str, str]]]:
    """The smallest prefix (at most a /16) whose subnet holds each pool's share, and (name, CIDR) per pool."""
    share = math.ceil(claims / pools) + 2  # the network and broadcast addresses are never handed out
    prefix = 32 - max(1, math.ceil(math.log2(share)))
    if prefix < 16:
        raise SystemExit(f"{claims} claims over {pools} pools need more than a /16 per pool; add pools")
    return prefix, [(f"pool-{i}", f"10.{100 + i}.0.0/{prefix}") for i in range(pools)]


def claim_body(target: Target, name: str, pool: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": target.claims.api_version,
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"poolRef": {"apiGroup": IPAM_GROUP, "kind": POOLS.kind, "name": pool}},
    }


async def prepare(kubeconfig: Path, target: Target, claims: int, pools: int) -> None:
    """CRDs, the namespace, the pools (none when `pools` is 0) and the warm-up pool."""
    prefix, layout = pool_layout(claims, pools) if pools else (24, [])
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        await install_crds(kube, target.crd_paths)
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for name, cidr, bits in [*((n, c, prefix) for n, c in layout), (WARMUP, "10.99.0.0/24", 24)]:
            body = {"apiVersion": POOLS.api_version, "kind": POOLS.kind, "metadata": {"name": name}}
            await kube.create(POOLS, {**body, "spec": {"addresses": [cidr], "prefix": bits}}, NAMESPACE)
    finally:
        await kube.close()


async def check_addresses(kube: KubeClient, addresses: Resource, expected: int, result: RunResult) -> None:
    """Record addresses handed out twice within a pool, and an error unless there are `expected` IPAddresses
    (besides the warm-up claim's). Paged LISTs."""
    items, _ = await kube.list(addresses, NAMESPACE, limit=LIST_PAGE)
    by_pool: dict[str, list[str]] = collections.defaultdict(list)
    for address in items:
        by_pool[address["spec"]["poolRef"]["name"]].append(address["spec"]["address"])
    by_pool.pop(WARMUP, None)
    for pool, values in by_pool.items():
        twice = sorted(a for a, n in collections.Counter(values).items() if n > 1)
        if twice:
            result.duplicates[pool] = twice
    if (count := sum(map(len, by_pool.values()))) != expected and result.error is None:
        result.error = f"{count} IPAddresses for {expected} fulfilled claims"


def error_text(error: BaseException) -> str:
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"


class Session:
    """A fresh control plane in `work/label` with `target`'s CRDs, `pools` pools sized for `claims` (0: only the
    warm-up pool), and at most one controller process (logging to `work/label.log`). A context manager: everything
    stops on the way out."""

    def __init__(self, target: Target, binaries: Path, work: Path, label: str, claims: int, pools: int) -> None:
        self.target, self.claims, self.pools = target, claims, pools
        self.plane = LocalControlPlane(work / label, binaries)
        self.log = work / f"{label}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Session:
        try:
            self.plane.start()
            asyncio.run(prepare(self.plane.kubeconfig_path, self.target, self.claims, self.pools))
        except BaseException:
            self.plane.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop_controller()
        self.plane.stop()

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig_path

    @property
    def state(self) -> ControlPlaneState:
        assert self.plane.state is not None, "the control plane is not running"
        return self.plane.state

    def start_controller(self, verbose: bool = False) -> subprocess.Popen[bytes]:
        self.stop_controller()
        self.process = start_process(self.target.argv(self.kubeconfig, verbose), self.log, self.target.env)
        return self.process

    def stop_controller(self) -> None:
        stop_process(self.process)
        self.process = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def failure(self, error: BaseException) -> str:
        """The error, with the tail of the controller's log when there is one."""
        text = error_text(error)
        if self.log.exists():
            text += f"\n--- {self.log.name} (tail)\n{log_tail(self.log)}"
        return text
