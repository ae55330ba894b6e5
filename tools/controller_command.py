"""The command line that runs this checkout's controller as a separate process (tests and benchmarks use it)."""

from __future__ import annotations

import sys
from pathlib import Path


def controller_command(kubeconfig: Path, namespace: str, *flags: str) -> list[str]:
    """`ipam-provider run` with this interpreter, serving `namespace` through `kubeconfig`, without the admission
    webhook (several controllers run at once: `--webhook-port=<port>` among `flags` turns it on), plus `flags`
    (for example `--repair-interval=1s --repair-grace-period=2s` for the repair loop at a test's pace)."""
    return [
        sys.executable,
        "-m",
        "ipam_provider",
        "run",
        f"--kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        "--webhook-port=0",
        *flags,
    ]
