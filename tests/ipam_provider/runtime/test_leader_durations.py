"""The leader elector's three durations act as client-go's do: a candidate retries every retry period, the leader
renews every retry period and gives up once it could not renew for the renew deadline, and the lease it writes
tells the others how long to wait (the lease duration). Against an in-memory Lease API, so the timing is exact."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

import aiohttp
import pytest

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource
from ipam_provider.runtime.leader import LeaderElector


class FakeLeases:
    """get/create/patch of Lease objects, with resourceVersion conflicts; `fail` makes writes fail, `hang` makes
    them never answer."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.writes = 0
        self.reads = 0
        self.fail = False
        self.hang = False
        self.unreachable = False
        self.refused = 0
        self.refused_thrice = asyncio.Event()

    async def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        self.reads += 1
        if self.unreachable:
            self.refused += 1
            if self.refused >= 3:
                self.refused_thrice.set()
            raise aiohttp.ClientConnectionError("connection reset by peer")
        lease = self.leases.get((namespace or "", name))
        return copy.deepcopy(lease)

    async def _write(self) -> None:
        self.writes += 1
        if self.hang:
            await asyncio.Event().wait()
        if self.fail:
            raise ApiError(500, "InternalError", "etcd is away")
        self.version += 1

    async def create(self, resource: Resource, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        await self._write()
        key = (namespace or "", body["metadata"]["name"])
        if key in self.leases:
            raise ApiError(409, "AlreadyExists", "exists")
        self.leases[key] = {
            **copy.deepcopy(body),
            "metadata": {**body["metadata"], "resourceVersion": str(self.version)},
        }
        return copy.deepcopy(self.leases[key])

    async def patch(self, resource: Resource, name: str, patch: Any, namespace: str | None = None) -> dict[str, Any]:
        await self._write()
        lease = self.leases[(namespace or "", name)]
        if patch["metadata"]["resourceVersion"] != lease["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        lease["spec"].update(patch["spec"])
        lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(lease)


def elector(leases: FakeLeases, **durations: float) -> LeaderElector:
    return LeaderElector(cast(KubeClient, leases), "ns", "lock", **durations)


def test_the_durations_are_checked_as_client_go_does() -> None:
    leases = FakeLeases()
    assert elector(leases).renew_deadline_seconds == 10.0  # controller-runtime's 15 s / 10 s / 2 s
    with pytest.raises(ValueError, match="lease duration"):
        elector(leases, lease_seconds=10, renew_deadline_seconds=10)
    with pytest.raises(ValueError, match="retry period"):
        elector(leases, lease_seconds=15, renew_deadline_seconds=2.4, retry_seconds=2)


async def test_the_lease_carries_the_lease_duration_in_whole_seconds() -> None:
    leases = FakeLeases()
    await elector(leases, lease_seconds=7.5, renew_deadline_seconds=5, retry_seconds=1).acquire()
    assert leases.leases[("ns", "lock")]["spec"]["leaseDurationSeconds"] == 8


async def test_the_leader_renews_every_retry_period() -> None:
    leases = FakeLeases()
    leader = elector(leases, lease_seconds=5, renew_deadline_seconds=3, retry_seconds=0.1)
    await leader.acquire()
    keeper = asyncio.create_task(leader.keep())
    await asyncio.sleep(1.05)
    keeper.cancel()
    assert 7 <= leases.writes - 1 <= 11, f"{leases.writes - 1} renewals in 1.05 s at one per 0.1 s"


async def test_a_candidate_retries_every_retry_period() -> None:
    leases = FakeLeases()
    leader = elector(leases, lease_seconds=30, renew_deadline_seconds=20, retry_seconds=0.1)
    await leader.acquire()
    candidate = elector(leases, lease_seconds=30, renew_deadline_seconds=20, retry_seconds=0.1)
    reads = leases.reads
    waiting = asyncio.create_task(candidate.acquire())
    await asyncio.sleep(1.05)
    assert not waiting.done()
    waiting.cancel()
    assert 8 <= leases.reads - reads <= 12, f"{leases.reads - reads} attempts in 1.05 s at one per 0.1 s"


@pytest.mark.parametrize("how", ["fail", "hang"])
async def test_the_leader_gives_up_at_the_renew_deadline(how: str) -> None:
    leases = FakeLeases()
    leader = elector(leases, lease_seconds=5, renew_deadline_seconds=0.6, retry_seconds=0.1)
    await leader.acquire()
    setattr(leases, how, True)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(leader.keep(), 5)
    took = loop.time() - started
    # Renewed last when the lease was taken; a renewal that hangs is cut off at the deadline, not after it.
    assert 0.55 <= took <= 1.2, f"gave up after {took:.2f} s with a 0.6 s renew deadline"


async def test_the_leader_stops_at_once_when_another_holds_the_lease() -> None:
    leases = FakeLeases()
    leader = elector(leases, lease_seconds=5, renew_deadline_seconds=3, retry_seconds=0.1)
    await leader.acquire()
    spec = leases.leases[("ns", "lock")]["spec"]
    spec["holderIdentity"] = "someone-else"
    spec["renewTime"] = "2030-01-01T00:00:00.000000Z"
    await asyncio.wait_for(leader.keep(), 1)


async def test_a_candidate_keeps_trying_while_the_api_server_is_unreachable() -> None:
    """A connection error while waiting for the lease is retried like an API error: it never ends the wait (which
    would let the caller run as leader without the lease)."""
    leases = FakeLeases()
    leases.unreachable = True
    candidate = elector(leases, lease_seconds=5, renew_deadline_seconds=3, retry_seconds=0.05)
    waiting = asyncio.create_task(candidate.acquire())
    refused = asyncio.create_task(leases.refused_thrice.wait())
    await asyncio.wait({waiting, refused}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    refused.cancel()
    assert not waiting.done(), waiting.exception() if waiting.done() else None
    leases.unreachable = False
    await asyncio.wait_for(waiting, 30)
    assert leases.leases[("ns", "lock")]["spec"]["holderIdentity"] == candidate.identity
