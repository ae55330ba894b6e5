"""The Infoblox backend called directly, as the reconcilers and the repair loop call it, on the WAPI simulator (no
API server): pools and claims churned with new names each cycle (a ready pool with a dynamic and a requested
address, a pool of a missing instance, one of an instance whose credentials are refused, an operation that starts
after its pool's deletion was observed and one during which it is observed) leave the backend's `footprint`
(tests/support/footprint.py) at its size after a warm-up cycle. Each cleanup is needed: made a no-op, the same churn
leaves its state grown."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import pytest

from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.checks import PoolChecks
from backends.infoblox.ledger import Ledger
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import ANNOTATION_INSTANCE, INFOBLOX_POOL
from ipam_provider.backend.contract import (
    REQUESTED_ADDRESS_ANNOTATION,
    Allocation,
    BackendContext,
    BackendError,
    ClaimContext,
    PoolRef,
)
from ipam_provider.backend.live_pools import LivePools
from ipam_provider.repair.pacer import CountingPacer
from tests.backends.infoblox.test_backend import StubKube, grid_instance, pool, secret
from tests.support.footprint import footprint, footprint_growth
from tools.wapi_simulator import WapiSimulator

Object = dict[str, Any]
SUBNET = "10.0.0.0/24"
# Paths bounded by design that may grow between the footprints: path -> why.


def instance(name: str, sim: WapiSimulator, credentials: str) -> Object:
    assert sim.ca_path is not None
    body = grid_instance(host=sim.host, port=sim.port, caBundle=sim.ca_path.read_text())
    body["metadata"]["name"] = name
    body["spec"]["credentialsSecretRef"]["name"] = credentials
    return body


def grid_kube(sim: WapiSimulator) -> StubKube:
    """The instance "grid" (its credentials accepted) and "refused" (a wrong password)."""
    return StubKube(
        {
            ("infobloxinstances", None, "grid"): instance("grid", sim, "creds"),
            ("infobloxinstances", None, "refused"): instance("refused", sim, "wrong"),
            ("secrets", "sys", "creds"): secret("creds", username=sim.username, password=sim.password),
            ("secrets", "sys", "wrong"): secret("wrong", username=sim.username, password="not-" + sim.password),
        }
    )


def pool_named(name: str, instance_name: str = "grid") -> Object:
    body = pool(subnets=[{"cidr": SUBNET}])
    body["metadata"].update(name=name, uid=f"uid-{name}", generation=1)
    body["spec"]["instanceRef"]["name"] = instance_name
    return body


class DeletingPacer(CountingPacer):
    """Observes its pool's deletion at the first wait: the deletion comes while the listing runs."""

    def __init__(self, backend: InfobloxBackend, body: Object) -> None:
        super().__init__()
        self.backend, self.body = backend, body

    async def wait(self) -> None:
        await super().wait()
        if self.waits == 1:
            self.backend.observe_pool(INFOBLOX_POOL, self.body, None)


class Churn:
    def __init__(self, backend: InfobloxBackend) -> None:
        self.backend = backend
        self.cycle = 0

    def added(self, body: Object) -> PoolRef:
        self.backend.observe_pool(INFOBLOX_POOL, None, body)
        return PoolRef.from_object(body)

    def claim(self, name: str, requested: str | None = None) -> ClaimContext:
        annotations = {REQUESTED_ADDRESS_ANNOTATION: requested} if requested else {}
        return ClaimContext("ns", f"{name}-{self.cycle}", f"uid-{name}-{self.cycle}", annotations=annotations)

    async def serve(self, ref: PoolRef, body: Object) -> list[tuple[ClaimContext, Allocation]]:
        held = []
        for claim in (self.claim(f"{ref.name}-a"), self.claim(f"{ref.name}-b", f"10.0.0.{100 + self.cycle}")):
            held.append((claim, await self.backend.allocate(ref, body, claim)))
        report = await self.backend.report(ref, body, [allocation for _, allocation in held])
        assert report.ready, report.message
        return held

    async def ready_pool(self, name: str) -> None:
        body = pool_named(f"{name}-{self.cycle}")
        ref = self.added(body)
        for claim, allocation in await self.serve(ref, body):
            await self.backend.release(ref, body, claim, allocation)
        self.backend.observe_pool(INFOBLOX_POOL, body, None)

    async def failing_pool(self, name: str, instance_name: str) -> None:
        body = pool_named(f"{name}-{self.cycle}", instance_name)
        ref = self.added(body)
        report = await self.backend.report(ref, body, [])
        assert not report.ready
        claim = self.claim(f"{name}-a")
        with pytest.raises(BackendError):
            await self.backend.allocate(ref, body, claim)
        with contextlib.suppress(BackendError):
            await self.backend.release(ref, body, claim, None)
        self.backend.observe_pool(INFOBLOX_POOL, body, None)

    async def stale_operations(self) -> None:
        """The repair loop's calls with a pool it took before the pool's deletion was observed."""
        body = pool_named(f"stale-{self.cycle}")
        ref = self.added(body)
        assert (await self.backend.report(ref, body, [])).ready
        self.backend.observe_pool(INFOBLOX_POOL, body, None)
        await self.backend.list_holdings(ref, body, CountingPacer())
        claim = self.claim("stale")
        allocation = Allocation(f"10.0.0.{200 + self.cycle}", 24, annotations={ANNOTATION_INSTANCE: "grid"})
        await self.backend.restore(ref, body, claim, allocation)
        await self.backend.report(ref, body, [])
        await self.backend.release(ref, None, claim, allocation)  # after the pool, as with skip-delete-validation

    async def deleted_while_listing(self) -> None:
        body = pool_named(f"late-{self.cycle}")
        ref = self.added(body)
        pacer = DeletingPacer(self.backend, body)
        await self.backend.list_holdings(ref, body, pacer)
        assert pacer.waits > 1

    async def run(self) -> None:
        self.cycle += 1
        await self.ready_pool("ok")
        await self.failing_pool("absent", f"absent-{self.cycle}")
        await self.failing_pool("refused", "refused")
        await self.stale_operations()
        await self.deleted_while_listing()


