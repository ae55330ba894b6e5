"""Fixtures of the tests marked `providers`: real infrastructure providers' code, built from their Go modules
through our wrapper modules (hack/providers/<name>/), drives the controller.

`provider_harness(name)` builds (or finds cached) the wrapper binary of hack/providers/<name>/ and returns a
`Harness`: the binary and the provider module's source directory (for its CRDs). A missing module or a failed build
fails the test with Go's reason, never skips it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parents[2] / "hack" / "providers" / "build.sh"


@dataclass(frozen=True)
class Harness:
    binary: Path
    module_dir: Path


def build_harness(name: str) -> Harness:
    """The harness `name`, built once per provider version and wrapper content (cold: minutes)."""
    result = subprocess.run([str(BUILD), name], capture_output=True, text=True, timeout=1800, check=False)
    if result.returncode != 0:
        pytest.fail(f"cannot build the {name} harness:\n{result.stderr.strip()[-4000:]}", pytrace=False)
    values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return Harness(Path(values["BIN"]), Path(values["MODULE_DIR"]))


@pytest.fixture(scope="session")
def provider_harness() -> Callable[[str], Harness]:
    return build_harness
