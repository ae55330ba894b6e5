"""Soak: what a controller keeps while pools and claims come and go for a long time, ours against the Go in-cluster
provider v1.1.0 in the same run.

Each target runs on its own fresh local control plane (`benchmarks/targets.py`: Session), as a process: ours is
`python -m ipam_provider run --workers 8` serving its metrics over plain HTTP; the Go provider (built and cached by
hack/go-incluster/build.sh) serves its diagnostics (metrics) over plain HTTP (`--insecure-diagnostics`). By default
both run at once for `--minutes` (same wall clock, same noise); `--sequential` runs one after the other, each for
`--minutes`. After one warm-up claim, cycles run for `--minutes` from the first one (a cycle begun is finished):

- `pools` (pool churn, clusters that come and go): 20 new InClusterIPPools (`c<cycle>-pool-<i>`, new names, pool i
  always the /26 `10.200.<i>.0/26`) with 5 claims each; wait until all 100 claims are fulfilled (status.addressRef,
  seen on a watch); delete the claims; wait until they and their IPAddresses are gone; delete the pools; wait until
  they are gone;
- `fleet` (machine rollouts): the same 20 pools stay for the whole run; each cycle creates 100 claims (5 per pool),
  waits until they are fulfilled, deletes them and waits until they and their IPAddresses are gone.

After every cycle: the controller's RSS (VmRSS) and CPU seconds (utime + stime) from /proc, its number of metric
series (samples in one scrape; n/a when it serves none), the API objects left beyond those there before the first
cycle (claims, IPAddresses, pools, and ours's InClusterIPReservations), and the duplicates seen once the cycle's
claims were fulfilled (an address on two IPAddresses at once; the cycle's pools never overlap, so across the
namespace). The summary takes the growth from the end of the warm-up cycle (`--warmup-cycle`, 3) to the end of the
last: RSS MiB, KiB per thousand claims churned, CPU ms per churned claim, and the ratios ours ÷ Go.

`--heap DIR` runs ours under tracemalloc (`benchmarks/heap.py`) and takes a snapshot after the warm-up cycle and one
after the last, then prints the 25 sites of our code whose allocations grew most in between. Under tracemalloc,
RSS and CPU are not the controller's own figures.

Run from the repository root: `.venv/bin/python -m benchmarks.soak --help`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.incluster.naming import RESERVATIONS
from benchmarks._support import GoPeerUnavailable, build_go_peer
from benchmarks.fulfilment import current_version, has_address, wait_fulfilled, wait_until
from benchmarks.heap import Site, snapshot_path, top_sites
from benchmarks.metrics_scrape import free_port
from benchmarks.pools import cpu_of, is_gone, together
from benchmarks.targets import (
    GO_VERSIONS,
    IN_FLIGHT,
    NAMESPACE,
    POOLS,
    WARMUP,
    Session,
    Target,
    claim_body,
    error_text,
    go_baseline,
    ours,
)
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tools.controlplane.assets import AssetError, binaries_dir

Object = dict[str, Any]
POOL_COUNT = 20
CLAIMS_PER_POOL = 5
PREFIX = 26
GO_VERSION = "v1.1.0"
SNAPSHOT_TIMEOUT = 600.0


@dataclass(frozen=True)
class SoakPlan:
    scenario: str
    seconds: float
    warmup_cycle: int
    timeout: float
    heap: Path | None = None


@dataclass
class Cycle:
    """One cycle's figures, taken once it ended. `left`: API objects beyond those before the first cycle."""

    number: int
    seconds: float
    claims: int
    pools: int
    rss_kib: int | None
    cpu_seconds: float | None
    series: int | None
    left: dict[str, int | None]
    duplicates: int


@dataclass
class SoakResult:
    name: str
    slug: str
    scenario: str
    cycles: list[Cycle] = field(default_factory=list)
    heap_sites: list[Site] = field(default_factory=list)
    heap_total: tuple[int, int] | None = None  # traced bytes and blocks grown between the snapshots
    error: str | None = None


# -- probes ----------------------------------------------------------------------------------------------------


