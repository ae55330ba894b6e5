"""Our controller against the Go in-cluster provider and a speed-of-light client, every scenario in the same run.

Scenarios (`--scenario`, comma-separated or repeated; `all` = every one at the issue's sizes):
- throughput (`benchmarks/throughput.py`): N claims created at once (20 in flight) over P pools (`--claims`/`--pools`
  or `--size N/P`, repeatable); claims/s, CPU, peak RSS, API requests per claim, duplicate addresses;
- steady (`benchmarks/latency.py`): `--rate` claims/s for `--duration` s on one pool; p50/p95/p99/max latency
  from a claim's create to its fulfilment seen on a watch;
- restart (`benchmarks/restart.py`): the controller restarted after the throughput run of `--restart-addresses`
  claims on one pool, then one new claim; seconds from process start to caches synced and to its fulfilment;
- pools (`benchmarks/pools.py`): N pools (`--pool-counts`, each size its own runs) of `--claims-per-pool` claims
  created at once on a running controller; seconds and CPU until settled, CPU of the 10 s after, one more pool
  then (fulfilled, and counted in its status), idle CPU, one pool deleted, peak RSS; for ours at the first size,
  API requests of one repair pass and CPU of one metrics scrape.

Each target runs on its own fresh local control plane (etcd + kube-apiserver, `tools.controlplane`) with the CRDs
it speaks, never two at once: ours (`python -m ipam_provider run --workers 8`, CAPI v1beta2 CRDs), the Go provider
(sigs.k8s.io/cluster-api-ipam-provider-in-cluster v1.1.0, or v1.0.3 with `--go-version`, built once per version by
hack/go-incluster/build.sh) and the limit (benchmarks/speed_of_light.py: our controller's writes and nothing else).

Run from the repository root: `.venv/bin/python benchmarks/incluster_throughput.py --help`. Exit status: 0 when
every run of ours succeeded (a baseline's failure is reported, not fatal), 1 otherwise, 130 when interrupted.
Every process started is stopped on the way out, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import GoPeer, GoPeerUnavailable, build_go_peer
from benchmarks.latency import measure_steady
from benchmarks.metrics_scrape import free_port
from benchmarks.pools import MAX_POOLS, PoolsPlan, measure_limit_pools, measure_pools, pools_timeout
from benchmarks.report import (
    POOLS_COLUMNS,
    RESTART_COLUMNS,
    STEADY_COLUMNS,
    THROUGHPUT_COLUMNS,
    PoolsResult,
    RestartResult,
    RunResult,
    SteadyResult,
    ThroughputResult,
    print_scenario,
    write_json,
)
from benchmarks.restart import WHEN, measure_restart
from benchmarks.targets import GO_VERSIONS, Session, Target, error_text, go_baseline, limit_target, ours, pool_layout
from benchmarks.throughput import measure_controller, measure_limit
from tools.controlplane.assets import AssetError, binaries_dir

SCENARIOS = ("throughput", "steady", "restart", "pools")
ISSUE_SIZES = [(300, 3), (2000, 1), (10_000, 1)]
Groups = list[tuple[str, list[RunResult]]]


def auto_timeout(args: argparse.Namespace, claims: int) -> float:
    """--timeout, else 150 s or 0.2 s per claim, whichever is longer (the Go peer's allocations slow down with the
    number of addresses a pool has handed out)."""
    return float(args.timeout) if args.timeout else max(150.0, 0.2 * claims)


def run_sizes(
    targets: list[Target], binaries: Path, work: Path, args: argparse.Namespace, claims: int, pools: int
) -> tuple[list[ThroughputResult], list[RestartResult]]:
    """The throughput rows of one size, and the restart rows when this is the restart scenario's size."""
    rows: list[ThroughputResult] = []
    restarts: list[RestartResult] = []
    restart = "restart" in args.scenarios and (claims, pools) == (args.restart_addresses, 1)
    for target in targets:
        started = time.monotonic()
        try:
            with Session(target, binaries, work, f"{target.slug}-{claims}x{pools}", claims, pools) as session:
                print(f"[{target.name}] control plane ready in {time.monotonic() - started:.1f} s", flush=True)
                if target.slug == "limit":
                    rows.append(measure_limit(session, claims, pools, args.workers))
                    continue
                row = measure_controller(session, claims, pools, auto_timeout(args, claims))
                rows.append(row)
                if restart:
                    if row.error is None:
                        restarts.append(measure_restart(session, claims, args.restart_create, args.restart_timeout))
                    else:
                        failed = "not measured: its throughput run failed"
                        restarts.append(RestartResult(target.name, target.slug, 1, addresses=claims, error=failed))
        except Exception as error:  # the control plane did not start
            rows.append(ThroughputResult(target.name, target.slug, claims, pools=pools, error=error_text(error)))
    return rows, restarts


