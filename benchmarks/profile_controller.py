"""Where our controller's CPU goes: `incluster_throughput.py`'s run of our controller, under cProfile.

```sh
.venv/bin/python benchmarks/profile_controller.py [--out controller.prof] [--top 25] -- --claims 2000 --pools 1
```

The arguments after `--` go to `incluster_throughput.py` (`--skip-go --skip-limit` are always added). The
controller runs as `python -m ipam_provider run ...` under cProfile with a CPU clock (`time.process_time`, so time
spent waiting for the network is not counted); the benchmark stops it with SIGTERM, the controller stops
gracefully and the profile is written to OUT. Then the top entries by own time (tottime) and by cumulative time are
printed. The profiler slows the controller (roughly twice the CPU): compare CPU seconds from runs without it, and
use the profile for the shares.
"""

from __future__ import annotations

import argparse
import pstats
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import incluster_throughput, targets
from tools.controller_command import controller_command

# Runs `python -m ipam_provider ARGS` under cProfile with a CPU clock (process time: waiting for the network is
# not counted), and writes the profile to the first argument once the module exits.
PROFILED_MAIN = """
import cProfile, runpy, sys, time
out = sys.argv.pop(1)
profile = cProfile.Profile(time.process_time)
try:
    profile.runcall(runpy.run_module, "ipam_provider", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    profile.dump_stats(out)
"""


def profiled_argv(out: Path) -> Callable[..., list[str]]:
    """`controller_command`, its `-m ipam_provider` run under cProfile (PROFILED_MAIN) writing to `out`."""
    plain = controller_command

    def argv(kubeconfig: Path, namespace: str, *flags: str) -> list[str]:
        python, module_flag, module, *rest = plain(kubeconfig, namespace, *flags)
        assert (module_flag, module) == ("-m", "ipam_provider")
        return [python, "-c", PROFILED_MAIN, str(out), *rest]

    return argv


def summary(path: Path, top: int) -> None:
    stats = pstats.Stats(str(path))
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"\nprofile {path}: {total:.1f} s of profiled time")
    for order in ("tottime", "cumulative"):
        print(f"\n--- top {top} by {order}")
        stats.sort_stats(order).print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("controller.prof"), help="cProfile output file")
    parser.add_argument("--top", type=int, default=25, help="entries printed per ordering")
    parser.add_argument("benchmark", nargs="*", help="arguments of incluster_throughput.py (after --)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.unlink(missing_ok=True)
    vars(targets)["controller_command"] = profiled_argv(out)  # what its `ours()` target runs
    code = incluster_throughput.main([*args.benchmark, "--skip-go", "--skip-limit"])
    if not out.exists():
        print(f"error: no profile written to {out} (did the controller stop gracefully?)", file=sys.stderr)
        return 1
    summary(out, args.top)
    return code


if __name__ == "__main__":
    sys.exit(main())