def rss_kib(pid: int) -> int | None:
    """VmRSS of a live process in KiB, from /proc."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def metric_series(url: str | None) -> int | None:
    """Samples in one scrape of `url` (a Prometheus text exposition); None without a URL or an answer."""
    if url is None:
        return None
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            text: str = answer.read().decode()
    except OSError:
        return None
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def pool_body(name: str, index: int) -> Object:
    spec = {"addresses": [f"10.200.{index}.0/{PREFIX}"], "prefix": PREFIX}
    return {"apiVersion": POOLS.api_version, "kind": POOLS.kind, "metadata": {"name": name}, "spec": spec}


def claim_plan(number: int, pools: list[str]) -> dict[str, str]:
    """The cycle's claims: name -> pool, CLAIMS_PER_POOL in each."""
    return {f"c{number}-{pool}-claim-{k}": pool for pool in pools for k in range(CLAIMS_PER_POOL)}


def duplicate_count(addresses: list[Object]) -> int:
    """Addresses that appear on more than one IPAddress (the warm-up pool's aside)."""
    values = [a["spec"]["address"] for a in addresses if a["spec"]["poolRef"]["name"] != WARMUP]
    return sum(n - 1 for n in collections.Counter(values).values() if n > 1)


# -- one controller --------------------------------------------------------------------------------------------


class SoakRun:
    """The cycles on one session: its controller running, `metrics`: where it serves its metrics (or None)."""

    def __init__(self, session: Session, kube: KubeClient, plan: SoakPlan, metrics: str | None) -> None:
        assert session.process is not None
        self.session, self.kube, self.plan, self.metrics = session, kube, plan, metrics
        self.target: Target = session.target
        self.pid = session.process.pid
        self.semaphore = asyncio.Semaphore(IN_FLIGHT)
        self.baseline: dict[str, int | None] = {}

    def resources(self) -> dict[str, Resource | None]:
        ours_only = RESERVATIONS if self.target.slug == "ours" else None
        return {
            "claims": self.target.claims,
            "addresses": self.target.addresses,
            "pools": POOLS,
            "reservations": ours_only,
        }

    async def counts(self) -> dict[str, int | None]:
        counts: dict[str, int | None] = {}
        for kind, resource in self.resources().items():
            namespace = None if resource is None or not resource.namespaced else NAMESPACE
            counts[kind] = None if resource is None else len((await self.kube.list(resource, namespace, limit=1000))[0])
        return counts

    def wait(
        self, resource: Resource, names: set[str], done: Callable[[Object | None], bool], version: str, what: str
    ) -> Coroutine[Any, Any, int]:
        return wait_until(
            self.kube, resource, NAMESPACE, names, done, self.plan.timeout, self.session.alive, what, version
        )

    async def each(self, names: list[str], action: Callable[[str], Coroutine[Any, Any, Any]]) -> None:
        """`action` on every name, IN_FLIGHT at a time."""

        async def one(name: str) -> None:
            async with self.semaphore:
                await action(name)

        async with asyncio.TaskGroup() as group:
            for name in names:
                group.create_task(one(name))

    async def create_pools(self, names: list[str]) -> None:
        await self.each(names, lambda name: self.kube.create(POOLS, pool_body(name, names.index(name)), NAMESPACE))

    async def delete_pools(self, names: list[str]) -> None:
        version = await current_version(self.kube, POOLS, NAMESPACE)
        remove = self.each(names, lambda name: self.kube.delete(POOLS, name, NAMESPACE))
        await together(
            "delete the pools",
            self.plan.timeout,
            self.wait(POOLS, set(names), is_gone, version, "pools still there"),
            remove,
        )

    async def churn_claims(self, number: int, pools: list[str]) -> int:
        """The cycle's claims created, fulfilled, deleted and gone with their IPAddresses; returns the duplicates
        seen while they were all fulfilled."""
        plan, claims = claim_plan(number, pools), self.target.claims
        version = await current_version(self.kube, claims, NAMESPACE)

        def create(name: str) -> Coroutine[Any, Any, Object]:
            return self.kube.create(claims, claim_body(self.target, name, plan[name]), NAMESPACE)

        fulfilled = self.wait(claims, set(plan), has_address, version, "claims unfulfilled")
        await together("claims fulfilled", self.plan.timeout, fulfilled, self.each(list(plan), create))
        addresses, _ = await self.kube.list(self.target.addresses, NAMESPACE, limit=1000)
        own = {a["metadata"]["name"] for a in addresses if a["spec"]["poolRef"]["name"] in pools}
        if len(own) != len(plan):
            raise RuntimeError(f"cycle {number}: {len(own)} IPAddresses for {len(plan)} fulfilled claims")
        versions = [await current_version(self.kube, r, NAMESPACE) for r in (claims, self.target.addresses)]
        await together(
            "claims and IPAddresses gone",
            self.plan.timeout,
            self.wait(claims, set(plan), is_gone, versions[0], "claims still there"),
            self.wait(self.target.addresses, own, is_gone, versions[1], "IPAddresses still there"),
            self.each(list(plan), lambda name: self.kube.delete(claims, name, NAMESPACE)),
        )
        return duplicate_count(addresses)

    async def cycle(self, number: int, fleet: list[str]) -> Cycle:
        started = time.monotonic()
        pools = fleet or [f"c{number}-pool-{i}" for i in range(POOL_COUNT)]
        if not fleet:
            await self.create_pools(pools)
        duplicates = await self.churn_claims(number, pools)
        if not fleet:
            await self.delete_pools(pools)
        counts = await self.counts()
        left = {k: None if v is None else v - (self.baseline[k] or 0) for k, v in counts.items()}
        series = await asyncio.to_thread(metric_series, self.metrics)
        seconds, churned = time.monotonic() - started, len(pools) * CLAIMS_PER_POOL
        return Cycle(
            number,
            seconds,
            churned,
            0 if fleet else len(pools),
            rss_kib(self.pid),
            cpu_of(self.pid),
            series,
            left,
            duplicates,
        )


