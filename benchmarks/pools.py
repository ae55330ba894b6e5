"""The pools scenario of `benchmarks/incluster_throughput.py`: many pools created at once on a running controller.

Once the controller runs and has fulfilled the warm-up claim (caches synced, workers running), N InClusterIPPools
(`pool-<i>`, a /24 each from 10.0.0.0/8 by index: `10.<i // 256>.<i % 256>.0/24`) and C claims in each are created
at once, 20 requests in flight, each pool's claims once its create has returned. Then, one step after the other:

1. settled: from the first create until a watch has seen every claim fulfilled (status.addressRef, as
   `fulfilment.py`) and another every pool's `status.ipAddresses.used` equal to C; the controller's CPU over that
   window (/proc), and the API requests of the window (once they settled) less the benchmark's creates;
2. quiet: the controller's CPU over the `AFTER_SETTLING` (10 s) from the moment it settled, when the first repair
   pass over the burst's pools comes and the next cluster is likely to arrive;
3. one more pool, created `AFTER_SETTLING` after it settled: pool N and its C claims; from its create until its
   claims are fulfilled (the fulfilled seconds) and until its status says used = C as well (the counted seconds);
   CPU over the whole window;
4. idle: the controller's CPU over the next `--idle-seconds` (so from at least `AFTER_SETTLING` after settling);
5. one pool deleted: pool-0's C claims deleted, and once they are gone (both controllers delete the IPAddresses
   before they let a claim go, and hold a pool while IPAddresses name it) the pool; from the first delete until
   the pool is gone; CPU over that window;
6. peak RSS (VmHWM) at the end, and duplicates over all pools (`check_addresses`: N * C IPAddresses expected).

Ours serves its metrics over plain HTTP here (`--metrics-bind-address`), and at the first size only two more
figures are taken from it, after step 5 (N pools again):
- API requests of one repair pass (default `--repair-interval` of 60 s): our `ipam_provider_repair_passes_total`
  is read every 0.5 s; a pass has completed when every backend's count went up by one (the loop counts each backend
  at the end of its share of a pass). The API server's request counts are read right after one pass completed and
  again right after the next one did: the difference is one pass of every backend plus the interval's sleep, in
  which ours makes no other request once settled. The pass's own duration comes from
  `ipam_provider_repair_pass_duration_seconds` (summed over the backends). The idle step's CPU includes the passes
  that fall in it.
- the controller's CPU per metrics scrape, as `metrics_scrape.py` measures it (a few scrapes in a row, less the
  same span idle), right after that pass (in the interval's sleep).

The limit (`speed_of_light.py`) gets the same creates and deletes in the same clocks, and for every created pool and
claim, as soon as its create returns (`--workers` in flight), our controller's writes: per claim the five of an
allocation; per pool the ProtectPool finalizer at once and, once its C claims are allocated, one status write
with the final counts and Ready=True. Ours writes the finalizer and its status at least once per pool, when it
first sees the pool (used 0, unless its claims came first) and after allocations (coalesced per pool): the limit
writes the least of those that ends in used = C. For the deleted pool: per claim the four writes of a release,
then the pool's finalizer removed. Its CPU is this process's over each step, creates included; it has no idle CPU
and no RSS.
"""

from __future__ import annotations

import asyncio
import collections
import time
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from benchmarks._support import RequestCounts, proc_figures, request_delta, scrape_requests, settled_counts
from benchmarks.fulfilment import current_version, has_address, wait_until
from benchmarks.metrics_scrape import measure_scrapes
from benchmarks.report import PoolsResult
from benchmarks.speed_of_light import LimitWriter, Written
from benchmarks.targets import IN_FLIGHT, NAMESPACE, POOLS, Session, Target, check_addresses, claim_body
from benchmarks.throughput import warm_up
from ipam_provider.api.capi import IPAM_GROUP
from ipam_provider.runtime.kube.client import KubeClient

Object = dict[str, Any]
Job = Callable[[], Awaitable[None]]
AFTER_SETTLING = 10.0  # seconds from settling to the one more pool (the quiet step's span)
MAX_POOLS = 25_000  # 10.0.0.0/24 … 10.97.167.0/24, clear of the warm-up pool's 10.99.0.0/24
SCRAPES = 5
POLL = 0.5


@dataclass(frozen=True)
class PoolsPlan:
    """One size of the scenario: `pools` pools of `per_pool` claims; `extras`: also measure ours's repair pass and
    scrape (the first size)."""

    pools: int
    per_pool: int
    idle_seconds: float
    timeout: float
    extras: bool = False

    @property
    def claims(self) -> int:
        return self.pools * self.per_pool


