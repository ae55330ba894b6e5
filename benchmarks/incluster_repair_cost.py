"""What the repair loop's listing of an in-cluster pool costs per pass: `list_holdings` (one paginated LIST of the
pool's reservations, by its pool label, pages of `repair.PAGE_SIZE`), for pools holding N reservations.

On a fresh local control plane (`tools.controlplane`, our CRDs): one InClusterIPPool per size, N reservations
created for it as allocation creates them (plus 1,000 reservations of another pool, which the label selector
must leave out). For each size, prints the requests one pass sends (the pacer is awaited once before each
request), the seconds of an unpaced listing (median of `--repeats`), and the seconds at the default pace of
`--repair-requests-per-second` 20.

Run from the repository root: `.venv/bin/python benchmarks/incluster_repair_cost.py [--sizes 1000,10000]`
(~2 min on 2 cores, most of it writing the reservations). Exit status 0 on success.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
from backends.incluster.repair import PAGE_SIZE
from ipam_provider.backend.contract import Allocation, BackendContext, ClaimContext, PoolRef
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES
from tools.controlplane.assets import binaries_dir, our_crd_paths
from tools.controlplane.cluster import LocalControlPlane
from tools.controlplane.crds import install_crds

NAMESPACE = "bench"
IN_FLIGHT = 32
DEFAULT_RATE = 20.0  # --repair-requests-per-second's default
NEIGHBOURS = 1_000


class CountingPacer:
    """Counts requests; at `rate` per second when given, else unpaced."""

    def __init__(self, rate: float | None = None) -> None:
        self.rate = rate
        self.requests = 0
        self._next = 0.0

    async def wait(self) -> None:
        self.requests += 1
        if self.rate is None:
            return
        now = time.monotonic()
        if now < self._next:
            await asyncio.sleep(self._next - now)
        self._next = max(now, self._next) + 1 / self.rate


async def reserve(backend: InClusterBackend, ref: PoolRef, count: int, base: str) -> None:
    semaphore = asyncio.Semaphore(IN_FLIGHT)
    first = ipaddress.ip_address(base)

    async def one(index: int) -> None:
        async with semaphore:
            address = str(first + index)
            made = await backend.ledger.reservations.create(
                ref, Allocation(address, 8, None), ClaimContext(NAMESPACE, f"c-{index}", f"uid-{index}")
            )
            if made is None:
                raise RuntimeError(f"{address} was reserved already")

    await asyncio.gather(*(one(index) for index in range(count)))


async def measure(kubeconfig: Path, sizes: list[int], repeats: int) -> list[tuple[int, int, float, float]]:
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    backend = InClusterBackend(BackendContext(kube=kube))
    rows: list[tuple[int, int, float, float]] = []
    try:
        await install_crds(kube, our_crd_paths())
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        await reserve(backend, IN_CLUSTER_POOL.ref(NAMESPACE, "neighbour"), NEIGHBOURS, "11.0.0.1")
        for size in sizes:
            ref = IN_CLUSTER_POOL.ref(NAMESPACE, f"pool-{size}")
            pool = {"metadata": {"name": ref.name, "namespace": NAMESPACE}, "spec": {}}
            started = time.monotonic()
            await reserve(backend, ref, size, "10.0.0.1")
            print(f"{size} reservations written in {time.monotonic() - started:.0f} s", flush=True)
            timings: list[float] = []
            requests = 0
            for _ in range(repeats):
                pacer = CountingPacer()
                started = time.monotonic()
                holdings = await backend.repair.list_holdings(ref, pool, pacer)
                timings.append(time.monotonic() - started)
                requests = pacer.requests
                if len(holdings) != size:
                    raise RuntimeError(f"listed {len(holdings)} holdings of {size}")
            paced = CountingPacer(DEFAULT_RATE)
            started = time.monotonic()
            await backend.repair.list_holdings(ref, pool, paced)
            rows.append((size, requests, statistics.median(timings), time.monotonic() - started))
    finally:
        await backend.close()
        await kube.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000", help="reservations per pool, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="unpaced listings per size (the median is shown)")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="ipam-repair-cost-"))
    plane = LocalControlPlane(work / "plane", binaries_dir())
    try:
        plane.start()
        rows = asyncio.run(measure(plane.kubeconfig_path, sizes, args.repeats))
    finally:
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nlist_holdings, pages of {PAGE_SIZE} ({NEIGHBOURS} reservations of another pool left out by the selector)")
    print(f"{'reservations':>12} {'requests':>8} {'unpaced s':>10} {f'at {DEFAULT_RATE:.0f}/s s':>10}")
    for size, requests, unpaced, paced in rows:
        print(f"{size:>12,} {requests:>8} {unpaced:>10.2f} {paced:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
