"""One chaos run for one backend, from a fresh control plane to the check against the truth.

1. A dedicated local control plane (etcd and kube-apiserver as separate processes, kube-apiserver without a watch
   cache so that an etcd compaction makes resumed watches expire), the CRDs, a namespace, and the backend's system
   and manifests (`ChaosBackend.start()`, `.manifests()`).
2. Two controller replicas with `--leader-elect` (short lease), a short repair interval and grace period, talking
   to the API server through a relay whose connections the runner can cut (`link`).
3. The workload (`workload`) and the faults (`faults`), concurrently; a stand-in for the garbage collector.
4. Faults stop; the runner waits (bounded) until every live claim is fulfilled and every deleted one gone, then
   for the repair loop (at least one interval plus the grace period), polling the checks (`checks`) until they
   are clean or the bound is reached; the last check is the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from benchmarks.chaos import loader
from benchmarks.chaos.backends import ChaosBackend
from benchmarks.chaos.checks import Findings, check
from benchmarks.chaos.controllers import Replicas, supported_flags
from benchmarks.chaos.faults import Injector, fault_plan
from benchmarks.chaos.link import Link
from benchmarks.chaos.report import BackendResult
from benchmarks.chaos.workload import TRANSIENT, PoolTarget, Workload, retried
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import NAMESPACES
from tools.controlplane.assets import binaries_dir, capi_crd_paths, our_crd_paths
from tools.controlplane.cluster import PKI_FILES, LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import load_versions

log = structlog.get_logger(__name__)
NAMESPACE = "chaos"
APISERVER_FLAGS = ("--watch-cache=false",)


@dataclass(frozen=True)
class Options:
    operations: int = 2000
    pools: int = 4
    seed: int = 1
    rate: float = 5.0  # operations per second
    replicas: int = 2
    repair_interval: float = 5.0
    repair_grace: float = 10.0
    settle_timeout: float = 300.0  # for every live claim to be fulfilled once faults stop
    repair_margin: float = 180.0  # beyond one repair interval + grace, for the checks to come out clean
    keep: Path | None = None  # keep the run's directory (logs) under this directory

    @property
    def population(self) -> int:
        """Live claims to keep: about a tenth of the operations, at least 4 a pool."""
        return max(4 * self.pools, min(self.operations // 10, 25 * self.pools))

    def controller_flags(self) -> list[str]:
        return [
            f"--repair-interval={self.repair_interval:g}s",
            f"--repair-grace-period={self.repair_grace:g}s",
            "--workers=4",
        ]


def short(seed: int = 1) -> Options:
    """The short run of `make test`: a few hundred operations, every fault kind at least once."""
    return Options(operations=300, pools=4, seed=seed, rate=5.0)


async def run_backend(name: str, options: Options) -> BackendResult:
    """Run the chaos scenario for backend `name`; never raises (a failure is the result's `error`)."""
    result = BackendResult(name, options.seed)
    workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{name}-"))
    plane: LocalControlPlane | None = None
    try:
        binaries = await asyncio.to_thread(binaries_dir)
        plane = LocalControlPlane(workdir / "plane", binaries, apiserver_flags=APISERVER_FLAGS)
        await asyncio.to_thread(plane.start)
        await _run_on(plane, name, options, result, workdir)
    except Exception as error:
        log.exception("chaos run failed", backend=name)
        result.error = f"{type(error).__name__}: {error}"
    finally:
        if plane is not None:
            await asyncio.to_thread(plane.stop, remove=False)
        if options.keep is not None:
            options.keep.mkdir(parents=True, exist_ok=True)
            shutil.copytree(workdir, options.keep / workdir.name, ignore=shutil.ignore_patterns("etcd-data"))
            result.notes.append(f"logs kept in {options.keep / workdir.name}")
        shutil.rmtree(workdir, ignore_errors=True)
    return result


async def _run_on(plane: LocalControlPlane, name: str, options: Options, result: BackendResult, workdir: Path) -> None:
    assert plane.state is not None
    crds = [*capi_crd_paths(load_versions()), *our_crd_paths()]
    kube = await KubeClient.from_kubeconfig(str(plane.kubeconfig_path))
    context = {"kubeconfig": plane.kubeconfig_path, "workdir": workdir, "seed": options.seed, "namespace": NAMESPACE}
    backend = loader.load(name, **context)
    pki = plane.directory / "pki"
    link = Link(plane.state.server, pki / PKI_FILES["ca"], pki / PKI_FILES["cert"], pki / PKI_FILES["key"])
    replicas: Replicas | None = None
    try:
        await install_crds(kube, crds)
        # It holds the InfobloxInstance's Secret: lent to cluster-scoped objects (ipam_provider/backend/tenancy.py).
        labels = {"ipam.cluster.x-k8s.io/allow-cluster-scoped-secret-refs": "true"}
        await kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE, "labels": labels}})
        await backend.start()
        pools = await _apply_manifests(kube, backend, crds, options.pools)
        await link.start()
        flags, refused = supported_flags(options.controller_flags())
        if refused:
            result.notes.append(f"this controller does not accept {' '.join(refused)}: run without them")
        replicas = Replicas(_relay_kubeconfig(plane, link, workdir), NAMESPACE, workdir, options.replicas, flags)
        replicas.start()
        if await replicas.leader(kube, timeout=120) is None:
            raise RuntimeError("no controller replica became leader within 120 s")
        await _exercise(plane, link, replicas, backend, kube, pools, options, result)
        result.notes.append(f"controller replicas exited unplanned {replicas.unplanned_exits} times (restarted)")
    finally:
        if replicas is not None:
            await replicas.stop()
        await link.stop()
        with contextlib.suppress(Exception):
            await backend.stop()
        await kube.close()


