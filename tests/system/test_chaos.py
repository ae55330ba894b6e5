"""The short chaos run, once per backend present in this checkout: a few hundred allocations and releases under
every fault kind, then the check against the truth (see docs/chaos.md).

It runs `python -m benchmarks.chaos --short` as a user would, on a control plane of its own, and reads its JSON.
It fails when any check finds something (a duplicate, a leak, an unfulfilled claim, an IPAddress without its
allocation) or when any fault kind was never injected; the seed is fixed, and the run waits on conditions, with
generous bounds, never on the clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.chaos import loader
from benchmarks.chaos.faults import HEAVY, LIGHT
from benchmarks.chaos.report import CHECKS
from tools.controlplane.versions import REPO_ROOT

SEED = 15
SHORT_OPERATIONS = 300
TIMEOUT = 1800  # a hang guard only; the run takes a few minutes
# Besides the control plane the run starts itself, what each backend's short run needs.
MARKS = {"netbox": [pytest.mark.netbox]}

pytestmark = pytest.mark.apiserver


@pytest.mark.parametrize("backend", [pytest.param(name, marks=MARKS.get(name, [])) for name in loader.available()])
def test_short_chaos_run_loses_nothing_and_hands_nothing_out_twice(backend: str, tmp_path: Path) -> None:
    report = tmp_path / "chaos.json"
    argv = [sys.executable, "-m", "benchmarks.chaos", "--backend", backend, "--short", f"--seed={SEED}"]
    argv += ["--json", str(report), "--keep-logs", str(tmp_path / "logs")]
    run = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    output = f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-6000:]}"
    assert report.is_file(), output
    (result,) = json.loads(report.read_text())
    assert result["error"] == "", output
    assert result["operations"] >= SHORT_OPERATIONS, output
    assert set(HEAVY + LIGHT) <= set(result["fault_kinds"]), output
    never = [kind for kind in result["fault_kinds"] if result["faults"].get(kind, 0) < 1]
    assert never == [], output
    assert result["checks"] == dict.fromkeys(CHECKS, 0), output
    assert run.returncode == 0, output