def pools_timeout(timeout: float | None, claims: int) -> float:
    """--timeout, else 300 s or 0.3 s per claim, whichever is longer (for each step)."""
    return float(timeout) if timeout else max(300.0, 0.3 * claims)


def pool_name(index: int) -> str:
    return f"pool-{index}"


def claim_names(index: int, per_pool: int) -> list[str]:
    return [f"pool-{index}-claim-{number}" for number in range(per_pool)]


def pool_body(index: int) -> Object:
    cidr = f"10.{index // 256}.{index % 256}.0/24"
    spec = {"addresses": [cidr], "prefix": 24}
    return {"apiVersion": POOLS.api_version, "kind": POOLS.kind, "metadata": {"name": pool_name(index)}, "spec": spec}


def used_is(count: int) -> Callable[[Object | None], bool]:
    """Whether a pool's status.ipAddresses.used is `count`."""

    def check(pool: Object | None) -> bool:
        counts = ((pool or {}).get("status") or {}).get("ipAddresses") or {}
        return bool(counts.get("used") == count)

    return check


def is_gone(obj: Object | None) -> bool:
    return obj is None


class Creator:
    """The benchmark's creates and deletes, IN_FLIGHT requests at a time; `on_pool`/`on_claim` see each created
    object (the limit's cue)."""

    def __init__(self, kube: KubeClient, target: Target) -> None:
        self.kube, self.target = kube, target
        self.semaphore = asyncio.Semaphore(IN_FLIGHT)
        self.on_pool: Callable[[Object], None] = lambda _pool: None
        self.on_claim: Callable[[Object], None] = lambda _claim: None

    async def pool_with_claims(self, index: int, per_pool: int) -> None:
        """The pool, then its claims."""
        async with self.semaphore:
            self.on_pool(await self.kube.create(POOLS, pool_body(index), NAMESPACE))
        async with asyncio.TaskGroup() as group:
            for name in claim_names(index, per_pool):
                group.create_task(self.claim(name, pool_name(index)))

    async def claim(self, name: str, pool: str) -> None:
        async with self.semaphore:
            self.on_claim(await self.kube.create(self.target.claims, claim_body(self.target, name, pool), NAMESPACE))

    async def pools(self, first: int, last: int, per_pool: int) -> None:
        async with asyncio.TaskGroup() as group:
            for index in range(first, last):
                group.create_task(self.pool_with_claims(index, per_pool))

    async def delete(self, names: list[str], claims: bool = True) -> None:
        resource = self.target.claims if claims else POOLS

        async def one(name: str) -> None:
            async with self.semaphore:
                await self.kube.delete(resource, name, NAMESPACE)

        async with asyncio.TaskGroup() as group:
            for name in names:
                group.create_task(one(name))


async def together(step: str, timeout: float, *work: Coroutine[Any, Any, Any]) -> tuple[float, list[Any]]:
    """Run `work` at once; (seconds until all is done, their results). A TimeoutError says which step did not
    finish."""
    started = time.monotonic()
    try:
        async with asyncio.TaskGroup() as group:  # a failure anywhere cancels the rest
            tasks = [group.create_task(one) for one in work]
    except* TimeoutError as timed_out:
        raise TimeoutError(f"{step}: did not finish in {timeout:.0f} s: {timed_out.exceptions[0]}") from None
    return time.monotonic() - started, [task.result() for task in tasks]


async def since(started: float, work: Awaitable[Any]) -> float:
    """Seconds from `started` (time.monotonic()) until `work` is done."""
    await work
    return time.monotonic() - started


def cpu_of(pid: int) -> float:
    cpu = proc_figures(pid)[1]
    if cpu is None:
        raise RuntimeError("the controller's CPU time cannot be read (has it exited?)")
    return cpu


# -- a controller ----------------------------------------------------------------------------------------------


