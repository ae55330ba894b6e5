"""The restart scenario of `benchmarks/incluster_throughput.py`: a controller stopped (SIGTERM) and started again
with N fulfilled claims and their IPAddresses in place (those of the throughput run before it, on the same
control plane), then one new claim; measured from the new process's start to its caches-synced log line and to
the new claim's fulfilment seen on a watch (see `benchmarks/latency.py`).

When the new claim is created (`when`): `synced`, as soon as the controller has logged its caches synced (ours
"caches synced"; the Go peer controller-runtime's "Starting workers" of its IPAddressClaim controller), so that it
arrives as a live change while the N existing claims are still queued from the initial LIST; or `start`, right
after the process is started (then in practice part of the initial LIST)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks._support import proc_figures
from benchmarks.latency import FulfilmentWatch
from benchmarks.report import RestartResult
from benchmarks.targets import NAMESPACE, Session, check_addresses, claim_body
from ipam_provider.runtime.kube.client import KubeClient

NEW_CLAIM = "after-restart"
LABEL = "benchmark.ipam.example/restart"
WHEN = ("synced", "start")


async def wait_for_line(path: Path, offset: int, pattern: str, alive: Callable[[], bool], timeout: float) -> float:
    """time.monotonic() when a line matching `pattern` first appears in `path` after byte `offset` (polled every
    10 ms); RuntimeError once `alive()` is false, TimeoutError after `timeout` s."""
    regex, deadline, pending = re.compile(pattern), time.monotonic() + timeout, b""
    with path.open("rb") as log:
        log.seek(offset)
        while True:
            pending += log.read()
            *lines, pending = pending.split(b"\n")
            if any(regex.search(line.decode(errors="replace")) for line in lines):
                return time.monotonic()
            if not alive():
                raise RuntimeError("the controller exited")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no line matching {pattern!r} in the controller's log within {timeout:.0f} s")
            await asyncio.sleep(0.01)


async def _restart(session: Session, when: str, timeout: float, result: RestartResult) -> None:
    target = session.target
    kube = await KubeClient.from_kubeconfig(str(session.kubeconfig))
    watch = FulfilmentWatch(kube, target.claims, label_selector=f"{LABEL}=1")
    offset = session.log.stat().st_size if session.log.exists() else 0
    synced: asyncio.Task[float] | None = None
    try:
        started = time.monotonic()
        process = session.start_controller(verbose=True)
        synced = asyncio.create_task(wait_for_line(session.log, offset, target.synced_line, session.alive, timeout))
        if when == "synced":
            result.to_synced = await synced - started
        sent = time.monotonic()
        body = claim_body(target, NEW_CLAIM, "pool-0", labels={LABEL: "1"})
        created = await kube.create(target.claims, body, NAMESPACE)
        await watch.start(created["metadata"]["resourceVersion"])
        await watch.wait_for({NEW_CLAIM}, timeout, session.alive)
        ready = watch.fulfilled[NEW_CLAIM]
        result.to_fulfilled, result.create_to_fulfilled = ready - started, ready - sent
        result.peak_rss_kib, result.cpu_seconds = proc_figures(process.pid)
        if result.to_synced is None and synced.done() and not synced.exception():
            result.to_synced = synced.result() - started
        await check_addresses(kube, target.addresses, result.addresses + 1, result)
    finally:
        if synced is not None and not synced.done():
            synced.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await synced
        await watch.close()
        await kube.close()


def measure_restart(session: Session, addresses: int, when: str, timeout: float) -> RestartResult:
    """Stop the session's controller (which fulfilled `addresses` claims on pool-0), start it again and time the
    first new fulfilment; never raises except on interruption."""
    result = RestartResult(session.target.name, session.target.slug, 1, addresses=addresses)
    try:
        session.stop_controller()
        asyncio.run(_restart(session, when, timeout, result))
        print(
            f"[{result.name}] restart with {addresses} IPAddresses: first new fulfilment after "
            f"{result.to_fulfilled:.2f} s",
            flush=True,
        )
    except Exception as error:
        result.error = session.failure(error)
        print(f"[{result.name}] restart: {result.error.splitlines()[0]}", flush=True)
    return result