async def _apply_manifests(
    kube: KubeClient, backend: ChaosBackend, crd_paths: Sequence[Path], count: int
) -> list[PoolTarget]:
    """Create the backend's objects; answer the pools claims may name."""
    resources = loader.resources_of(crd_paths)
    manifests = backend.manifests(NAMESPACE, count)
    groups: dict[tuple[str, str], str] = {}
    for obj in manifests:
        resource = resources[(obj["apiVersion"], obj["kind"])]
        namespace = (obj["metadata"].get("namespace") or NAMESPACE) if resource.namespaced else None
        await kube.create(resource, obj, namespace)
        groups[(obj["kind"], obj["metadata"]["name"])] = resource.group
    pools = []
    for ref in backend.pool_refs(NAMESPACE, count):
        kind, *_, pool_name = ref.split("/")
        pools.append(PoolTarget(groups[(kind, pool_name)], kind, pool_name, ref))
    return pools


def _relay_kubeconfig(plane: LocalControlPlane, link: Link, workdir: Path) -> Path:
    """The admin kubeconfig, pointed at the relay."""
    config = json.loads(plane.kubeconfig_path.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{link.port}"
    path = workdir / "controller.kubeconfig"
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


async def _exercise(
    plane: LocalControlPlane,
    link: Link,
    replicas: Replicas,
    backend: ChaosBackend,
    kube: KubeClient,
    pools: list[PoolTarget],
    options: Options,
    result: BackendResult,
) -> None:
    seed = options.seed
    workload = Workload(
        kube,
        NAMESPACE,
        pools,
        random.Random(f"{seed}/workload"),
        operations=options.operations,
        rate=options.rate,
        population=options.population,
    )
    faults_rng = random.Random(f"{seed}/faults")
    injector = Injector(plane, link, replicas, workload, backend, kube, NAMESPACE, faults_rng)
    plan = fault_plan(tuple(backend.fault_kinds), options.operations, faults_rng)
    result.fault_kinds = sorted(set(plan), key=plan.index)
    collector = asyncio.create_task(workload.garbage_collector())
    started = time.monotonic()
    try:
        await asyncio.gather(workload.run(), injector.run(plan, options.operations / options.rate))
        result.faults = dict(injector.injected)
        result.allocations, result.releases = workload.created, workload.deleted
        result.operations = workload.done
        collected = f"{workload.force_deleted} claims force-deleted, {workload.collected} IPAddresses collected"
        result.notes.append(collected)
        findings = await _settle(kube, backend, pools, replicas, options)
    finally:
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
    result.seconds = time.monotonic() - started
    result.checks, result.details = findings.counts(), dict(findings.details)
    result.notes += injector.notes[:10]


async def _settle(
    kube: KubeClient, backend: ChaosBackend, pools: list[PoolTarget], replicas: Replicas, options: Options
) -> Findings:
    """Wait (bounded) for every live claim to be fulfilled, then for the repair loop to have run at least one
    interval plus the grace period, polling the checks; answers the last findings."""
    deadline = time.monotonic() + options.settle_timeout
    findings = await _checked(kube, backend, pools)
    while (findings.unfulfilled or not replicas.all_alive()) and time.monotonic() < deadline:
        await asyncio.sleep(2)
        findings = await _checked(kube, backend, pools)
    earliest = time.monotonic() + options.repair_interval + options.repair_grace
    deadline = earliest + options.repair_margin
    while time.monotonic() < earliest or (not findings.clean and time.monotonic() < deadline):
        await asyncio.sleep(2)
        findings = await _checked(kube, backend, pools)
    return findings


async def _checked(kube: KubeClient, backend: ChaosBackend, pools: list[PoolTarget]) -> Findings:
    async def attempt() -> Findings:
        return await check(kube, NAMESPACE, backend, pools)

    try:
        return await retried(attempt, "check against the truth", timeout=120)
    except (ApiError, *TRANSIENT) as error:
        raise RuntimeError(f"cannot read the truth: {error}") from error
