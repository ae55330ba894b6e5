"""What the controller's caches hold with many objects: whole objects as the API server sends them, against the
projection the stores keep (`ipam_provider/cache.py`).

On a fresh local control plane (`tools.controlplane`, our CRDs and Cluster API's): namespace `bench`, one
InClusterIPPool, N IPAddressClaims and N IPAddresses shaped as in a real installation:

- each claim is created by server-side apply under the field manager `cluster-api` (cluster-name label, a
  controller ownerReference to an infrastructure machine, spec.poolRef and clusterName), then gets our
  ReleaseAddress finalizer (merge patch) and our status (Ready condition, addressRef), both under our field
  manager, as the controller writes them; so its managedFields have three entries, as such a claim's do;
- each IPAddress is created as the controller creates it (owner references to its claim and the pool, the
  ProtectAddress finalizer, the cluster-name label).

Then, for each mode, a separate Python process builds the controller's caches (`Caches.serve`, or the same
stores keeping whole objects for `full`), fills them, and reports the bytes the two stores hold (tracemalloc: what
is allocated with the stores alive less what is left once they are dropped); another process does the same
without tracemalloc and reports its RSS once filled, and its peak RSS. Nothing else runs: no controller, no
reconcile. The stores are filled two ways:

- `list`: the claim and IPAddress informers run until synced (a restart: the objects come in LIST pages of 500,
  whose JSON decoding shares the key strings within a page);
- `events`: each object is decoded on its own, as a watch event or the answer to a write is (a controller that
  saw the objects being created and fulfilled them), then stored.

Run from the repository root: `.venv/bin/python benchmarks/cache_memory.py [--objects 10000]` (~6 min on 2
cores, most of it writing the objects). Exit status 0 on success.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.incluster.backend import IN_CLUSTER_POOL
from ipam_provider.api.capi import (
    ADDRESSES,
    CLAIMS,
    FINALIZER_PROTECT_ADDRESS,
    FINALIZER_RELEASE_ADDRESS,
    LABEL_CLUSTER_NAME,
)
from ipam_provider.cache import Caches
from ipam_provider.common import Object
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.cache.informer import Informer
from ipam_provider.runtime.cache.store import Store
from ipam_provider.runtime.kube.client import KubeClient, apply_patch
from ipam_provider.runtime.kube.resources import NAMESPACES
from tools.controlplane.assets import binaries_dir, capi_crd_paths, our_crd_paths
from tools.controlplane.cluster import LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import load_versions

NAMESPACE = "bench"
POOL = "pool"
POOLS = pool_resource(IN_CLUSTER_POOL)
IN_FLIGHT = 32
MODES = ("full", "projected")
FEEDS = ("list", "events")


# -- the objects ------------------------------------------------------------------------------------------------


def claim_apply(index: int) -> Object:
    name, cluster = f"claim-{index}", f"cluster-{index % 100}"
    owner = {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
        "kind": "VSphereMachine",
        "name": f"{cluster}-md-0-{index}",
        "uid": str(uuid.uuid4()),
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "apiVersion": CLAIMS.api_version,
        "kind": CLAIMS.kind,
        "metadata": {"name": name, "labels": {LABEL_CLUSTER_NAME: cluster}, "ownerReferences": [owner]},
        "spec": {
            "poolRef": {"apiGroup": IN_CLUSTER_POOL.group, "kind": IN_CLUSTER_POOL.kind, "name": POOL},
            "clusterName": cluster,
        },
    }


def address_text(index: int) -> str:
    return str(ipaddress.IPv4Address(0x0A_00_00_02 + index))


def claim_status(index: int) -> Object:
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "AddressAllocated",
        "message": f"{address_text(index)}/16 allocated from InClusterIPPool {NAMESPACE}/{POOL}",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "observedGeneration": 1,
    }
    return {"status": {"addressRef": {"name": f"claim-{index}"}, "conditions": [condition]}}


def address_body(index: int, claim: Object, pool: Object) -> Object:
    name = claim["metadata"]["name"]
    owners = [
        {"apiVersion": CLAIMS.api_version, "kind": CLAIMS.kind, "name": name, "uid": claim["metadata"]["uid"]},
        {"apiVersion": POOLS.api_version, "kind": POOLS.kind, "name": POOL, "uid": pool["metadata"]["uid"]},
    ]
    owners[0] |= {"controller": True, "blockOwnerDeletion": True}
    owners[1] |= {"controller": False, "blockOwnerDeletion": True}
    return {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {
            "name": name,
            "labels": {LABEL_CLUSTER_NAME: claim["spec"]["clusterName"]},
            "finalizers": [FINALIZER_PROTECT_ADDRESS],
            "ownerReferences": owners,
        },
        "spec": {
            "claimRef": {"name": name},
            "poolRef": {"apiGroup": IN_CLUSTER_POOL.group, "kind": IN_CLUSTER_POOL.kind, "name": POOL},
            "address": address_text(index),
            "prefix": 16,
            "gateway": "10.0.0.1",
        },
    }


async def populate(kubeconfig: Path, objects: int) -> None:
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        await install_crds(kube, [*capi_crd_paths(load_versions()), *our_crd_paths()])
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        spec = {"addresses": ["10.0.0.0/8"], "prefix": 16, "gateway": "10.0.0.1"}
        body = {"apiVersion": POOLS.api_version, "kind": POOLS.kind, "metadata": {"name": POOL}, "spec": spec}
        pool = await kube.create(POOLS, body, NAMESPACE)
        semaphore = asyncio.Semaphore(IN_FLIGHT)

        async def one(index: int) -> None:
            async with semaphore:
                name = f"claim-{index}"
                await kube.patch(CLAIMS, name, claim_apply(index), NAMESPACE, form=apply_patch("cluster-api"))
                finalizer = {"metadata": {"finalizers": [FINALIZER_RELEASE_ADDRESS]}}
                await kube.patch(CLAIMS, name, finalizer, NAMESPACE)
                claim = await kube.patch(CLAIMS, name, claim_status(index), NAMESPACE, subresource="status")
                await kube.create(ADDRESSES, address_body(index, claim, pool), NAMESPACE)

        await asyncio.gather(*(one(i) for i in range(objects)))
    finally:
        await kube.close()


# -- one measurement (a child process) --------------------------------------------------------------------------


def keep_whole(obj: Object) -> Object:
    return obj


def rss_kib() -> dict[str, int]:
    figures = {}
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            figures[key] = int(value.split()[0])
    return figures


async def sync(kubeconfig: Path, caches: Caches, feed: str) -> None:
    """Fill the claim and IPAddress stores: `list`: run their informers until both have synced, then stop them;
    `events`: each object decoded on its own, as a watch event or a write's answer is, then stored."""
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        if feed == "events":
            for resource, store in ((CLAIMS, caches.claims), (ADDRESSES, caches.addresses)):
                items, _ = await kube.list(resource, NAMESPACE)
                texts = [json.dumps(item) for item in items]
                del items
                for text in texts:
                    store.upsert(json.loads(text))
            return
        informers = [
            Informer(kube, CLAIMS, caches.claims, lambda *_: None, namespaces=[NAMESPACE]),
            Informer(kube, ADDRESSES, caches.addresses, lambda *_: None, namespaces=[NAMESPACE]),
        ]
        tasks = [asyncio.create_task(informer.run()) for informer in informers]
        await asyncio.wait_for(asyncio.gather(*(informer.wait_synced() for informer in informers)), 300)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await kube.close()