def run_steady(targets: list[Target], binaries: Path, work: Path, args: argparse.Namespace) -> list[SteadyResult]:
    rows: list[SteadyResult] = []
    claims = round(args.rate * args.duration)
    for target in targets:
        try:
            with Session(target, binaries, work, f"{target.slug}-steady", claims, 1) as session:
                rows.append(measure_steady(session, args.rate, args.duration, auto_timeout(args, claims)))
        except Exception as error:
            rows.append(SteadyResult(target.name, target.slug, claims, rate=args.rate, error=error_text(error)))
    return rows


def run_pools(targets: list[Target], binaries: Path, work: Path, args: argparse.Namespace) -> Groups:
    """The pools scenario: for each size, ours (serving its metrics), the Go peer and the limit, one after the
    other; ours's repair pass and scrape at the first size only."""
    groups: Groups = []
    for number, count in enumerate(args.pool_counts):
        claims = count * args.claims_per_pool
        timeout = pools_timeout(args.timeout, claims)
        plan = PoolsPlan(count, args.claims_per_pool, args.idle_seconds, timeout, extras=number == 0)
        rows: list[RunResult] = []
        for target in targets:
            url = f"http://127.0.0.1:{free_port()}/metrics" if target.slug == "ours" else None
            if url is not None:
                target = ours(args.workers, url.removeprefix("http://").removesuffix("/metrics"))
            try:
                with Session(target, binaries, work, f"{target.slug}-pools-{count}", 0, 0) as session:
                    if target.slug == "limit":
                        rows.append(measure_limit_pools(session, plan, args.workers))
                    else:
                        rows.append(measure_pools(session, plan, url))
            except Exception as error:  # the control plane did not start
                failed = PoolsResult(target.name, target.slug, claims, pools=count, error=error_text(error))
                rows.append(failed)
        groups.append((f"{count} pools ", rows))
    return groups


def add_pools_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pool-counts", default="1000,5000", help="pools: pool counts, comma-separated, each its own runs (1000,5000)"
    )
    parser.add_argument("--claims-per-pool", type=int, default=2, help="pools: claims in each pool (default 2)")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=60.0,
        help="pools: seconds of idle CPU after the one more pool, itself 10 s after settling (default 60)",
    )