async def snapshot(run: SoakRun, number: int) -> Path:
    """SIGUSR2 to the traced controller (benchmarks/heap.py), then wait for its snapshot file `number`."""
    assert run.plan.heap is not None
    path = snapshot_path(run.plan.heap, number)
    os.kill(run.pid, signal.SIGUSR2)
    deadline = time.monotonic() + SNAPSHOT_TIMEOUT
    while not path.exists():
        if not run.session.alive():
            raise RuntimeError("the controller exited while taking a heap snapshot")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no heap snapshot {path} after {SNAPSHOT_TIMEOUT:.0f} s")
        await asyncio.sleep(0.5)
    return path


def progress(result: SoakResult, cycle: Cycle) -> None:
    rss = "n/a" if cycle.rss_kib is None else f"{cycle.rss_kib / 1024:.1f} MiB"
    left = ",".join(f"{k}={v}" for k, v in cycle.left.items() if v is not None)
    print(
        f"[{result.slug}] cycle {cycle.number}: {cycle.seconds:.1f} s, RSS {rss}, CPU {cycle.cpu_seconds:.1f} s,"
        f" series {cycle.series if cycle.series is not None else 'n/a'}, left {left}, duplicates {cycle.duplicates}",
        flush=True,
    )


async def warm_up(run: SoakRun) -> None:
    """One claim on the warm-up pool, waited for (caches synced, workers running); `--timeout` allowed, since a
    traced controller starts slowly."""
    claims = run.target.claims
    await run.kube.create(claims, claim_body(run.target, WARMUP, WARMUP), NAMESPACE)
    await wait_fulfilled(run.kube, claims, NAMESPACE, {WARMUP}, run.plan.timeout, run.session.alive)


async def cycles(run: SoakRun, result: SoakResult) -> None:
    """Warm-up claim, the fleet's pools if any, the baseline counts, then cycles for the plan's seconds from the
    first one on (snapshots around them under --heap)."""
    await warm_up(run)
    fleet = [f"fleet-pool-{i}" for i in range(POOL_COUNT)] if run.plan.scenario == "fleet" else []
    if fleet:
        await run.create_pools(fleet)
    run.baseline = await run.counts()
    deadline = time.monotonic() + run.plan.seconds
    snapshots: list[Path] = []
    number = 0
    while time.monotonic() < deadline:
        number += 1
        result.cycles.append(cycle := await run.cycle(number, fleet))
        progress(result, cycle)
        if run.plan.heap is not None and number == run.plan.warmup_cycle:
            snapshots.append(await snapshot(run, 1))
    if run.plan.heap is not None and snapshots:
        snapshots.append(await snapshot(run, 2))
        result.heap_sites, *total = await asyncio.to_thread(top_sites, snapshots[0], snapshots[1])
        result.heap_total = (total[0], total[1])


