"""Allocation throughput and NetBox HTTP requests per allocation: our NetBox backend against plain pynetbox loops,
measured in the same run against the same real NetBox.

Variants (each on its own fresh /24 prefix, N allocations, one after another, never two at once):
- ours, one pool: `NetboxBackend.allocate()` called for N new claims one at a time, as the reconciler calls it for
  one pool (its calls for one pool are serialised), after one warm-up claim (which creates the ownership marks
  and resolves the source). Then the steady state of fulfilled claims (`allocate(existing=…)` for all N, as every
  later reconcile does) and N releases.
- ours, P pools: the same N claims spread over P pools allocated concurrently (the reconciler runs pools in
  parallel); the backend's semaphore keeps at most `workers` requests in flight to NetBox.
- plain pynetbox: the idiomatic sequential loop, `nb.ipam.prefixes.get(prefix=…)` then
  `prefix.available_ips.create({...})` per allocation, with the same tag and custom field.
- plain pynetbox + list per claim: the same loop that first lists every tagged address (to find one for the claim),
  the O(n) pattern of the existing NetBox provider.

Requests are counted with a `requests` response hook on every session (ours: `NetboxClient.requests_sent`).
The backend reads its Secret through a stand-in for the Kubernetes client that returns the Secret from memory; no
API server is involved and NetBox is never mocked.

NetBox: NETBOX_URL and NETBOX_TOKEN name a running one; the run then uses four /24 prefixes that do not exist there
yet, and deletes afterwards only what it created: its prefixes, and the IP addresses that carry the owner tag and
one of the claim UIDs this run made (never an address someone else holds in those prefixes). Otherwise
hack/netbox/install.sh and start.sh start one in a temporary directory and stop.sh stops it at the end.

Run from the repository root: `.venv/bin/python benchmarks/netbox_throughput.py [--allocations 200] [--pools 4]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynetbox
import structlog

from backends.netbox import NetboxBackend, NetboxSettings
from backends.netbox.spec import CLAIM_UID_FIELD, OWNER_TAG
from ipam_provider.backend.contract import Allocation, BackendContext, ClaimContext, PoolRef
from ipam_provider.runtime.kube.client import KubeClient

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "bench"
RUN_UIDS: set[str] = set()  # every claim UID this run used: what it may delete afterwards


def new_uid() -> str:
    uid = str(uuid.uuid4())
    RUN_UIDS.add(uid)
    return uid


@dataclass
class Figure:
    name: str
    operations: int
    seconds: float
    requests: int

    @property
    def per_second(self) -> float:
        return self.operations / self.seconds if self.seconds else 0.0

    @property
    def per_operation(self) -> float:
        return self.requests / self.operations if self.operations else 0.0


class SecretsOnly:
    """Stands in for KubeClient where the backend reads its Secret (`get` of a Secret), and nothing else."""

    def __init__(self, url: str, token: str) -> None:
        self._secret = {"metadata": {"name": "netbox"}, "stringData": {"url": url, "token": token}}

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self._secret if name == "netbox" else None


@contextmanager
def netbox_instance() -> Iterator[tuple[str, str, bool]]:
    """(url, token, owned): the NetBox of NETBOX_URL/NETBOX_TOKEN, or one started here and stopped afterwards."""
    url, token = os.environ.get("NETBOX_URL"), os.environ.get("NETBOX_TOKEN")
    if url and token:
        yield url, token, False
        return
    run_dir = Path(tempfile.mkdtemp(prefix="netbox-bench-"))
    started = time.monotonic()
    subprocess.run([str(REPO / "hack/netbox/install.sh")], check=True, capture_output=True)
    subprocess.run([str(REPO / "hack/netbox/start.sh"), str(run_dir)], check=True, capture_output=True)
    print(f"NetBox started in {time.monotonic() - started:.1f} s (install.sh + start.sh)")
    env = dict(line.split("=", 1) for line in (run_dir / "netbox.env").read_text().splitlines() if "=" in line)
    try:
        yield env["NETBOX_URL"], env["NETBOX_TOKEN"], True
    finally:
        subprocess.run([str(REPO / "hack/netbox/stop.sh"), str(run_dir)], check=False, capture_output=True)


def counted_api(url: str, token: str) -> tuple[Any, list[int]]:
    api = pynetbox.api(url, token=token)
    count = [0]
    api.http_session.hooks["response"].append(lambda response, *a, **k: count.__setitem__(0, count[0] + 1))
    return api, count


def pool(name: str, cidr: str) -> dict[str, Any]:
    return {
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
        "kind": "NetboxIPPool",
        "metadata": {"name": name, "namespace": NAMESPACE, "generation": 1},
        "spec": {"connection": {"secretRef": {"name": "netbox"}}, "sources": [{"prefix": {"cidr": cidr}}]},
    }


def claims(count: int, prefix: str) -> list[ClaimContext]:
    return [ClaimContext(NAMESPACE, f"{prefix}-{i}", new_uid()) for i in range(count)]


async def bench_ours(url: str, token: str, cidrs: list[str], n: int, pools: int, workers: int) -> list[Figure]:
    settings = NetboxSettings()
    settings = NetboxSettings(client=type(settings.client)(workers=workers))
    backend = NetboxBackend(BackendContext(kube=cast(KubeClient, SecretsOnly(url, token))), settings)
    figures = []
    try:
        one = pool("one", cidrs[0])
        await backend.allocate(PoolRef.from_object(one), one, ClaimContext(NAMESPACE, "warm-up", new_uid()))
        client = await backend.resolver.connections.client(backend.resolver.parse(PoolRef.from_object(one), one))
        wanted = claims(n, "one")
        before, started = client.requests_sent, time.perf_counter()
        allocations = [await backend.allocate(PoolRef.from_object(one), one, c) for c in wanted]
        figures.append(
            Figure("ours, 1 pool (new claims)", n, time.perf_counter() - started, client.requests_sent - before)
        )
        assert len({a.address for a in allocations}) == n, "an address was handed out twice"
        before, started = client.requests_sent, time.perf_counter()
        for c, a in zip(wanted, allocations, strict=True):
            await backend.allocate(PoolRef.from_object(one), one, c, existing=a)
        figures.append(
            Figure(
                "ours, fulfilled claims re-reconciled", n, time.perf_counter() - started, client.requests_sent - before
            )
        )
        before, started = client.requests_sent, time.perf_counter()
        ref = backend.resolver.parse(PoolRef.from_object(one), one).ref
        for c, a in zip(wanted, allocations, strict=True):
            await backend.release(ref, one, c, a)
        figures.append(Figure("ours, releases", n, time.perf_counter() - started, client.requests_sent - before))

        many = [pool(f"p{i}", cidrs[1]) for i in range(pools)]
        for i, p in enumerate(many):
            await backend.allocate(PoolRef.from_object(p), p, ClaimContext(NAMESPACE, f"warm-{i}", new_uid()))
        per_pool = [claims(n // pools, f"p{i}") for i in range(pools)]
        before, started = client.requests_sent, time.perf_counter()

        async def serve(p: dict[str, Any], cs: list[ClaimContext]) -> list[Allocation]:
            return [await backend.allocate(PoolRef.from_object(p), p, c) for c in cs]

        results = await asyncio.gather(*(serve(p, cs) for p, cs in zip(many, per_pool, strict=True)))
        done = sum(len(r) for r in results)
        figures.append(
            Figure(
                f"ours, {pools} pools in parallel", done, time.perf_counter() - started, client.requests_sent - before
            )
        )
        assert len({a.address for r in results for a in r}) == done, "an address was handed out twice"
    finally:
        await backend.close()
    return figures


def bench_plain(url: str, token: str, cidr: str, n: int, *, list_per_claim: bool) -> Figure:
    api, count = counted_api(url, token)
    tag = api.extras.tags.get(slug=OWNER_TAG)
    before, started = count[0], time.perf_counter()
    for _ in range(n):
        uid = new_uid()
        if list_per_claim:
            held = [
                a for a in api.ipam.ip_addresses.filter(tag=OWNER_TAG) if a.custom_fields.get(CLAIM_UID_FIELD) == uid
            ]
            if held:
                continue
        prefix = api.ipam.prefixes.get(prefix=cidr)
        prefix.available_ips.create({"tags": [tag.id], "custom_fields": {CLAIM_UID_FIELD: uid}})
    name = "plain pynetbox + list per claim" if list_per_claim else "plain pynetbox loop"
    return Figure(name, n, time.perf_counter() - started, count[0] - before)


def free_cidrs(api: Any) -> list[str]:
    """Four 10.x.y.0/24 prefixes of which NetBox holds neither a prefix nor an address yet."""
    for _ in range(50):
        base = random.randint(0, 250)
        cidrs = [f"10.{base}.{i}.0/24" for i in range(4)]
        if not any(api.ipam.prefixes.count(within_include=c) or api.ipam.ip_addresses.count(parent=c) for c in cidrs):
            return cidrs
    raise SystemExit("found no four free 10.x.y.0/24 prefixes in NetBox for the benchmark")


def delete_run_addresses(api: Any, cidrs: list[str]) -> None:
    """Delete the IP addresses this run created: ours (owner tag) with one of this run's claim UIDs."""
    for cidr in cidrs:
        mine = [
            a
            for a in api.ipam.ip_addresses.filter(parent=cidr, tag=OWNER_TAG)
            if (a.custom_fields or {}).get(CLAIM_UID_FIELD) in RUN_UIDS
        ]
        if mine:
            api.ipam.ip_addresses.delete(mine)


