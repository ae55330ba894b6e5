"""What a repair pass costs the core: reading the live IPAddresses and claims from the API server, and comparing.

On a fresh local control plane (`tools.controlplane`), namespace `bench` gets one InClusterIPPool, N claims and
their N IPAddresses, shaped as `cache_memory.py` writes them (a real installation's managed fields and owner
references). Then, with nothing else running:

- the repair loop's fresh read of the live state (`ipam_provider/repair/compare.py`: IPAddresses then claims, in
  pages of 500) is timed unpaced, counting its requests (pages), and again paced at `--rate` requests a second
  (the `--repair-requests-per-second` default is 20);
- the comparison of one pool holding all N addresses with that state (`compare.py`: every holding accounted for,
  as in steady state) is timed on the CPU.

The backend's own listing comes on top; each backend measures it in its doc. Run from the repository root:
`.venv/bin/python benchmarks/repair_cost.py [--objects 2000] [--rate 20]`. Exit status 0 on success.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.incluster.backend import IN_CLUSTER_POOL
from benchmarks.cache_memory import NAMESPACE, POOL, populate
from ipam_provider.backend.contract import PoolKind, PoolRef
from ipam_provider.backend.repair import Holding
from ipam_provider.repair.compare import LiveState, Scope, compare_pool, read_live
from ipam_provider.repair.pacer import CountingPacer, RatePacer
from ipam_provider.runtime.kube.client import KubeClient
from tools.controlplane.assets import binaries_dir
from tools.controlplane.cluster import LocalControlPlane


def kind_of(group: str, kind: str) -> PoolKind | None:
    return IN_CLUSTER_POOL if (group, kind) == (IN_CLUSTER_POOL.group, IN_CLUSTER_POOL.kind) else None


async def measure(kubeconfig: Path, objects: int, rate: float) -> dict[str, float]:
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    scope = Scope([NAMESPACE])
    try:
        await read_live(kube, scope, kind_of, CountingPacer())  # warm the connection
        counting = CountingPacer()
        wall, cpu = time.perf_counter(), time.process_time()
        live = await read_live(kube, scope, kind_of, counting)
        unpaced_wall, unpaced_cpu = time.perf_counter() - wall, time.process_time() - cpu
        wall = time.perf_counter()
        await read_live(kube, scope, kind_of, RatePacer(rate))
        paced = time.perf_counter() - wall
    finally:
        await kube.close()
    ref = IN_CLUSTER_POOL.ref(NAMESPACE, POOL)
    holdings = holdings_of(live, ref)
    cpu = time.process_time()
    comparison = compare_pool(ref, holdings, live, scope)
    compared = time.process_time() - cpu
    if len(holdings) != objects or comparison.suspected or comparison.unrecorded:
        raise RuntimeError(f"not the steady state: {len(holdings)} holdings, {comparison}")
    return {
        "pages": counting.waits,
        "unpaced_seconds": unpaced_wall,
        "unpaced_cpu_seconds": unpaced_cpu,
        "paced_seconds": paced,
        "compare_cpu_seconds": compared,
    }


def holdings_of(live: LiveState, ref: PoolRef) -> list[Holding]:
    """What a backend holding every live IPAddress of the pool would list."""
    holdings = []
    for address in live.addresses_of(ref):
        meta = address["metadata"]
        owner = next(r["uid"] for r in meta["ownerReferences"] if r["kind"] == "IPAddressClaim")
        claim = f"{meta['namespace']}/{meta['name']}"
        holdings.append(Holding(address["spec"]["address"], claim, owner, meta["name"]))
    return holdings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=2_000, help="claims, and as many IPAddresses (2,000)")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second of the paced read (20)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ipam-repair-cost-"))
    plane = LocalControlPlane(work / "plane", binaries_dir())
    try:
        plane.start()
        started = time.monotonic()
        asyncio.run(populate(plane.kubeconfig_path, args.objects))
        print(f"{args.objects} claims and IPAddresses written in {time.monotonic() - started:.0f} s", flush=True)
        figures = asyncio.run(measure(plane.kubeconfig_path, args.objects, args.rate))
    finally:
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"objects (claims, and as many IPAddresses): {args.objects}")
    print(f"API server list pages per pass:             {figures['pages']:.0f}")
    print(
        f"read, unpaced:                               {figures['unpaced_seconds']:.2f} s wall, "
        f"{figures['unpaced_cpu_seconds']:.2f} s CPU"
    )
    print(f"read, paced at {args.rate:g} requests/s:               {figures['paced_seconds']:.2f} s wall")
    print(f"compare one pool of {args.objects} holdings:          {figures['compare_cpu_seconds'] * 1000:.0f} ms CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