async def soak(session: Session, plan: SoakPlan, metrics: str | None) -> SoakResult:
    """One target's soak on its running session; never raises except on cancellation."""
    result = SoakResult(session.target.name, session.target.slug, plan.scenario)
    kube = await KubeClient.from_kubeconfig(str(session.kubeconfig))
    try:
        await cycles(SoakRun(session, kube, plan, metrics), result)
    except Exception as error:
        result.error = session.failure(error)
        print(f"[{result.slug}] failed: {result.error.splitlines()[0]}", flush=True)
    finally:
        await kube.close()
    return result


# -- targets and sessions --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contender:
    """A target with where it serves its metrics."""

    target: Target
    metrics: str | None


def with_heap(target: Target, directory: Path) -> Target:
    """Ours run through benchmarks/heap.py (tracemalloc) instead of `python -m ipam_provider`."""
    inner = target.argv

    def argv(kubeconfig: Path, verbose: bool) -> list[str]:
        command = inner(kubeconfig, verbose)
        assert command[1:3] == ["-m", "ipam_provider"], command
        return [command[0], "-m", "benchmarks.heap", str(directory), *command[3:]]

    return dataclasses.replace(target, name=f"{target.name} under tracemalloc", argv=argv)


def go_contender() -> Contender:
    """The Go peer (built if needed) serving its diagnostics endpoint over plain HTTP."""
    target = go_baseline(build_go_peer(GO_VERSION, GO_VERSIONS[GO_VERSION].capi))
    address = f"127.0.0.1:{free_port()}"
    inner = target.argv

    def argv(kubeconfig: Path, verbose: bool) -> list[str]:
        flags = [f for f in inner(kubeconfig, verbose) if not f.startswith("--diagnostics-address")]
        return [*flags, f"--diagnostics-address={address}", "--insecure-diagnostics"]

    return Contender(dataclasses.replace(target, argv=argv), f"http://{address}/metrics")


def contenders(names: list[str], workers: int, heap: Path | None) -> list[Contender]:
    chosen: list[Contender] = []
    for name in names:
        if name == "ours":
            address = f"127.0.0.1:{free_port()}"
            target = ours(workers, address)
            chosen.append(Contender(with_heap(target, heap) if heap else target, f"http://{address}/metrics"))
        else:
            chosen.append(go_contender())
    return chosen


async def soak_all(sessions: list[tuple[Session, Contender]], plan: SoakPlan) -> list[SoakResult]:
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(soak(session, plan, c.metrics)) for session, c in sessions]
    return [task.result() for task in tasks]


def run_together(chosen: list[Contender], plan: SoakPlan, binaries: Path, work: Path) -> list[SoakResult]:
    """Every target on its own control plane, all soaking at once."""
    with contextlib.ExitStack() as stack:
        sessions: list[tuple[Session, Contender]] = []
        for contender in chosen:
            label = f"{contender.target.slug}-soak-{plan.scenario}"
            session = stack.enter_context(Session(contender.target, binaries, work, label, 0, 0))
            sessions.append((session, contender))
        for session, _ in sessions:
            session.start_controller()
        return asyncio.run(soak_all(sessions, plan))


def run_sequential(chosen: list[Contender], plan: SoakPlan, binaries: Path, work: Path) -> list[SoakResult]:
    return [result for contender in chosen for result in run_together([contender], plan, binaries, work)]


# -- summary and output ----------------------------------------------------------------------------------------

Figure = float | int | None
ROWS = (
    ("cycles", "cycles"),
    ("claims", "claims churned"),
    ("pools", "pools churned"),
    ("claims_after_warmup", "claims churned after warm-up"),
    ("rss_first_mib", "RSS MiB after cycle 1"),
    ("rss_warm_mib", "RSS MiB after warm-up"),
    ("rss_end_mib", "RSS MiB at the end"),
    ("rss_growth_mib", "RSS growth MiB (warm-up → end)"),
    ("growth_kib_per_1000", "RSS growth KiB / 1000 claims"),
    ("cpu_ms_per_claim", "CPU ms / churned claim"),
    ("series_warm", "metric series after warm-up"),
    ("series_end", "metric series at the end"),
    ("left_end", "API objects left at the end"),
    ("duplicates", "duplicates (all cycles)"),
)
RATIOS = ("rss_end_mib", "rss_growth_mib", "growth_kib_per_1000", "cpu_ms_per_claim")


def _mib(kib: int | None) -> float | None:
    return None if kib is None else kib / 1024