def print_table(figures: list[Figure]) -> None:
    print("\n| variant | operations | seconds | per second | NetBox requests | requests/operation |")
    print("|---|---|---|---|---|---|")
    for f in figures:
        cells = [f.name, str(f.operations), f"{f.seconds:.2f}", f"{f.per_second:.1f}", str(f.requests)]
        print("| " + " | ".join([*cells, f"{f.per_operation:.2f}"]) + " |")
    by_name = {f.name: f for f in figures}
    ours, plain = by_name["ours, 1 pool (new claims)"], by_name["plain pynetbox loop"]
    print(
        f"\nours/plain (sequential): throughput {ours.per_second / plain.per_second:.2f}x, "
        f"requests per allocation {ours.per_operation:.2f} vs {plain.per_operation:.2f} "
        f"({ours.per_operation / plain.per_operation:.2f}x)"
    )
    listing = by_name["plain pynetbox + list per claim"]
    print(
        f"ours/list-per-claim: throughput {ours.per_second / listing.per_second:.2f}x, "
        f"{listing.per_operation:.2f} requests per allocation there"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocations", type=int, default=100, help="allocations per variant (≤ 250)")
    parser.add_argument("--pools", type=int, default=4, help="pools allocated in parallel in the P-pool variant")
    parser.add_argument("--workers", type=int, default=4, help="the backend's requests in flight per NetBox URL")
    args = parser.parse_args()
    n = min(args.allocations, 250)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    with netbox_instance() as (url, token, owned):
        api = pynetbox.api(url, token=token)
        cidrs = free_cidrs(api)
        created = [api.ipam.prefixes.create(prefix=c, description="netbox_throughput benchmark") for c in cidrs]
        try:
            figures = asyncio.run(bench_ours(url, token, cidrs[:2], n, args.pools, args.workers))
            figures.append(bench_plain(url, token, cidrs[2], n, list_per_claim=False))
            figures.append(bench_plain(url, token, cidrs[3], n, list_per_claim=True))
        finally:
            if not owned:
                delete_run_addresses(api, cidrs)
                api.ipam.prefixes.delete(created)
        print(f"NetBox {api.status()['netbox-version']} at {url}, {n} allocations per variant, {os.cpu_count()} cores")
        print_table(figures)
        steady = next(f for f in figures if f.name == "ours, 1 pool (new claims)")
        return 0 if steady.per_operation <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
