"""A holding whose record does not prove this management cluster made it (`Holding.releasable` False) is reported
as a suspected leak, its Event says why it is kept, and the loop never releases it, however long it stays."""

from __future__ import annotations

from ipam_provider.backend.contract import PoolRef
from ipam_provider.backend.repair import Holding
from ipam_provider.repair import RepairSettings
from ipam_provider.repair.pool import SuspectedLeaks
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.repair_world import make_repair_world, sample
from tests.support.world import NS

RELEASES = "ipam_provider_repair_releases_total"
SUSPECTED = "ipam_provider_repair_suspected_leaks"
WHY = "it carries no management cluster identity (made before identities were stamped)"


async def test_an_unreleasable_suspect_is_reported_with_why_and_never_released() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    kept = rw.backend.hold(rw.ref, "10.0.0.70", f"{NS}/old", "uid-old", releasable=False, why_kept=WHY)
    ghost = rw.ghost()  # a releasable leak beside it, so that the passes below do release something
    released_before = sample(RELEASES)

    for _ in range(5):
        await rw.run_pass(advance=100.0)

    assert ghost.handle not in rw.backend.records, "the releasable leak went"
    assert kept.handle in rw.backend.records, "the unreleasable one stays, pass after pass"
    assert sample(RELEASES) == released_before + 1
    assert sample(SUSPECTED) == 1, "it is still counted as a suspected leak"
    released = [c for c in rw.backend.calls if c.method == "release_holding"]
    assert len(released) == 1, "release_holding was never even asked for the unreleasable holding"

    await rw.world.ctx.recorder.flush()
    messages = {e["reason"]: e["message"] for e in rw.world.kube.stored_all(EVENTS, NS) if "10.0.0.70" in e["message"]}
    assert list(messages) == ["RepairSuspectedLeak"], messages
    assert "never released by the repair loop" in messages["RepairSuspectedLeak"]
    assert WHY in messages["RepairSuspectedLeak"]


async def test_without_a_reason_the_event_still_says_why() -> None:
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    rw.backend.hold(rw.ref, "10.0.0.71", f"{NS}/old", "uid-old", releasable=False)
    for _ in range(3):
        await rw.run_pass(advance=100.0)
    assert rw.backend.addresses_held(rw.ref) == ["10.0.0.71"]
    await rw.world.ctx.recorder.flush()
    [message] = [e["message"] for e in rw.world.kube.stored_all(EVENTS, NS)]
    assert "does not show that this management cluster made it" in message


def test_the_book_never_answers_an_unreleasable_suspect() -> None:
    pool = PoolRef("ipam.cluster.x-k8s.io", "InClusterIPPool", NS, "net")
    kept = Holding("10.0.0.1", f"{NS}/a", "uid-a", "h1", releasable=False)
    freed = Holding("10.0.0.2", f"{NS}/b", "uid-b", "h2")
    book = SuspectedLeaks()
    assert book.observe(pool, [kept, freed], 0.0) == [], "a first sighting is not reported"
    assert book.observe(pool, [kept, freed], 100.0) == [kept, freed]
    assert book.releasable(pool, 100.0, 0.0) == [freed]
    assert book.count(pool) == 2