def summary(result: SoakResult, warmup: int) -> dict[str, Figure]:
    """The run's figures; the growth ones from the end of cycle `warmup` to the end of the last cycle."""
    done = result.cycles
    warm = next((c for c in done if c.number == warmup), None)
    end = done[-1] if done else None
    after = sum(c.claims for c in done if warm is not None and c.number > warm.number)
    figures: dict[str, Figure] = {
        "cycles": len(done),
        "claims": sum(c.claims for c in done),
        "pools": sum(c.pools for c in done),
        "claims_after_warmup": after if warm else None,
        "rss_first_mib": _mib(done[0].rss_kib) if done else None,
        "rss_warm_mib": _mib(warm.rss_kib) if warm else None,
        "rss_end_mib": _mib(end.rss_kib) if end else None,
        "series_warm": warm.series if warm else None,
        "series_end": end.series if end else None,
        "left_end": sum(v for v in end.left.values() if v is not None) if end else None,
        "duplicates": sum(c.duplicates for c in done),
    }
    if warm and end and after and warm.rss_kib is not None and end.rss_kib is not None:
        figures["rss_growth_mib"] = (end.rss_kib - warm.rss_kib) / 1024
        figures["growth_kib_per_1000"] = (end.rss_kib - warm.rss_kib) / after * 1000
    if warm and end and after and warm.cpu_seconds is not None and end.cpu_seconds is not None:
        figures["cpu_ms_per_claim"] = (end.cpu_seconds - warm.cpu_seconds) * 1000 / after
    return figures


def shown(value: Figure) -> str:
    if value is None:
        return "n/a"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def ratio(mine: Figure, theirs: Figure) -> str:
    if mine is None or theirs is None or not theirs:
        return "n/a"
    return f"{mine / theirs:.2f}x"


def print_table(results: list[SoakResult], warmup: int) -> None:
    figures = [summary(result, warmup) for result in results]
    by_slug = dict(zip((r.slug for r in results), figures, strict=True))
    pair = "ours" in by_slug and "go" in by_slug
    print(f"\n| figure | {' | '.join(r.name for r in results)} |{' ours ÷ Go |' if pair else ''}")
    print(f"|---|{'---|' * (len(results) + pair)}")
    for key, label in ROWS:
        cells = " | ".join(shown(f.get(key)) for f in figures)
        extra = f" {ratio(by_slug['ours'].get(key), by_slug['go'].get(key))} |" if pair and key in RATIOS else ""
        print(f"| {label} | {cells} |{extra or (' |' if pair else '')}")


def print_trajectory(result: SoakResult, warmup: int, points: int = 8) -> None:
    """RSS after a few cycles spread over the run (the first, the warm-up, the last among them)."""
    done = result.cycles
    if not done:
        return
    picks = {0, len(done) - 1, *(round(i * (len(done) - 1) / (points - 1)) for i in range(points))}
    picks |= {i for i, c in enumerate(done) if c.number == warmup}
    shown_ = ", ".join(f"{done[i].number}: {shown(_mib(done[i].rss_kib))}" for i in sorted(picks))
    print(f"{result.name}: RSS MiB after cycle {shown_}")


def print_heap(result: SoakResult, warmup: int) -> None:
    if result.heap_total is None:
        return
    last = result.cycles[-1].number
    print(f"\nheap of {result.name}: tracemalloc snapshots after cycle {warmup} and after cycle {last}")
    print("(RSS and CPU under tracemalloc are not representative of the controller untraced)")
    print(f"traced growth: {result.heap_total[0] / 1024:+,.1f} KiB in {result.heap_total[1]:+,} blocks")
    print("grouped by the first frame of ours from the allocation outwards; leaf: where the largest part was made")
    print("via: the chain of our callers most of it came through (who keeps it)")
    print("\n| # | size diff KiB | count diff | our line | leaf | via |\n|---|---|---|---|---|---|")
    for rank, site in enumerate(result.heap_sites, 1):
        cells = f"{site.size_diff / 1024:+,.1f} | {site.count_diff:+,} | {site.own} | {site.leaf} | {site.via}"
        print(f"| {rank} | {cells} |")


