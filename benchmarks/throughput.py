"""The throughput scenario of `benchmarks/incluster_throughput.py`: N claims created at once (20 in flight) over P
pools, timed from the first create until a watch has seen every one fulfilled.

For a controller: one warm-up claim first (caches synced, workers running); its CPU over the measurement window
is read from /proc just before the creates and once the API server's request counts have settled. For the limit
client: the same creates, and each created claim goes at once to the limit's writers, so its clock covers the
same API work as a controller's (N creates and the writes of N allocations); its CPU is this process's over the
same window, the creating client's included."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

from benchmarks._support import RequestCounts, proc_figures, request_delta, scrape_requests, settled_counts
from benchmarks.fulfilment import wait_fulfilled
from benchmarks.report import ThroughputResult
from benchmarks.speed_of_light import write_all
from benchmarks.targets import IN_FLIGHT, NAMESPACE, POOLS, WARMUP, Session, check_addresses, claim_body, pool_layout
from ipam_provider.api.capi import IPAM_GROUP
from ipam_provider.runtime.kube.client import KubeClient


def claim_plan(claims: int, pools: int) -> list[tuple[str, str]]:
    """(claim name, pool name): round-robin over the pools."""
    _, layout = pool_layout(claims, pools)
    return [(f"claim-{i}", layout[i % len(layout)][0]) for i in range(claims)]


async def warm_up(kube: KubeClient, session: Session) -> None:
    """One claim on the warm-up pool, waited for: caches synced, workers running."""
    claims = session.target.claims
    await kube.create(claims, claim_body(session.target, WARMUP, WARMUP), NAMESPACE)
    await wait_fulfilled(kube, claims, NAMESPACE, {WARMUP}, 120, session.alive)


async def _measure(session: Session, timeout: float, result: ThroughputResult) -> None:
    target, state = session.target, session.state
    assert session.process is not None
    pid = session.process.pid
    kube = await KubeClient.from_kubeconfig(str(session.kubeconfig))
    try:
        await warm_up(kube, session)
        work = claim_plan(result.claims, result.pools)
        semaphore = asyncio.Semaphore(IN_FLIGHT)

        async def create(name: str, pool: str) -> None:
            async with semaphore:
                await kube.create(target.claims, claim_body(target, name, pool), NAMESPACE)

        before = await asyncio.to_thread(scrape_requests, state.server, state.admin_token, state.ca_path)
        cpu_before = proc_figures(pid)[1]
        started = time.monotonic()
        try:
            async with asyncio.TaskGroup() as group:  # a failure anywhere cancels the rest
                waiter = group.create_task(
                    wait_fulfilled(kube, target.claims, NAMESPACE, {n for n, _ in work}, timeout, session.alive)
                )
                for name, pool in work:
                    group.create_task(create(name, pool))
        except* TimeoutError as timed_out:
            raise TimeoutError(f"did not finish in {timeout:.0f} s: {timed_out.exceptions[0]}") from None
        lists = waiter.result()
        result.seconds = time.monotonic() - started
        after = await settled_counts(state.server, state.admin_token, state.ca_path)
        cpu_after = proc_figures(pid)[1]
        if cpu_before is not None and cpu_after is not None:
            result.window_cpu_seconds = cpu_after - cpu_before
        claims_key = f"{IPAM_GROUP}/{target.claims.plural}"
        driver: RequestCounts = collections.Counter({("POST", claims_key): result.claims, ("LIST", claims_key): lists})
        result.requests = request_delta(before, after, driver)
        await check_addresses(kube, target.addresses, result.claims, result)
    finally:
        await kube.close()


def measure_controller(session: Session, claims: int, pools: int, timeout: float) -> ThroughputResult:
    """Start the session's controller and measure it; never raises except on interruption. The controller is
    left running (for a restart scenario to follow); its peak RSS and lifetime CPU are read last."""
    result = ThroughputResult(session.target.name, session.target.slug, claims, pools=pools)
    try:
        process = session.start_controller()
        asyncio.run(_measure(session, timeout, result))
        result.peak_rss_kib, result.cpu_seconds = proc_figures(process.pid)
        print(f"[{result.name}] {claims} claims fulfilled in {result.seconds:.1f} s", flush=True)
    except Exception as error:
        result.error = session.failure(error)
        print(f"[{result.name}] {claims} claims: {result.error.splitlines()[0]}", flush=True)
    return result


async def _measure_limit(session: Session, workers: int, result: ThroughputResult) -> None:
    target, state = session.target, session.state
    kube = await KubeClient.from_kubeconfig(str(session.kubeconfig))
    try:
        semaphore = asyncio.Semaphore(IN_FLIGHT)
        created: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        async def create(name: str, pool: str) -> None:
            async with semaphore:
                created.put_nowait(await kube.create(target.claims, claim_body(target, name, pool), NAMESPACE))

        async def create_all() -> None:
            async with asyncio.TaskGroup() as group:
                for name, pool in claim_plan(result.claims, result.pools):
                    group.create_task(create(name, pool))
            for _ in range(workers):
                created.put_nowait(None)

        pools, _ = await kube.list(POOLS, NAMESPACE)
        before = await asyncio.to_thread(scrape_requests, state.server, state.admin_token, state.ca_path)
        started, cpu = time.monotonic(), time.process_time()
        async with asyncio.TaskGroup() as group:
            group.create_task(create_all())
            group.create_task(write_all(kube, created, {p["metadata"]["name"]: p for p in pools}, workers))
        result.seconds, result.cpu_seconds = time.monotonic() - started, time.process_time() - cpu
        result.window_cpu_seconds = result.cpu_seconds
        after = await settled_counts(state.server, state.admin_token, state.ca_path)
        claims_key = f"{IPAM_GROUP}/{target.claims.plural}"
        result.requests = request_delta(before, after, collections.Counter({("POST", claims_key): result.claims}))
        await check_addresses(kube, target.addresses, result.claims, result)
    finally:
        await kube.close()


def measure_limit(session: Session, claims: int, pools: int, workers: int) -> ThroughputResult:
    """The speed-of-light client: `claims` created and allocated by its writes; never raises except on
    interruption."""
    result = ThroughputResult(session.target.name, session.target.slug, claims, pools=pools)
    try:
        asyncio.run(_measure_limit(session, workers, result))
        print(f"[limit] {claims} claims written in {result.seconds:.1f} s", flush=True)
    except Exception as error:
        result.error = session.failure(error)
    return result
