"""The repair loop wired to the core's fake world: a repairable fake backend, a clock the test moves, a set of
claim keys the test marks busy (as the work queue would answer), and a pacer that journals its waits."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import REGISTRY

from ipam_provider.backend.contract import PoolRef
from ipam_provider.backend.repair import Holding
from ipam_provider.repair import RepairLoop, RepairSettings
from ipam_provider.repair.compare import Scope
from ipam_provider.watch import ClaimKey
from tests.support.fake_backend import FAKE_POOL
from tests.support.fake_repair import RepairableFakeBackend
from tests.support.world import NS, POOLS, World, make_world, pool

BACKEND = "fake_repair"  # the registry's name for the fake's module


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class JournalPacer:
    journal: list[str]
    waits: int = 0

    async def wait(self) -> None:
        self.waits += 1
        self.journal.append("pacer wait")


@dataclass
class RepairWorld:
    world: World
    backend: RepairableFakeBackend
    loop: RepairLoop
    clock: Clock
    pacer: JournalPacer
    busy: set[ClaimKey] = field(default_factory=set)

    @property
    def ref(self) -> PoolRef:
        return FAKE_POOL.ref(NS, "net")

    async def run_pass(self, advance: float = 0.0) -> None:
        """Move the clock on by `advance` seconds, then make one pass."""
        self.clock.now += advance
        await self.loop.run_pass()

    def ghost(self, address: str = "10.0.0.50", claim: str = f"{NS}/ghost", uid: str = "uid-ghost") -> Holding:
        """A holding for a claim that does not exist."""
        return self.backend.hold(self.ref, address, claim, uid)

    async def reasons(self) -> list[str]:
        return [reason for _, reason, _, _ in await self.world.events()]


def make_repair_world(
    settings: RepairSettings | None = None,
    scope: Scope | None = None,
    *,
    pool_name: str = "net",
) -> RepairWorld:
    backend = RepairableFakeBackend()
    world = make_world(backend)
    clock = Clock()
    pacer = JournalPacer(world.journal)
    busy: set[ClaimKey] = set()
    loop = RepairLoop(
        world.ctx,
        scope or Scope([NS]),
        settings or RepairSettings(interval=1.0, grace_period=10.0),
        busy.__contains__,
        clock=clock,
        pacer=pacer,
    )
    world.add(POOLS, pool(pool_name))
    return RepairWorld(world, backend, loop, clock, pacer, busy)


def sample(metric: str, pool_name: str = "net", **extra: str) -> float:
    labels = {"backend": BACKEND, "kind": FAKE_POOL.kind, "namespace": NS, "name": pool_name, **extra}
    return REGISTRY.get_sample_value(metric, labels) or 0.0


def passes(result: str) -> float:
    return REGISTRY.get_sample_value("ipam_provider_repair_passes_total", {"backend": BACKEND, "result": result}) or 0.0
