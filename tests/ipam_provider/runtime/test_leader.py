"""Leader election on a Lease: one holder at a time, hand-over on release and on expiry."""

from __future__ import annotations

import asyncio

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import LEASES
from ipam_provider.runtime.leader import LeaderElector


async def test_one_leader_at_a_time_and_hand_over(kube: KubeClient, namespace: str) -> None:
    first = LeaderElector(kube, namespace, "ipam", lease_seconds=2, retry_seconds=0.2)
    second = LeaderElector(kube, namespace, "ipam", lease_seconds=2, retry_seconds=0.2)
    await asyncio.wait_for(first.acquire(), 5)
    waiting = asyncio.create_task(second.acquire())
    await asyncio.sleep(1.0)
    assert not waiting.done(), "a second candidate must not lead while the first renews"
    lease = await kube.get(LEASES, "ipam", namespace)
    assert lease is not None and lease["spec"]["holderIdentity"] == first.identity
    await first.release()
    await asyncio.wait_for(waiting, 5)
    lease = await kube.get(LEASES, "ipam", namespace)
    assert lease is not None and lease["spec"]["holderIdentity"] == second.identity
    assert lease["spec"]["leaseTransitions"] == 1


async def test_an_expired_lease_is_taken_over_and_the_old_leader_notices(kube: KubeClient, namespace: str) -> None:
    old = LeaderElector(kube, namespace, "ipam", lease_seconds=1, retry_seconds=0.2)
    new = LeaderElector(kube, namespace, "ipam", lease_seconds=1, retry_seconds=0.2)
    await asyncio.wait_for(old.acquire(), 5)
    # `old` stops renewing (as a frozen process would); `new` takes over once the lease has expired.
    await asyncio.wait_for(new.acquire(), 10)
    keeper = asyncio.create_task(old.keep())
    await asyncio.wait_for(keeper, 5)  # keep() returns: leadership lost
    lease = await kube.get(LEASES, "ipam", namespace)
    assert lease is not None and lease["spec"]["holderIdentity"] == new.identity