class ControllerRun:
    """The steps for one controller on its session, filling `result`."""

    def __init__(self, session: Session, kube: KubeClient, plan: PoolsPlan, result: PoolsResult) -> None:
        assert session.process is not None
        self.session, self.kube, self.plan, self.result = session, kube, plan, result
        self.target, self.pid = session.target, session.process.pid
        self.creator = Creator(kube, session.target)

    def wait_claims(
        self, names: list[str], version: str, done: Callable[[Object | None], bool] = has_address
    ) -> Coroutine[Any, Any, int]:
        what = "claims unfulfilled" if done is has_address else "claims still there"
        alive = self.session.alive
        return wait_until(
            self.kube, self.target.claims, NAMESPACE, set(names), done, self.plan.timeout, alive, what, version
        )

    def wait_pools(
        self, names: list[str], done: Callable[[Object | None], bool], version: str
    ) -> Coroutine[Any, Any, int]:
        what = "pools not counting every claim" if done is not is_gone else "pools still there"
        return wait_until(
            self.kube, POOLS, NAMESPACE, set(names), done, self.plan.timeout, self.session.alive, what, version
        )

    async def versions(self) -> tuple[str, str]:
        """Where the watches of claims and pools start from."""
        claims = await current_version(self.kube, self.target.claims, NAMESPACE)
        return claims, await current_version(self.kube, POOLS, NAMESPACE)

    async def settle(self) -> tuple[float, float]:
        """Step 1; returns the controller's CPU seconds and time.monotonic() at the moment it settled."""
        plan, state = self.plan, self.session.state
        claims = [n for i in range(plan.pools) for n in claim_names(i, plan.per_pool)]
        pools = [pool_name(i) for i in range(plan.pools)]
        claim_version, pool_version = await self.versions()
        before = await asyncio.to_thread(scrape_requests, state.server, state.admin_token, state.ca_path)
        cpu = cpu_of(self.pid)
        self.result.settled_seconds, lists = await together(
            "settled",
            plan.timeout,
            self.wait_claims(claims, claim_version),
            self.wait_pools(pools, used_is(plan.per_pool), pool_version),
            self.creator.pools(0, plan.pools, plan.per_pool),
        )
        settled, settled_at = cpu_of(self.pid), time.monotonic()
        self.result.settled_cpu_seconds = settled - cpu
        after = await settled_counts(state.server, state.admin_token, state.ca_path)
        driver: RequestCounts = collections.Counter(
            {
                ("POST", f"{IPAM_GROUP}/{self.target.claims.plural}"): plan.claims,
                ("POST", f"{IPAM_GROUP}/{POOLS.plural}"): plan.pools,
                ("LIST", f"{IPAM_GROUP}/{self.target.claims.plural}"): lists[0],
                ("LIST", f"{IPAM_GROUP}/{POOLS.plural}"): lists[1],
            }
        )
        self.result.requests = request_delta(before, after, driver)
        return settled, settled_at

    async def quiet(self, settled_cpu: float, settled_at: float) -> None:
        """Step 2: CPU over the `AFTER_SETTLING` from the moment it settled."""
        await asyncio.sleep(max(0.0, AFTER_SETTLING - (time.monotonic() - settled_at)))
        self.result.quiet_cpu_seconds = cpu_of(self.pid) - settled_cpu

    async def add_pool(self) -> None:
        """Step 3: one more pool, with its claims: until they are fulfilled, and until its status counts them."""
        plan, index = self.plan, self.plan.pools
        claim_version, pool_version = await self.versions()
        cpu, started = cpu_of(self.pid), time.monotonic()
        claims = self.wait_claims(claim_names(index, plan.per_pool), claim_version)
        counted = self.wait_pools([pool_name(index)], used_is(plan.per_pool), pool_version)
        self.result.add_seconds, (fulfilled, _, _) = await together(
            "one more pool",
            plan.timeout,
            since(started, claims),
            counted,
            self.creator.pool_with_claims(index, plan.per_pool),
        )
        self.result.add_cpu_seconds = cpu_of(self.pid) - cpu
        self.result.add_fulfilled_seconds = fulfilled

    async def idle(self) -> None:
        """Step 4: CPU over `idle_seconds` from the moment the one more pool was counted."""
        cpu = cpu_of(self.pid)
        await asyncio.sleep(self.plan.idle_seconds)
        self.result.idle_cpu_seconds = cpu_of(self.pid) - cpu
        self.result.idle_seconds = self.plan.idle_seconds

    async def delete_pool(self) -> None:
        """Step 5: pool-0's claims deleted, then (once they are gone) the pool."""
        claims = claim_names(0, self.plan.per_pool)
        claim_version, pool_version = await self.versions()
        cpu, started = cpu_of(self.pid), time.monotonic()
        await together(
            "delete a pool's claims",
            self.plan.timeout,
            self.wait_claims(claims, claim_version, is_gone),
            self.creator.delete(claims),
        )
        await together(
            "delete a pool",
            self.plan.timeout,
            self.wait_pools([pool_name(0)], is_gone, pool_version),
            self.creator.delete([pool_name(0)], claims=False),
        )
        self.result.delete_seconds = time.monotonic() - started
        self.result.delete_cpu_seconds = cpu_of(self.pid) - cpu


