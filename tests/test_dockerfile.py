"""What the real image build (tests/system/test_image.py, buildah on a local Debian base) cannot check, in the
fast lane: the Dockerfile's default base is python:3.<minor>-slim pinned by digest, and it is the base of both
stages (so that one build argument swaps it); the build context is deny-by-default (`.dockerignore`), so local
state (.venv, kubeconfigs, test clusters, .git) can never reach an image; and what the build stage copies is let
through, which the real build also finds out, but only minutes later. The run-time stage sets the allocator's
environment (ALLOCATOR_ENV); the real build proves the library is there and loaded.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from ipam_provider.runtime.memory import ALLOCATOR_ENV

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = (REPO / "Dockerfile").read_text()


def _build_stage_copy_sources() -> list[str]:
    sources: list[str] = []
    for line in DOCKERFILE.splitlines():
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


def test_the_default_base_is_pinned_by_digest_and_is_the_base_of_both_stages() -> None:
    defaults = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.M)
    assert len(defaults) == 1, f"one default for PYTHON_IMAGE, not {defaults}"
    pinned = re.fullmatch(r"docker\.io/library/python:3\.(\d+)-slim@sha256:[0-9a-f]{64}", defaults[0])
    assert pinned, f"the default base {defaults[0]!r} is not docker.io/library/python:3.<minor>-slim@sha256:<digest>"
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = re.fullmatch(r">=3\.(\d+)", requires)
    assert minimum and int(pinned.group(1)) >= int(minimum.group(1)), f"{defaults[0]} does not meet {requires}"
    stages = re.findall(r"^FROM (.+)$", DOCKERFILE, re.M)
    assert stages == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"], stages
    # The Debian base has python3, and no `python` unless python-is-python3 is installed.
    assert not re.search(r"^RUN python ", DOCKERFILE, re.M), "RUN steps call python3, which every base has"


def test_the_context_is_deny_by_default() -> None:
    rules = [r.strip() for r in (REPO / ".dockerignore").read_text().splitlines() if r.strip() and r[0] != "#"]
    assert rules[0] == "*", "the context must start from nothing and let through only what the image installs"
    for local in (".venv", ".git", ".local", "tests", "hack", "config", "kubeconfig", ".mypy_cache"):
        assert not _allowed_by_dockerignore(local), f".dockerignore lets {local} into the image build context"


def test_build_stage_copies_are_in_the_context() -> None:
    sources = _build_stage_copy_sources()
    assert {"pyproject.toml", "README.md", "LICENSE", "ipam_provider", "backends"} <= set(sources), sources
    hidden = [s for s in sources if not _allowed_by_dockerignore(s)]
    assert not hidden, f".dockerignore hides {hidden} from the image build context"
    missing = [s for s in sources if not (REPO / s).exists()]
    assert not missing, f"the Dockerfile copies {missing}, which do not exist"


def test_the_image_runs_the_controller_under_jemalloc() -> None:
    env = dict(re.findall(r"^\s*(?:ENV\s+)?([A-Z_]+)=(\S+?)\s*\\?$", DOCKERFILE, re.M))
    assert {k: env.get(k) for k in ALLOCATOR_ENV} == ALLOCATOR_ENV, "the run-time ENV must set ALLOCATOR_ENV"
    assert re.search(r"apt-get install [^\n]*\blibjemalloc2\b", DOCKERFILE), "the image must install libjemalloc2"