@contextlib.asynccontextmanager
async def churned(sim: WapiSimulator) -> Any:
    sim.state.add_network(SUBNET)
    kube = grid_kube(sim)
    backend = InfobloxBackend(BackendContext(kube=cast(Any, kube)), InfobloxSettings(unhealthy_recheck_seconds=0.0))
    try:
        yield backend, Churn(backend)
    finally:
        await backend.close()


async def pool_churn_growth(sim: WapiSimulator, cycles: int = 3) -> dict[str, tuple[int, int]]:
    async with churned(sim) as (backend, churn):
        await churn.run()  # warm-up: lazily made state exists from here
        before = footprint(backend)
        for _ in range(cycles):
            await churn.run()
        return footprint_growth(before, footprint(backend))


async def test_churned_pools_and_claims_leave_nothing_behind(wapi_simulator: WapiSimulator) -> None:
    assert await pool_churn_growth(wapi_simulator) == {}


async def test_claims_churned_in_a_pool_that_stays_leave_nothing_behind(wapi_simulator: WapiSimulator) -> None:
    async with churned(wapi_simulator) as (backend, churn):
        body = pool_named("fleet")
        ref = churn.added(body)

        async def cycle() -> None:
            churn.cycle += 1
            for claim, allocation in await churn.serve(ref, body):
                await backend.release(ref, body, claim, allocation)

        await cycle()
        before = footprint(backend)
        for _ in range(3):
            await cycle()
        assert footprint_growth(before, footprint(backend)) == {}


@contextlib.contextmanager
def _kept(self: LivePools, ref: PoolRef) -> Iterator[None]:
    yield


CLEANUPS: dict[str, tuple[object, str, object, str]] = {
    # name: (owner, attribute, no-op replacement, a path that must then grow)
    "Ledger.forget": (Ledger, "forget", lambda self, ref: None, "InfobloxBackend.ledger.known"),
    "PoolChecks.forget": (PoolChecks, "forget", lambda self, ref: None, "InfobloxBackend.checks._results"),
    "LivePools.operation": (LivePools, "operation", _kept, "InfobloxBackend.ledger.indexes"),
}


@pytest.mark.parametrize("cleanup", sorted(CLEANUPS))
async def test_each_cleanup_is_needed(
    cleanup: str, wapi_simulator: WapiSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, attribute, replacement, path = CLEANUPS[cleanup]
    monkeypatch.setattr(owner, attribute, replacement)
    grown = await pool_churn_growth(wapi_simulator, cycles=2)
    assert path in grown, grown


async def test_a_leak_released_by_the_repair_loop_takes_its_claims_uncertainty(wapi_simulator: WapiSimulator) -> None:
    async with churned(wapi_simulator) as (backend, churn):
        body = pool_named("leaky")
        ref = churn.added(body)
        claim = churn.claim("gone")
        await backend.allocate(ref, body, claim)
        index = backend.ledger.indexes[ref]
        index.uncertain.add(claim.uid)  # a lost reply whose search failed too; then the claim was force-deleted
        (holding,) = await backend.list_holdings(ref, body, CountingPacer())
        assert await backend.release_holding(ref, body, holding)
        assert (index.by_claim, index.uncertain) == ({}, set())