async def _controller(session: Session, plan: PoolsPlan, metrics_url: str | None, result: PoolsResult) -> None:
    kube = await KubeClient.from_kubeconfig(str(session.kubeconfig))
    try:
        await warm_up(kube, session)
        run = ControllerRun(session, kube, plan, result)
        settled_cpu, settled_at = await run.settle()
        print(f"[{result.name}] {plan.pools} pools settled in {result.settled_seconds:.1f} s", flush=True)
        await run.quiet(settled_cpu, settled_at)
        await run.add_pool()
        await run.idle()
        await run.delete_pool()
        if metrics_url is not None and plan.extras:
            await repair_and_scrape(session, metrics_url, plan, result)
        await check_addresses(kube, session.target.addresses, plan.claims, result)
    finally:
        await kube.close()


def measure_pools(session: Session, plan: PoolsPlan, metrics_url: str | None = None) -> PoolsResult:
    """Start the session's controller and run the steps; never raises except on interruption."""
    result = PoolsResult(
        session.target.name, session.target.slug, plan.claims, pools=plan.pools, claims_per_pool=plan.per_pool
    )
    try:
        process = session.start_controller()
        asyncio.run(_controller(session, plan, metrics_url, result))
        result.peak_rss_kib = proc_figures(process.pid)[0]
        print(f"[{result.name}] {plan.pools} pools measured", flush=True)
    except Exception as error:
        result.error = session.failure(error)
        print(f"[{result.name}] {plan.pools} pools: {result.error.splitlines()[0]}", flush=True)
    return result


# -- ours's repair pass and scrape -----------------------------------------------------------------------------


def repair_figures(url: str) -> tuple[dict[str, float], float]:
    """(completed repair passes per backend, seconds all passes took) from our controller's metrics."""
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode()
    passes: dict[str, float] = collections.defaultdict(float)
    seconds = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ipam_provider_repair_passes_total":
                passes[sample.labels["backend"]] += sample.value
            elif sample.name == "ipam_provider_repair_pass_duration_seconds_sum":
                seconds += sample.value
    return passes, seconds


async def pass_completed(url: str, after: float, deadline: float, alive: Callable[[], bool]) -> tuple[float, float]:
    """Wait until more than `after` passes have completed for every backend; (passes, seconds all passes took)."""
    while True:
        passes, seconds = await asyncio.to_thread(repair_figures, url)
        if passes and min(passes.values()) > after:
            return min(passes.values()), seconds
        if not alive():
            raise RuntimeError("the controller exited")
        if time.monotonic() > deadline:
            raise TimeoutError(f"one repair pass: did not finish by the deadline ({after:.0f} passes before)")
        await asyncio.sleep(POLL)


async def repair_and_scrape(session: Session, url: str, plan: PoolsPlan, result: PoolsResult) -> None:
    """API requests of one whole repair pass (between the ends of two passes), then the CPU of one scrape."""
    state, alive = session.state, session.alive
    assert session.process is not None
    deadline = time.monotonic() + 3 * 60 + 120  # two passes at the default interval of 60 s, and the waits
    passes, _ = await asyncio.to_thread(repair_figures, url)
    done, seconds = await pass_completed(url, min(passes.values(), default=0), deadline, alive)
    before = await asyncio.to_thread(scrape_requests, state.server, state.admin_token, state.ca_path)
    _, seconds_after = await pass_completed(url, done, deadline, alive)
    after = await asyncio.to_thread(scrape_requests, state.server, state.admin_token, state.ca_path)
    result.repair_requests = request_delta(before, after, collections.Counter())
    result.repair_pass_seconds = seconds_after - seconds
    _, body, cpu = await asyncio.to_thread(measure_scrapes, url, "", session.process.pid, SCRAPES)
    result.scrape_cpu_seconds, result.scrape_bytes = cpu, len(body)


# -- the limit -------------------------------------------------------------------------------------------------


