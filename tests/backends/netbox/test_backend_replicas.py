"""Two replicas at once: two independent NetboxBackend instances (as two controller processes have: own clients,
own caches, own allocator state) allocate concurrently for different claims from the SAME pool and prefix, starting
cold (both create the ownership marks). Each replica serialises its own calls for the pool, as the reconciler does,
so POSTs that overlap at the proxy come from the two replicas: only NetBox's own locking keeps them apart.
Every claim must get a distinct address, NetBox must hold exactly one address per claim, and after the releases
nothing of ours may be left.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

from backends.netbox import NetboxBackend
from ipam_provider.backend.contract import Allocation, BackendContext, ClaimContext, PoolRef
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.netbox_backend import (
    claim_uid_of,
    create_secret,
    fast_settings,
    new_claim,
    owned_addresses,
    pool_of,
    prefix,
)
from tools.netbox_proxy import NetboxProxy

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

PER_REPLICA = 50
CIDR = "10.71.0.0/24"


async def test_two_replicas_allocate_concurrently_from_one_prefix(
    kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix(CIDR)
    replicas = [NetboxBackend(BackendContext(kube=kube), fast_settings()) for _ in range(2)]
    try:
        with NetboxProxy(netbox.url) as proxy:
            await create_secret(kube, namespace, netbox, url=proxy.url)
            pool = pool_of(namespace, "shared", [prefix(CIDR)])  # one pool object, seen by both replicas
            claims = [[new_claim(namespace, f"r{r}-{i:02d}") for i in range(PER_REPLICA)] for r in range(2)]

            async def run(replica: NetboxBackend, mine: list[ClaimContext]) -> list[Allocation]:
                ref = PoolRef.from_object(pool)
                return [await replica.allocate(ref, pool, claim) for claim in mine]  # one call at a time per replica

            results = await asyncio.gather(*(run(r, c) for r, c in zip(replicas, claims, strict=True)))

            posts = proxy.events("POST", "available-ips")
            assert len(posts) == 2 * PER_REPLICA, "a claim cost more (or fewer) than one allocating POST"
            peak = proxy.peak_in_flight("POST", "available-ips")
            overlapping = sum(
                1 for a in posts for b in posts if a is not b and a.start < b.start < a.end
            )  # pairs where one POST began while the other was still in NetBox's hands
            print(f"\n{2 * PER_REPLICA} POSTs: at most {peak} in flight at once, {overlapping} overlapping pairs")
            assert peak == 2, "the two replicas' POSTs never overlapped: NetBox's locking was not exercised"
            assert overlapping >= PER_REPLICA // 5, f"only {overlapping} of the POSTs overlapped"

            by_claim = {
                c.uid: a.address for cs, rs in zip(claims, results, strict=True) for c, a in zip(cs, rs, strict=True)
            }
            duplicates = [a for a, n in collections.Counter(by_claim.values()).items() if n > 1]
            assert not duplicates, f"handed out twice: {duplicates}"
            ours = owned_addresses(netbox, parent=CIDR)
            per_uid = collections.Counter(claim_uid_of(r) for r in ours)
            assert all(n == 1 for n in per_uid.values()), f"a claim holds several NetBox addresses: {per_uid}"
            assert {claim_uid_of(r): str(r.address).split("/")[0] for r in ours} == by_claim
            assert len(netbox.api().ipam.ip_addresses.filter(parent=CIDR)) == 2 * PER_REPLICA, "something leaked"

            ref = PoolRef.from_object(pool)

            async def release(replica: NetboxBackend, mine: list[ClaimContext], held: list[Allocation]) -> None:
                for claim, allocation in zip(mine, held, strict=True):
                    await replica.release(ref, pool, claim, allocation)

            await asyncio.gather(*(release(*args) for args in zip(replicas, claims, results, strict=True)))
            assert list(netbox.api().ipam.ip_addresses.filter(parent=CIDR)) == [], "an address outlived its claim"
    finally:
        for replica in replicas:
            await replica.close()
