"""What one repair pass's listing costs on the Infoblox backend: WAPI requests and seconds of `list_holdings` for a
pool holding N marked objects, paced at a given rate and unpaced, against the WAPI simulator (TLS, the real
infoblox-client).

The pool's objects are seeded straight into the simulator (fixed addresses carrying the ownership attributes), then
`InfobloxBackend.list_holdings` lists them once per run: one paged search per object type (fixedaddress,
ipv6fixedaddress, record:host), `pacer.wait()` before each page. The pacer here spaces waits `1/rate` apart, as the
repair loop's `--repair-requests-per-second` does. Requests are counted by the simulator's request log.

Run from the repository root: `.venv/bin/python benchmarks/infoblox_repair_cost.py [--objects 1000 10000]
[--rate 20] [--page-size 1000] [--latency-ms 0]`. Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import INSTANCES
from benchmarks.infoblox_throughput import MemoryKube, _b64
from ipam_provider.backend.contract import BackendContext, PoolRef
from ipam_provider.common import Object
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS
from ipam_provider.runtime.logconfig import configure_logging
from tools.wapi_simulator import WapiSimulator

LABEL = "bench/pool"


class IntervalPacer:
    """Spaces waits at least `1/rate` seconds apart (rate 0: no waiting)."""

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._next = 0.0

    async def wait(self) -> None:
        now = time.monotonic()
        if self._next > now:
            await asyncio.sleep(self._next - now)
        self._next = max(now, self._next) + self._interval


@dataclass
class Row:
    objects: int
    rate: float
    requests: int
    pages: int
    seconds: float
    listed: int


def seeded_simulator(objects: int, latency: float) -> WapiSimulator:
    """A simulator whose /16 holds `objects` fixed addresses of the pool, each for its own claim."""
    sim = WapiSimulator().start()
    sim.state.add_network("10.100.0.0/16")
    for name in ("CAPI-Claim-UID", "CAPI-Claim-Namespace", "CAPI-Claim-Name", "CAPI-Cluster-Name", "CAPI-Pool"):
        sim.state.add_ea_definition(name)
    for number in range(objects):
        address = f"10.100.{1 + number // 250}.{1 + number % 250}"
        marks = {
            "CAPI-Claim-UID": str(uuid.uuid4()),
            "CAPI-Claim-Namespace": "bench",
            "CAPI-Claim-Name": f"c{number}",
            "CAPI-Pool": LABEL,
        }
        sim.state.add_fixed_address(address, extattrs=marks)
    if latency > 0:
        sim.faults.add_latency(latency)
    return sim


def backend_for(sim: WapiSimulator, page_size: int) -> tuple[InfobloxBackend, Object]:
    kube = MemoryKube()
    assert sim.ca_path is not None
    data = {"username": sim.username, "password": sim.password}
    kube.put(
        SECRETS, {"metadata": {"name": "wapi", "namespace": "bench"}, "data": {k: _b64(v) for k, v in data.items()}}
    )
    spec = {
        "host": sim.host,
        "port": sim.port,
        "wapiVersion": sim.wapi_version,
        "credentialsSecretRef": {"name": "wapi", "namespace": "bench"},
        "caBundle": sim.ca_path.read_text(),
        "allowedNamespaces": {"list": ["bench"]},
    }
    kube.put(INSTANCES, {"metadata": {"name": "grid"}, "spec": spec})
    kube.put(
        NAMESPACES,
        {"metadata": {"name": "bench", "labels": {"ipam.cluster.x-k8s.io/allow-cluster-scoped-secret-refs": "true"}}},
    )  # lends its Secret to the instance
    settings = replace(InfobloxSettings(), repair_page_size=page_size)
    backend = InfobloxBackend(BackendContext(kube=cast(Any, kube)), settings)
    pool = {
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
        "kind": "InfobloxIPPool",
        "metadata": {"name": "pool", "namespace": "bench", "uid": str(uuid.uuid4()), "generation": 1},
        "spec": {"instanceRef": {"name": "grid"}, "subnets": [{"cidr": "10.100.0.0/16"}]},
    }
    return backend, pool


async def measure(objects: int, rates: list[float], page_size: int, latency: float) -> list[Row]:
    sim = seeded_simulator(objects, latency)
    backend, pool = backend_for(sim, page_size)
    ref = PoolRef.from_object(pool)
    rows: list[Row] = []
    try:
        await backend.list_holdings(ref, pool, IntervalPacer(0))  # warm-up: connection, login, attribute check
        for rate in rates:
            sim.request_log.reset()
            started = time.perf_counter()
            listed = await backend.list_holdings(ref, pool, IntervalPacer(rate))
            seconds = time.perf_counter() - started
            pages = sum(1 for r in sim.request_log.entries if r.method == "GET" and "_paging=1" in r.query)
            rows.append(Row(objects, rate, len(sim.request_log), pages, seconds, len(listed)))
    finally:
        await backend.close()
        sim.stop()
    return rows


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, nargs="+", default=[1000, 10000], help="objects in the pool")
    parser.add_argument("--rate", type=float, default=20.0, help="paced requests per second (default 20)")
    parser.add_argument("--page-size", type=int, default=1000, help="objects per page (default 1000)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every WAPI request (default 0)")
    args = parser.parse_args()
    configure_logging(level="warning")
    rows: list[Row] = []
    for objects in args.objects:
        rows += await measure(objects, [args.rate, 0.0], args.page_size, args.latency_ms / 1000)
    print(
        f"\nInfoblox repair listing (list_holdings) of one pool against the WAPI simulator (TLS, infoblox-client), "
        f"pages of {args.page_size}, {args.latency_ms:g} ms added per request\n"
    )
    print(f"{'objects':>8} {'pace':>10} {'requests':>9} {'expected':>9} {'seconds':>8} {'listed':>7}")
    wrong = 0
    for row in rows:
        expected = math.ceil(row.objects / args.page_size) + 2  # + one empty page of each of the other two types
        pace = f"{row.rate:g} req/s" if row.rate else "unpaced"
        print(f"{row.objects:>8} {pace:>10} {row.requests:>9} {expected:>9} {row.seconds:>8.2f} {row.listed:>7}")
        wrong += row.listed != row.objects or row.requests != expected
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