class LimitRun:
    """The limit's steps: the benchmark's creates and deletes, and our controller's writes for each."""

    def __init__(self, kube: KubeClient, session: Session, plan: PoolsPlan, workers: int) -> None:
        self.kube, self.session, self.plan, self.workers = kube, session, plan, workers
        self.writer = LimitWriter(kube, {})
        self.creator = Creator(kube, session.target)
        self.written: dict[str, Written] = {}
        self.left: dict[str, int] = {}  # claims of a pool still to allocate

    async def allocate(self, claim: Object) -> None:
        pool = claim["spec"]["poolRef"]["name"]
        self.written[claim["metadata"]["name"]] = await self.writer.allocate(claim)
        self.left[pool] -= 1
        if not self.left[pool]:
            await self.writer.report_pool(pool, self.plan.per_pool)

    async def create_and_write(self, first: int, last: int) -> None:
        """Pools first..last-1 and their claims created, and each written for as soon as it exists."""
        jobs: asyncio.Queue[Job | None] = asyncio.Queue()

        def on_pool(pool: Object) -> None:
            self.writer.add_pool(pool)
            self.left[pool["metadata"]["name"]] = self.plan.per_pool
            jobs.put_nowait(lambda: self.writer.protect_pool(pool))

        def on_claim(claim: Object) -> None:
            jobs.put_nowait(lambda: self.allocate(claim))

        async def worker() -> None:
            while (job := await jobs.get()) is not None:
                await job()

        self.creator.on_pool, self.creator.on_claim = on_pool, on_claim
        async with asyncio.TaskGroup() as group:
            for _ in range(self.workers):
                group.create_task(worker())
            await self.creator.pools(first, last, self.plan.per_pool)
            for _ in range(self.workers):
                jobs.put_nowait(None)
        await self.writer.events.flush()

    async def delete_and_release(self) -> None:
        """pool-0's claims deleted and released, then the pool deleted and let go."""
        semaphore = asyncio.Semaphore(self.workers)

        async def one(name: str) -> None:
            await self.creator.delete([name])
            async with semaphore:
                await self.writer.release(self.written.pop(name))

        async with asyncio.TaskGroup() as group:
            for name in claim_names(0, self.plan.per_pool):
                group.create_task(one(name))
        await self.creator.delete([pool_name(0)], claims=False)
        await self.writer.let_pool_go(pool_name(0), NAMESPACE)


async def _limit_steps(run: LimitRun, result: PoolsResult) -> None:
    state, plan = run.session.state, run.plan
    before = await asyncio.to_thread(scrape_requests, state.server, state.admin_token, state.ca_path)
    cpu = time.process_time()
    result.settled_seconds, _ = await together("settled", plan.timeout, run.create_and_write(0, plan.pools))
    result.settled_cpu_seconds = time.process_time() - cpu
    after = await settled_counts(state.server, state.admin_token, state.ca_path)
    driver: RequestCounts = collections.Counter(
        {
            ("POST", f"{IPAM_GROUP}/{run.session.target.claims.plural}"): plan.claims,
            ("POST", f"{IPAM_GROUP}/{POOLS.plural}"): plan.pools,
        }
    )
    result.requests = request_delta(before, after, driver)
    cpu = time.process_time()
    result.add_seconds, _ = await together(
        "one more pool", plan.timeout, run.create_and_write(plan.pools, plan.pools + 1)
    )
    result.add_cpu_seconds = time.process_time() - cpu
    cpu = time.process_time()
    result.delete_seconds, _ = await together("delete a pool", plan.timeout, run.delete_and_release())
    result.delete_cpu_seconds = time.process_time() - cpu


async def _limit(session: Session, plan: PoolsPlan, workers: int, result: PoolsResult) -> None:
    kube = await KubeClient.from_kubeconfig(str(session.kubeconfig))
    run = LimitRun(kube, session, plan, workers)
    run.writer.events.start()
    try:
        await _limit_steps(run, result)
        await check_addresses(kube, session.target.addresses, plan.claims, result)
    finally:
        await run.writer.events.close()
        await kube.close()


def measure_limit_pools(session: Session, plan: PoolsPlan, workers: int) -> PoolsResult:
    """The speed-of-light client through the same steps (no idle step); never raises except on interruption."""
    result = PoolsResult(
        session.target.name, session.target.slug, plan.claims, pools=plan.pools, claims_per_pool=plan.per_pool
    )
    try:
        asyncio.run(_limit(session, plan, workers, result))
        print(f"[limit] {plan.pools} pools written in {result.settled_seconds:.1f} s", flush=True)
    except Exception as error:
        result.error = session.failure(error)
        print(f"[limit] {plan.pools} pools: {result.error.splitlines()[0]}", flush=True)
    return result
