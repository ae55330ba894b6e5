"""The steady scenario of `benchmarks/incluster_throughput.py`: claims created at a steady rate on one pool, and
for each the latency from the moment its create request was sent to the moment the benchmark's one watch on
claims (started before the first create) first shows it fulfilled: status.addressRef set and no Ready condition
other than True (ours writes Ready=True in the same status PATCH as addressRef; the Go provider v1.1.0 writes no
condition when it succeeds).

For the limit client each claim runs through the limit's writes as soon as its create returns (one claim at a
time at these rates), and its fulfilment is taken from the same watch. The limit's CPU is not reported here: the
benchmark's own creates and watch run in the same process."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

from benchmarks._support import RequestCounts, proc_figures, request_delta, scrape_requests, settled_counts
from benchmarks.report import SteadyResult
from benchmarks.speed_of_light import LimitWriter
from benchmarks.targets import LIST_PAGE, NAMESPACE, POOLS, WARMUP, Session, check_addresses, claim_body
from benchmarks.throughput import warm_up
from ipam_provider.api.capi import IPAM_GROUP
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource

STEADY_POOL = "pool-0"
Object = dict[str, Any]


def is_fulfilled(claim: Object) -> bool:
    """status.addressRef set, and no Ready condition other than True."""
    status = claim.get("status") or {}
    if not (status.get("addressRef") or {}).get("name"):
        return False
    return all(c.get("status") == "True" for c in status.get("conditions") or [] if c.get("type") == "Ready")


class FulfilmentWatch:
    """One watch on the namespace's claims (optionally a label selector) that notes when each claim is first seen
    fulfilled: `fulfilled[name]` = time.monotonic() on receipt. A LIST only to start without a
    resourceVersion or when the watch's version is gone (`lists` counts them)."""

    def __init__(self, kube: KubeClient, claims: Resource, label_selector: str | None = None) -> None:
        self.kube, self.claims, self.selector = kube, claims, label_selector
        self.fulfilled: dict[str, float] = {}
        self.lists = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _note(self, claim: Object) -> None:
        name = claim["metadata"]["name"]
        if name not in self.fulfilled and is_fulfilled(claim):
            self.fulfilled[name] = time.monotonic()
            self._changed.set()

    async def _list(self) -> str:
        items, version = await self.kube.list(self.claims, NAMESPACE, label_selector=self.selector, limit=LIST_PAGE)
        self.lists += 1
        for item in items:
            self._note(item)
        return version

    async def start(self, resource_version: str = "") -> None:
        version = resource_version or await self._list()
        self._task = asyncio.create_task(self._run(version))

    async def _run(self, version: str) -> None:
        while True:
            events = cast(  # an async generator: closed on exit, which releases the connection
                AsyncGenerator[tuple[str, Object], None],
                self.kube.watch(
                    self.claims, NAMESPACE, resource_version=version, label_selector=self.selector, timeout_seconds=60
                ),
            )
            try:
                async with contextlib.aclosing(events):
                    async for kind, obj in events:
                        version = obj.get("metadata", {}).get("resourceVersion") or version
                        if kind in ("ADDED", "MODIFIED"):
                            self._note(obj)
            except ApiError as error:
                if not error.gone:
                    raise
                version = await self._list()

    async def wait_for(self, names: set[str], timeout: float, alive: Callable[[], bool]) -> None:
        """Until every claim in `names` was seen fulfilled; TimeoutError after `timeout` s, RuntimeError once `alive()`
        is false or the watch failed."""
        deadline = time.monotonic() + timeout
        while not names <= self.fulfilled.keys():
            if self._task is not None and self._task.done():
                raise RuntimeError(f"the watch ended: {self._task.exception()!r}")
            if not alive():
                raise RuntimeError("the controller exited")
            if time.monotonic() > deadline:
                missing = len(names - self.fulfilled.keys())
                raise TimeoutError(f"{missing} of {len(names)} claims not fulfilled within {timeout:.0f} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 0.5)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


async def _paced(count: int, rate: float, send: Callable[[str], Any]) -> float:
    """Call `send(name)` as a task for claims steady-0 … at `rate` per second on an absolute schedule; return the
    seconds until the last of them finished."""
    started = time.monotonic()
    async with asyncio.TaskGroup() as group:
        for i in range(count):
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            group.create_task(send(f"steady-{i}"))
    return time.monotonic() - started


async def _steady(session: Session, rate: float, timeout: float, result: SteadyResult) -> None:
    target, state = session.target, session.state
    kube = await KubeClient.from_kubeconfig(str(session.kubeconfig))
    watch = FulfilmentWatch(kube, target.claims)
    limit: LimitWriter | None = None
    try:
        if target.slug != "limit":
            await warm_up(kube, session)
        else:
            pools, _ = await kube.list(POOLS, NAMESPACE)
            limit = LimitWriter(kube, {p["metadata"]["name"]: p for p in pools})
            limit.events.start()  # Events are written in the background, as the controller writes them
            await limit.allocate(await kube.create(target.claims, claim_body(target, WARMUP, WARMUP), NAMESPACE))
        await watch.start()
        sent: dict[str, float] = {}

        async def send(name: str) -> None:
            sent[name] = time.monotonic()
            created = await kube.create(target.claims, claim_body(target, name, STEADY_POOL), NAMESPACE)
            if limit is not None:
                await limit.allocate(created)

        pid = session.process.pid if session.process is not None else None
        before = await asyncio.to_thread(scrape_requests, state.server, state.admin_token, state.ca_path)
        cpu_before, lists_before = (proc_figures(pid)[1] if pid else None), watch.lists
        result.create_seconds = await _paced(result.claims, rate, send)
        alive = session.alive if limit is None else (lambda: True)
        try:
            await watch.wait_for(set(sent), timeout, alive)
        finally:
            result.latencies = [watch.fulfilled[n] - t for n, t in sent.items() if n in watch.fulfilled]
        after = await settled_counts(state.server, state.admin_token, state.ca_path)
        if pid:
            peak, cpu_after = proc_figures(pid)
            result.peak_rss_kib = peak
            if cpu_before is not None and cpu_after is not None:
                result.window_cpu_seconds = cpu_after - cpu_before
        key = f"{IPAM_GROUP}/{target.claims.plural}"
        driver: RequestCounts = collections.Counter(
            {("POST", key): result.claims, ("LIST", key): watch.lists - lists_before}
        )
        result.requests = request_delta(before, after, driver)
        await check_addresses(kube, target.addresses, result.claims, result)
    finally:
        if limit is not None:
            await limit.events.close()
        await watch.close()
        await kube.close()


def measure_steady(session: Session, rate: float, duration: float, timeout: float) -> SteadyResult:
    """`rate` claims/s for `duration` s on the session's pool-0 (a controller target gets its process started; the
    limit target is driven in-process); never raises except on interruption."""
    claims = max(1, round(rate * duration))
    result = SteadyResult(session.target.name, session.target.slug, claims, rate=rate, duration=duration)
    try:
        if session.target.slug != "limit":
            session.start_controller()
        asyncio.run(_steady(session, rate, timeout, result))
        figures = result.figures()
        print(f"[{result.name}] steady {claims} claims: p50 {figures['p50_ms']:.0f} ms, p99 {figures['p99_ms']:.0f} ms")
    except Exception as error:
        result.error = session.failure(error)
        print(f"[{result.name}] steady: {result.error.splitlines()[0]}", flush=True)
    return result