def build_caches(mode: str) -> Caches:
    if mode == "projected":
        caches = Caches()
    else:
        caches = Caches(claims=Store(keep_whole), addresses=Store(keep_whole), clusters=Store(keep_whole))
    caches.serve([IN_CLUSTER_POOL], lambda group, kind: IN_CLUSTER_POOL)
    return caches


def measure(kubeconfig: Path, mode: str, feed: str, traced: bool) -> Object:
    """After filling the claim and IPAddress stores in `mode` (full or projected) from `feed` (list or events):
    with `traced`, the bytes each store holds (tracemalloc); without, the process's RSS and peak RSS (tracemalloc
    itself takes memory for every allocation it traces)."""
    if traced:
        tracemalloc.start()
    caches = build_caches(mode)
    asyncio.run(sync(kubeconfig, caches, feed))
    counts = {"claims": len(caches.claims), "addresses": len(caches.addresses)}
    gc.collect()
    figures: Object = {"mode": mode, "feed": feed, "counts": counts}
    if not traced:
        return figures | {"rss_kib": rss_kib()}
    before = tracemalloc.get_traced_memory()[0]
    held: dict[str, int] = {}
    for name in ("claims", "addresses"):
        setattr(caches, name, Store())
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        held[name], before = before - after, after
    tracemalloc.stop()
    return figures | {"held": held}