def report(results: list[SoakResult], args: argparse.Namespace, began: str) -> None:
    mode = "one after the other" if args.sequential else "at the same time, each on its own control plane"
    print(f"\nsoak `{args.scenario}`, {args.minutes:g} min per target, {mode}; growth from cycle {args.warmup_cycle}")
    print_table(results, args.warmup_cycle)
    print()
    for result in results:
        print_trajectory(result, args.warmup_cycle)
    for result in results:
        print_heap(result, args.warmup_cycle)
        if result.error:
            print(f"\n{result.name} failed: {result.error}")
    if args.json:
        write_json(args.json, results, args, began)
        print(f"\nper-cycle records written to {args.json}")


def site_json(site: Site) -> dict[str, Any]:
    return {
        "own": site.own,
        "size_diff": site.size_diff,
        "count_diff": site.count_diff,
        "leaf": site.leaf,
        "via": site.via,
    }


def write_json(path: Path, results: list[SoakResult], args: argparse.Namespace, began: str) -> None:
    options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    body = {
        "started": began,
        "options": options,
        "cpus": os.cpu_count(),
        "results": [
            {
                "name": r.name,
                "slug": r.slug,
                "summary": summary(r, args.warmup_cycle),
                "cycles": [dataclasses.asdict(c) for c in r.cycles],
                "heap_sites": [site_json(site) for site in r.heap_sites],
                "heap_total": r.heap_total,
                "error": r.error,
            }
            for r in results
        ],
    }
    path.write_text(json.dumps(body, indent=2) + "\n")


# -- command line ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scenario", choices=("pools", "fleet"), default="pools", help="pool churn or claim churn")
    parser.add_argument("--minutes", type=float, default=30.0, help="minutes of cycles per target (default 30)")
    parser.add_argument("--targets", default="ours,go", help="comma-separated: ours, go (default both)")
    parser.add_argument("--sequential", action="store_true", help="one target after the other, not at once")
    parser.add_argument("--warmup-cycle", type=int, default=3, help="growth is taken from the end of this cycle")
    parser.add_argument("--workers", type=int, default=8, help="our controller's --workers (default 8)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed to each wait (default 300)")
    parser.add_argument("--json", type=Path, help="write the summary and the per-cycle records to this file")
    parser.add_argument("--heap", type=Path, help="run ours under tracemalloc, snapshots into this directory")
    parser.add_argument("--keep-logs", type=Path, help="copy the controllers' logs into this directory")
    args = parser.parse_args(argv)
    args.target_list = [name.strip() for name in args.targets.split(",") if name.strip()]
    if (
        not args.target_list
        or set(args.target_list) - {"ours", "go"}
        or len(set(args.target_list)) < len(args.target_list)
    ):
        parser.error("--targets: ours, go or both, comma-separated")
    if args.minutes <= 0 or args.warmup_cycle < 1 or args.timeout <= 0:
        parser.error("need --minutes > 0, --warmup-cycle >= 1 and --timeout > 0")
    if args.heap is not None and "ours" not in args.target_list:
        parser.error("--heap traces ours: add it to --targets")
    return args


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def measure(args: argparse.Namespace, work: Path) -> list[SoakResult] | None:
    """The soak of every target, or None when a needed piece is missing (said on stderr)."""
    heap = args.heap.resolve() if args.heap is not None else None
    if heap is not None:
        heap.mkdir(parents=True, exist_ok=True)
        for stale in heap.glob("heap-*.snapshot"):
            stale.unlink()
    plan = SoakPlan(args.scenario, args.minutes * 60, args.warmup_cycle, args.timeout, heap)
    try:
        binaries = binaries_dir()
        chosen = contenders(args.target_list, args.workers, heap)
    except (AssetError, GoPeerUnavailable) as error:
        print(f"error: {error_text(error)}", file=sys.stderr)
        return None
    run = run_sequential if args.sequential else run_together
    return run(chosen, plan, binaries, work)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    began = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    work = Path(tempfile.mkdtemp(prefix="ipam-soak-"))
    try:
        results = measure(args, work)
    except KeyboardInterrupt:
        print("\ninterrupted: control planes and controllers stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in work.glob("*.log"):
                shutil.copy(log, args.keep_logs / log.name)
        shutil.rmtree(work, ignore_errors=True)
    if results is None:
        return 1
    report(results, args, began)
    mine = [r for r in results if r.slug == "ours"]
    return 0 if all(r.error is None for r in mine) else 1


if __name__ == "__main__":
    sys.exit(main())
