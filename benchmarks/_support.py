"""Helpers of `benchmarks/incluster_throughput.py`: processes, /proc figures, API-server request counts and the
Go peer's build. Nothing here talks to a controller's internals; everything is observed from
outside (the API server's /metrics, /proc), so our controller and the Go peer are measured the same way."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parent.parent
GO_BUILD_SCRIPT = REPO_ROOT / "hack" / "go-incluster" / "build.sh"
MUTATING_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
READ_VERBS = frozenset({"GET", "LIST"})
# Requests the API server makes to itself on a timer (lease renewals, endpoint and APF upkeep); never a controller's.
NOISE_GROUPS = frozenset(
    {"coordination.k8s.io", "flowcontrol.apiserver.k8s.io", "apiregistration.k8s.io", "discovery.k8s.io"}
)
NOISE_CORE = frozenset({"endpoints", "services", "namespaces", "resourcequotas"})
# (verb, "group/resource[/subresource]") -> count
RequestCounts = collections.Counter[tuple[str, str]]


# -- processes --------------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """SIGTERM this child when the benchmark dies, however it dies (Linux prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def start_process(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a controller in its own session (a Ctrl-C in the terminal reaches only the benchmark, which then
    stops it in order), logging to `log_path`."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def stop_process(process: subprocess.Popen[bytes] | None, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`; always reaps the child."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def proc_figures(pid: int) -> tuple[int | None, float | None]:
    """(peak resident set in KiB (VmHWM), user+system CPU seconds) of a live process, from /proc."""
    peak = None
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1])
    cpu = None
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return peak, cpu


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- API server request counts ----------------------------------------------------------------------------------


def scrape_requests(server: str, token: str, ca_path: Path) -> RequestCounts:
    """apiserver_request_total by (verb, group/resource/subresource), without the API server's own upkeep."""
    request = urllib.request.Request(f"{server}/metrics", headers={"Authorization": f"Bearer {token}"})
    context = ssl.create_default_context(cafile=str(ca_path))
    with urllib.request.urlopen(request, timeout=20, context=context) as response:
        text = response.read().decode()
    counts: RequestCounts = collections.Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            labels = sample.labels
            if not sample.name.endswith("_total") or not labels.get("resource"):
                continue
            group, resource = labels.get("group", ""), labels["resource"]
            if group in NOISE_GROUPS or (group == "" and resource in NOISE_CORE):
                continue
            key = "/".join(part for part in (group or "core", resource, labels.get("subresource", "")) if part)
            counts[(labels["verb"], key)] += int(sample.value)
    return counts


async def settled_counts(server: str, token: str, ca: Path) -> RequestCounts:
    """Request counts once the controller's trailing writes (e.g. pool status) have stopped, at most 10 s on."""
    previous = await asyncio.to_thread(scrape_requests, server, token, ca)
    for _ in range(10):
        await asyncio.sleep(1)
        current = await asyncio.to_thread(scrape_requests, server, token, ca)
        if current == previous:
            break
        previous = current
    return previous


def request_delta(before: RequestCounts, after: RequestCounts, driver: RequestCounts) -> RequestCounts:
    """What the controller asked for between two scrapes: the difference less the benchmark's own requests."""
    delta: RequestCounts = collections.Counter()
    for key in after.keys() | before.keys():
        value = after[key] - before[key] - driver[key]
        if value > 0 and key[0] in MUTATING_VERBS | READ_VERBS:
            delta[key] = value
    return delta


# -- the Go peer ------------------------------------------------------------------------------------------------


@dataclass
class GoPeer:
    version: str
    binary: Path
    pool_crds: Path
    capi_crds: Path
    build_seconds: float


class GoPeerUnavailable(RuntimeError):
    """The Go in-cluster provider could not be built or its CRDs fetched; the message says why."""


def build_go_peer(version: str, capi: str) -> GoPeer:
    """Run hack/go-incluster/build.sh for provider `version` against CAPI `capi`'s CRDs (a no-op when that
    version's binary is cached) and return what it produced."""
    started = time.monotonic()
    env = {**os.environ, "GO_INCLUSTER_VERSION": version, "GO_INCLUSTER_CAPI": capi}
    try:
        result = subprocess.run(["bash", str(GO_BUILD_SCRIPT)], capture_output=True, text=True, check=True, env=env)
    except (OSError, subprocess.CalledProcessError) as error:
        stderr = getattr(error, "stderr", None) or str(error)
        raise GoPeerUnavailable(f"{GO_BUILD_SCRIPT.relative_to(REPO_ROOT)} failed:\n{stderr[-3000:]}") from error
    values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    try:
        peer = GoPeer(values["VERSION"], Path(values["BIN"]), Path(values["POOL_CRDS"]), Path(values["CAPI_CRDS"]), 0.0)
    except KeyError as error:
        raise GoPeerUnavailable(f"build script printed no {error}: {result.stdout!r}") from error
    peer.build_seconds = time.monotonic() - started
    missing = [str(p) for p in (peer.binary, peer.pool_crds, peer.capi_crds) if not p.exists()]
    if missing:
        raise GoPeerUnavailable(f"missing after the build: {', '.join(missing)}")
    return peer
