"""What a repair pass reads: the watch caches first, and the API server fresh only when the caches show something
to act on or report. A lagging cache delays a finding by a pass; it never makes the loop act."""

from __future__ import annotations

from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.repair import RepairSettings
from tests.support.repair_world import RepairWorld, make_repair_world
from tests.support.world import NS, address, claim

FRESH_READS = {"list IPAddress *", "list IPAddressClaim *"}


def settled_world() -> RepairWorld:
    """One claim with its IPAddress, held by the backend for it: nothing to repair."""
    rw = make_repair_world(RepairSettings(interval=1.0, grace_period=0.0))
    stored = rw.world.add(CLAIMS, claim("c1", status={"addressRef": {"name": "c1"}}))
    rw.world.add(ADDRESSES, address("c1", "c1"))
    rw.backend.hold(rw.ref, "10.0.0.99", f"{NS}/c1", stored["metadata"]["uid"])
    return rw


async def test_a_pass_with_nothing_to_do_reads_nothing_but_the_holdings() -> None:
    rw = settled_world()
    await rw.run_pass()
    assert not FRESH_READS & set(rw.world.journal)
    assert await rw.reasons() == []


async def test_what_the_caches_show_is_confirmed_by_a_fresh_read_before_anything_is_done() -> None:
    rw = settled_world()
    ghost = rw.ghost()
    await rw.run_pass()
    assert set(rw.world.journal) >= FRESH_READS
    assert len(rw.loop.pools.book) == 1, "the fresh read found the suspect"
    assert ghost.handle in rw.backend.records
    await rw.run_pass()
    assert (await rw.reasons())[0] == "RepairSuspectedLeak", "reported once the next pass found it again"


async def test_a_cache_that_still_shows_a_deleted_ipaddress_delays_the_leak_by_a_pass() -> None:
    rw = settled_world()
    await rw.world.kube.delete(ADDRESSES, "c1", NS)  # on the server only: the watch has not told the cache yet
    await rw.world.kube.delete(CLAIMS, "c1", NS)
    await rw.run_pass()
    assert await rw.reasons() == [], "the caches account for the holding: nothing is suspected yet"
    rw.world.sync()
    await rw.run_pass(advance=1.0)
    await rw.run_pass(advance=1.0)
    assert not rw.backend.records, "once the caches caught up, the leak took the usual two passes"