# -- the run ----------------------------------------------------------------------------------------------------


def child(kubeconfig: Path, mode: str, feed: str) -> Object:
    """Both measurements of one (mode, feed), each in a fresh process."""
    figures: Object = {}
    for traced in (True, False):
        argv = [sys.executable, __file__, "--measure", mode, "--feed", feed, "--kubeconfig", str(kubeconfig)]
        result = subprocess.run(
            [*argv, *(["--traced"] if traced else [])], capture_output=True, text=True, check=False, timeout=900
        )
        if result.returncode != 0:
            raise RuntimeError(f"measuring {feed}/{mode} failed:\n{result.stderr[-3000:]}")
        figures |= json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def report(objects: int, results: list[Object]) -> None:
    print(f"\n{objects} IPAddressClaims and {objects} IPAddresses in one namespace")
    header = f"{'fed by':<8} {'mode':<10} {'claims MiB':>11} {'B/claim':>8} {'IPAddr. MiB':>12} {'B/IPAddr.':>10}"
    print(f"\n{header} {'RSS MiB':>8} {'peak RSS MiB':>13}")
    for result in results:
        held, counts = result["held"], result["counts"]
        print(
            f"{result['feed']:<8} {result['mode']:<10} {held['claims'] / 2**20:>11.1f} "
            f"{held['claims'] / counts['claims']:>8.0f} {held['addresses'] / 2**20:>12.1f} "
            f"{held['addresses'] / counts['addresses']:>10.0f} {result['rss_kib']['VmRSS'] / 1024:>8.0f} "
            f"{result['rss_kib']['VmHWM'] / 1024:>13.0f}"
        )
    for feed in FEEDS:
        full, projected = (
            sum(r["held"].values()) for mode in MODES for r in results if (r["feed"], r["mode"]) == (feed, mode)
        )
        print(f"{feed}: projected / full {projected / full:.2f} ({(full - projected) / 2**20:.1f} MiB less)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=10_000, help="claims, and as many IPAddresses (10,000)")
    parser.add_argument("--measure", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--feed", choices=FEEDS, default="list", help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.kubeconfig, args.measure, args.feed, args.traced)))
        return 0
    work = Path(tempfile.mkdtemp(prefix="ipam-cache-memory-"))
    plane = LocalControlPlane(work / "plane", binaries_dir())
    try:
        plane.start()
        started = time.monotonic()
        asyncio.run(populate(plane.kubeconfig_path, args.objects))
        print(f"{args.objects} claims and IPAddresses written in {time.monotonic() - started:.0f} s", flush=True)
        results = [child(plane.kubeconfig_path, mode, feed) for feed in FEEDS for mode in MODES]
    finally:
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)
    for result in results:
        if result["counts"] != {"claims": args.objects, "addresses": args.objects}:
            print(f"error: {result['feed']}/{result['mode']} synced {result['counts']}", file=sys.stderr)
            return 1
    report(args.objects, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
