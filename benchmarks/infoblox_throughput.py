"""WAPI requests per allocation and allocations per second of the Infoblox backend, against the WAPI simulator, next
to a naive baseline measured in the same run.

Both allocate through the real infoblox-client from the same TLS simulator, P pools at once with the claims of one
pool one after another (as the controller serialises them), after one warm-up allocation per pool:

- ours: `InfobloxBackend.allocate` (one POST of a fixedaddress with func:nextavailableip, ownership attributes and
  _return_fields). The InfobloxInstance and its Secret come from an in-memory stand-in for the API server;
- baseline: the pattern of telekom/cluster-api-ipam-provider-infoblox: GET the network, POST a fixedaddress with
  func:nextavailableip on its reference (the answer is a bare reference), GET the object to learn its address.

Requests are counted by the simulator's request log. `--latency-ms` adds that much to every WAPI request (a grid
is not on loopback; NIOS takes tens of milliseconds per write), which is where fewer requests pay off.

Run from the repository root: `.venv/bin/python benchmarks/infoblox_throughput.py [--claims 400] [--pools 4]
[--latency-ms 5]`. Exit status 0, or 1 when a run handed out an address twice or failed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infoblox_client.connector import Connector

from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.spec import INSTANCES
from ipam_provider.backend.contract import BackendContext, ClaimContext, PoolRef
from ipam_provider.common import Object
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS, Resource
from ipam_provider.runtime.logconfig import configure_logging
from tools.wapi_simulator import WapiSimulator


class MemoryKube:
    """What the backend reads and writes of the API server (get, status patch), kept in memory."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], Object] = {}

    def put(self, resource: Resource, obj: Object) -> None:
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta.setdefault("resourceVersion", "1")
        self.objects[(resource.plural, meta.get("namespace"), meta["name"])] = obj

    async def get(self, resource: Resource, name: str, namespace: str | None = None) -> Object | None:
        found = self.objects.get((resource.plural, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def patch(
        self, resource: Resource, name: str, patch: Object, namespace: str | None = None, **_: Any
    ) -> Object:
        obj = self.objects[(resource.plural, namespace, name)]
        obj.setdefault("status", {}).update(patch.get("status", {}))
        return copy.deepcopy(obj)


@dataclass
class Result:
    name: str
    allocations: int
    seconds: float
    requests: int
    addresses: list[str]

    @property
    def per_allocation(self) -> float:
        return self.requests / self.allocations

    @property
    def rate(self) -> float:
        return self.allocations / self.seconds

    @property
    def duplicates(self) -> int:
        return len(self.addresses) - len(set(self.addresses))


def pool_object(index: int, instance: str) -> Object:
    return {
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
        "kind": "InfobloxIPPool",
        "metadata": {"name": f"pool-{index}", "namespace": "bench", "uid": str(uuid.uuid4()), "generation": 1},
        "spec": {"instanceRef": {"name": instance}, "subnets": [{"cidr": f"10.{100 + index}.0.0/16"}]},
    }


def claim(pool: int, number: int) -> ClaimContext:
    return ClaimContext(namespace="bench", name=f"p{pool}-c{number}", uid=str(uuid.uuid4()), cluster_name="bench")


async def measure(
    name: str, sim: WapiSimulator, pools: int, per_pool: int, allocate: Callable[[int, int], Awaitable[str]]
) -> Result:
    """Warm up (one allocation per pool), then `per_pool` allocations in each pool, pools in parallel."""
    await asyncio.gather(*(allocate(p, -1) for p in range(pools)))
    sim.request_log.reset()
    addresses: list[str] = []

    async def serve(pool: int) -> None:
        for number in range(per_pool):
            addresses.append(await allocate(pool, number))

    started = time.perf_counter()
    await asyncio.gather(*(serve(p) for p in range(pools)))
    seconds = time.perf_counter() - started
    return Result(name, pools * per_pool, seconds, len(sim.request_log), addresses)


async def ours(sim: WapiSimulator, pools: int, per_pool: int) -> Result:
    kube = MemoryKube()
    assert sim.ca_path is not None
    data = {"username": sim.username, "password": sim.password}
    secret = {"metadata": {"name": "wapi", "namespace": "bench"}, "data": {k: _b64(v) for k, v in data.items()}}
    kube.put(SECRETS, secret)
    spec = {
        "host": sim.host,
        "port": sim.port,
        "wapiVersion": sim.wapi_version,
        "credentialsSecretRef": {"name": "wapi", "namespace": "bench"},
        "caBundle": sim.ca_path.read_text(),
        "maxConcurrentRequests": pools,
        "allowedNamespaces": {"list": ["bench"]},
    }
    kube.put(INSTANCES, {"metadata": {"name": "grid"}, "spec": spec})
    kube.put(
        NAMESPACES,
        {"metadata": {"name": "bench", "labels": {"ipam.cluster.x-k8s.io/allow-cluster-scoped-secret-refs": "true"}}},
    )  # lends its Secret to the instance
    backend = InfobloxBackend(BackendContext(kube=cast(Any, kube)))
    objects = [pool_object(p, "grid") for p in range(pools)]
    for obj in objects:
        report = await backend.report(PoolRef.from_object(obj), obj, [])
        assert report.ready, report.message

    async def allocate(pool: int, number: int) -> str:
        return (await backend.allocate(PoolRef.from_object(objects[pool]), objects[pool], claim(pool, number))).address

    try:
        return await measure("ours (1 POST, _return_fields)", sim, pools, per_pool, allocate)
    finally:
        await backend.close()


async def baseline(sim: WapiSimulator, pools: int, per_pool: int) -> Result:
    connector = Connector(sim.connector_options(http_pool_maxsize=pools, http_pool_connections=pools))
    semaphore = asyncio.Semaphore(pools)

    def allocate_blocking(pool: int) -> str:
        cidr = f"10.{100 + pool}.0.0/16"
        (network,) = connector.get_object("network", {"network": cidr, "network_view": "default"})
        payload = {"ipv4addr": f"func:nextavailableip:{network['_ref']},default", "mac": "00:00:00:00:00:00"}
        ref = connector.create_object("fixedaddress", payload)
        return str(connector.get_object(ref, return_fields=["ipv4addr"])["ipv4addr"])

    async def allocate(pool: int, number: int) -> str:
        async with semaphore:
            return await asyncio.to_thread(allocate_blocking, pool)

    try:
        return await measure("baseline (GET network, POST, GET object)", sim, pools, per_pool, allocate)
    finally:
        connector.session.close()


def _b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def fresh_simulator(pools: int, latency: float) -> WapiSimulator:
    sim = WapiSimulator().start()
    for pool in range(pools):
        sim.state.add_network(f"10.{100 + pool}.0.0/16")
    if latency > 0:
        sim.faults.add_latency(latency)
    return sim


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=400, help="allocations per run (default 400)")
    parser.add_argument("--pools", type=int, default=4, help="pools allocated from in parallel (default 4)")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="added to every WAPI request (default 5)")
    args = parser.parse_args()
    configure_logging(level="warning")
    per_pool = max(1, args.claims // args.pools)
    results: list[Result] = []
    for run in (ours, baseline):
        sim = fresh_simulator(args.pools, args.latency_ms / 1000)
        try:
            results.append(await run(sim, args.pools, per_pool))
        finally:
            sim.stop()
    print(
        f"\nInfobloxIPPool allocation against the WAPI simulator (TLS, infoblox-client 0.6.2), {args.pools} pools "
        f"in parallel, {per_pool} claims each, {args.latency_ms:g} ms added per request\n"
    )
    print(f"{'run':<44} {'allocations':>11} {'WAPI req/alloc':>15} {'alloc/s':>9} {'seconds':>8} {'dupes':>6}")
    for r in results:
        print(
            f"{r.name:<44} {r.allocations:>11} {r.per_allocation:>15.2f} {r.rate:>9.1f} {r.seconds:>8.2f} "
            f"{r.duplicates:>6}"
        )
    mine, theirs = results
    print(
        f"\nratio: {theirs.per_allocation / mine.per_allocation:.2f}x fewer WAPI requests per allocation, "
        f"{mine.rate / theirs.rate:.2f}x the allocations per second"
    )
    return 1 if any(r.duplicates for r in results) else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
