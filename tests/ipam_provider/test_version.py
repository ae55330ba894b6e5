"""One version, written once (ipam_provider/version.py): `--version`, the package metadata and the image label's
default agree."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from ipam_provider.version import __version__

REPO = Path(__file__).resolve().parents[2]


def test_version_is_semantic() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), __version__


def test_dash_dash_version_prints_it_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ipam_provider", "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == f"{__version__}\n"


def test_the_package_metadata_takes_it_from_the_version_module() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ipam_provider.version.__version__"}
    assert importlib.metadata.version("capi-ipam-provider-py") == __version__, "reinstall: make venv"


def test_the_image_labels_default_to_it() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    final_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    (default,) = re.findall(r"^ARG VERSION=(\S+)$", final_stage, re.MULTILINE)
    assert default == __version__
    for label, arg in (("version", "VERSION"), ("source", "SOURCE"), ("revision", "REVISION")):
        assert f'org.opencontainers.image.{label}="${{{arg}}}"' in final_stage
        assert re.search(rf"^ARG {arg}\b", final_stage, re.MULTILINE)
