"""The Dockerfile's build stage must find everything the package build needs in the image build context.

There is no Docker engine here, so this test rebuilds the build stage's context by hand: it takes the sources of
the build stage's COPY instructions, checks that `.dockerignore` lets each of them through, copies exactly those
into an empty directory, and builds a wheel there. A file that pyproject.toml needs but the Dockerfile does not
copy (or `.dockerignore` hides) fails the wheel build, as it would fail `docker build`.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _build_stage_copy_sources() -> list[str]:
    sources: list[str] = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["FROM"] and sources:
            break  # the second stage copies from the first, not from the context
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources.extend(w.rstrip("/") for w in words[1:-1])
    return sources


def _allowed_by_dockerignore(path: str) -> bool:
    allowed = True
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern):
            allowed = negate
    return allowed


def test_build_stage_copies_are_in_the_context() -> None:
    sources = _build_stage_copy_sources()
    assert {"pyproject.toml", "README.md", "LICENSE", "ipam_provider", "backends"} <= set(sources), sources
    hidden = [s for s in sources if not _allowed_by_dockerignore(s)]
    assert not hidden, f".dockerignore hides {hidden} from the image build context"
    missing = [s for s in sources if not (REPO / s).exists()]
    assert not missing, f"the Dockerfile copies {missing}, which do not exist"


def test_package_builds_from_the_build_stage_context_alone(tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    for source in _build_stage_copy_sources():
        origin = REPO / source
        if origin.is_dir():
            shutil.copytree(origin, context / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, context / source)
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(wheels), str(context)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, f"the wheel does not build from the image context:\n{built.stderr[-3000:]}"
    (wheel,) = wheels.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("ipam_provider/") for n in names)
    assert any(n.startswith("backends/incluster/") for n in names)
    assert any(n.endswith("entry_points.txt") for n in names)
    assert any(n.endswith("licenses/LICENSE") for n in names), "the wheel carries no LICENSE"