def check_pools_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--pool-counts as a list of counts, and the pools flags in range."""
    try:
        args.pool_counts = [int(count) for count in args.pool_counts.split(",") if count.strip()]
    except ValueError:
        parser.error("--pool-counts is a comma-separated list of counts, e.g. 1000,5000")
    if not args.pool_counts or not all(1 <= count < MAX_POOLS for count in args.pool_counts):
        parser.error(f"--pool-counts: each between 1 and {MAX_POOLS - 1}")
    if not 1 <= args.claims_per_pool <= 250 or args.idle_seconds < 0:
        parser.error("need 1 <= --claims-per-pool <= 250 and --idle-seconds >= 0")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        help="throughput, steady, restart, pools, all (repeat or comma-separate; default throughput)",
    )
    parser.add_argument("--claims", type=int, help="throughput: claims created at once (default 300)")
    parser.add_argument("--pools", type=int, help="throughput: pools they are spread over (default 3)")
    parser.add_argument(
        "--size", action="append", default=[], help="throughput: N/P, repeatable (instead of --claims/--pools)"
    )
    parser.add_argument("--rate", type=float, default=20.0, help="steady: claims created per second (default 20)")
    parser.add_argument("--duration", type=float, default=60.0, help="steady: seconds of creates (default 60)")
    parser.add_argument(
        "--restart-addresses",
        type=int,
        default=10_000,
        help="restart: fulfilled claims in place on one pool (default 10000)",
    )
    parser.add_argument(
        "--restart-create",
        choices=WHEN,
        default="synced",
        help="restart: create the new claim once the controller logged its caches synced (default) or at its start",
    )
    parser.add_argument(
        "--restart-timeout", type=float, default=600.0, help="restart: seconds allowed to the first new fulfilment"
    )
    add_pools_flags(parser)
    parser.add_argument(
        "--workers", type=int, default=8, help="our controller's --workers, the limit's claims in flight (default 8)"
    )
    parser.add_argument(
        "--timeout", type=float, help="seconds allowed per run to fulfil all claims (default: max(150, 0.2 per claim))"
    )
    parser.add_argument("--go-version", choices=sorted(GO_VERSIONS), default="v1.1.0", help="Go baseline release")
    parser.add_argument("--skip-go", action="store_true", help="do not measure the Go provider")
    parser.add_argument("--skip-limit", action="store_true", help="do not measure the speed-of-light client")
    parser.add_argument("--keep-logs", type=Path, help="copy the controllers' logs into this directory")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(argv)
    chosen = {s.strip() for value in args.scenario or ["throughput"] for s in value.split(",") if s.strip()}
    if unknown := chosen - {*SCENARIOS, "all"}:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    args.scenarios = list(SCENARIOS) if "all" in chosen else sorted(chosen)
    args.sizes = _sizes(parser, args, "all" in chosen)
    if args.rate <= 0 or args.duration <= 0:
        parser.error("need --rate > 0 and --duration > 0")
    check_pools_flags(parser, args)
    return args


def _sizes(parser: argparse.ArgumentParser, args: argparse.Namespace, every: bool) -> list[tuple[int, ...]]:
    """The throughput and restart runs' claims/pools sizes, the largest last."""
    try:
        sizes = [tuple(int(part) for part in size.split("/", 1)) for size in args.size]
    except ValueError:
        parser.error("--size is N/P, e.g. 2000/1")
    if args.claims is not None or args.pools is not None:
        sizes.append((args.claims or 300, args.pools or 3))
    if not sizes and "throughput" in args.scenarios:
        sizes = list(ISSUE_SIZES) if every else [(300, 3)]
    if "restart" in args.scenarios and (args.restart_addresses, 1) not in sizes:
        sizes.append((args.restart_addresses, 1))
    for claims, pools in sizes:
        if claims < 1 or not 1 <= pools <= 100:
            parser.error(f"{claims}/{pools}: need at least 1 claim and 1 to 100 pools")
        pool_layout(claims, pools)
    return sorted(set(sizes), key=lambda size: (size[0], -size[1]))


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def build_targets(args: argparse.Namespace) -> tuple[list[Target], str | None]:
    """Ours, the Go peer (built if needed) and the limit, and why the Go peer is missing if it is."""
    targets = [ours(args.workers)]
    problem = "skipped (--skip-go)" if args.skip_go else None
    if not args.skip_go:
        try:
            peer: GoPeer = build_go_peer(args.go_version, GO_VERSIONS[args.go_version].capi)
            print(f"Go peer ready in {peer.build_seconds:.1f} s: {peer.binary}", flush=True)
            targets.append(go_baseline(peer))
        except (GoPeerUnavailable, AssetError) as error:
            problem = str(error)
    if not args.skip_limit:
        targets.append(limit_target(args.workers))
    return targets, problem


def run_scenarios(
    targets: list[Target], binaries: Path, work: Path, args: argparse.Namespace, scenarios: dict[str, Groups]
) -> None:
    """Every chosen scenario, its groups added to `scenarios` as they are measured (what an interruption keeps)."""
    if "steady" in args.scenarios:
        scenarios["steady"] = [("", list(run_steady(targets, binaries, work, args)))]
    for claims, pools in args.sizes:
        rows, restarts = run_sizes(targets, binaries, work, args, claims, pools)
        scenarios.setdefault("throughput", []).append((f"{claims}/{pools} ", list(rows)))
        if restarts:
            scenarios["restart"] = [("", list(restarts))]
    if "pools" in args.scenarios:
        scenarios["pools"] = run_pools(targets, binaries, work, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    wall, began = time.monotonic(), datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    work = Path(tempfile.mkdtemp(prefix="ipam-bench-"))
    scenarios: dict[str, Groups] = {}
    try:
        try:
            binaries = binaries_dir()
            targets, go_problem = build_targets(args)
        except AssetError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        run_scenarios(targets, binaries, work, args, scenarios)
    except KeyboardInterrupt:
        print("\ninterrupted: control planes and controllers stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in work.glob("*.log"):
                shutil.copy(log, args.keep_logs / log.name)
        shutil.rmtree(work, ignore_errors=True)
    columns = {
        "throughput": THROUGHPUT_COLUMNS,
        "steady": STEADY_COLUMNS,
        "restart": RESTART_COLUMNS,
        "pools": POOLS_COLUMNS,
    }
    print(f"\nour controller with --workers {args.workers}; rows: {', '.join(t.name for t in targets)}")
    for name in SCENARIOS:
        if name in scenarios:
            print_scenario(name, columns[name], scenarios[name])
    if go_problem:
        print(f"\nGo baseline not measured: {go_problem}")
    seconds = time.monotonic() - wall
    print(f"\nbenchmark wall time {seconds:.0f} s")
    if args.json:
        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        write_json(args.json, {"started": began, "wall_seconds": round(seconds), "options": options}, scenarios)
        print(f"figures written to {args.json}")
    ours_rows = [row for groups in scenarios.values() for _, rows in groups for row in rows if row.slug == "ours"]
    return 0 if ours_rows and all(row.error is None for row in ours_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
