"""`python -m benchmarks.chaos`: the chaos run, one backend or all, with its table (and `--json`).

Exits 1 when any backend's run failed, missed a fault kind, or found anything wrong in the check against the
truth; 2 on a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import replace
from pathlib import Path

import structlog

from benchmarks.chaos import loader
from benchmarks.chaos.report import BackendResult, table, to_json
from benchmarks.chaos.runner import Options, run_backend, short


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    parser.add_argument("--backend", default="all", choices=[*loader.BACKENDS, "all"], help="default: all present")
    parser.add_argument("--operations", type=int, help="allocations + releases per backend (default 2000)")
    parser.add_argument("--pools", type=int, help="pools per backend (default 4)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the workload and the faults (default 1)")
    parser.add_argument("--rate", type=float, help="operations per second (default 5)")
    parser.add_argument("--short", action="store_true", help="the short run: 300 operations, each fault at least once")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--keep-logs", type=Path, metavar="DIR", help="keep each run's logs under DIR")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the runner does")
    return parser.parse_args(argv)


def options_of(args: argparse.Namespace) -> Options:
    options = short(args.seed) if args.short else Options(seed=args.seed)
    changes = {"operations": args.operations, "pools": args.pools, "rate": args.rate, "keep": args.keep_logs}
    return replace(options, **{key: value for key, value in changes.items() if value is not None})


async def run_all(names: list[str], options: Options) -> list[BackendResult]:
    results = []
    for name in names:
        print(f"[{name}] chaos run: {options.operations} operations, {options.pools} pools, seed {options.seed}")
        result = await run_backend(name, options)
        print(f"[{name}] {'passed' if result.passed else 'FAILED'} in {result.seconds:.0f} s", flush=True)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    level = logging.INFO if args.verbose else logging.WARNING
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
    names = loader.available() if args.backend == "all" else [args.backend]
    if args.backend != "all" and args.backend not in loader.available():
        print(f"backend {args.backend!r} is not in this checkout (benchmarks/chaos/{args.backend}.py)", file=sys.stderr)
        return 2
    results = asyncio.run(run_all(names, options_of(args)))
    print(table(results))
    for result in results:
        for note in result.notes:
            print(f"{result.backend}: {note}")
    if args.json:
        args.json.write_text(to_json(results) + "\n")
    return 0 if all(result.passed for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
