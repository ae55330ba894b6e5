"""The claim path against a backend that lost a record and hands its address out again: the address is never
written for the new claim; it is given back and recorded again for the claim whose IPAddress still names it, and
the new claim gets another address on its next attempt."""

from __future__ import annotations

from ipam_provider.api.capi import CLAIMS
from ipam_provider.reconcile.context import pool_resource
from tests.ipam_provider.repair.test_pool_restore import forget_in_backend, fulfilled
from tests.support.fake_backend import GLOBAL_FAKE_POOL
from tests.support.repair_world import RepairWorld, make_repair_world
from tests.support.world import NS, claim, pool


async def _second_claim_gets_the_lost_address(rw: RepairWorld) -> str:
    ip: str = (await fulfilled(rw, "m1"))["spec"]["address"]
    forget_in_backend(rw, ip)
    rw.backend._next -= 1  # the backend's next answer is the address whose record it lost
    rw.world.add(CLAIMS, claim("m2"))
    await rw.world.claims.reconcile(NS, "m2")
    rw.world.sync()
    return ip


async def test_an_address_handed_out_again_is_never_written_for_another_claim() -> None:
    rw = make_repair_world()
    ip = await _second_claim_gets_the_lost_address(rw)

    assert rw.world.address("m2") is None, "the address still named by m1's IPAddress was not written for m2"
    holders = [h.claim for h in rw.backend.holdings(rw.ref) if h.address == ip]
    assert holders == [f"{NS}/m1"], "given back by m2 and recorded again for m1"
    ready = [c for c in rw.world.claim("m2").get("status", {}).get("conditions", []) if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "False" and ip in ready[0]["message"]
    assert ("Warning", "AddressStillInUse", "FakeIPPool", "net") in await rw.world.events()

    await rw.world.claims.reconcile(NS, "m2")
    rw.world.sync()
    second = rw.world.address("m2")
    assert second is not None and second["spec"]["address"] != ip


async def test_a_holder_in_another_namespace_is_not_named_on_the_claim() -> None:
    """A Global pool's claims are of many namespaces: the claim that met the holder's address learns only that an
    IPAddress of another namespace holds it, not which."""
    rw = make_repair_world(pool_name="shared")
    rw.world.add(pool_resource(GLOBAL_FAKE_POOL), pool("shared", kind=GLOBAL_FAKE_POOL))
    rw.world.add(CLAIMS, claim("m1", "shared", kind=GLOBAL_FAKE_POOL, namespace="team-a"))
    await rw.world.claims.reconcile("team-a", "m1")
    rw.world.sync()
    held = rw.world.address("m1", "team-a")
    assert held is not None
    forget_in_backend(rw, held["spec"]["address"])
    rw.backend._next -= 1
    rw.world.add(CLAIMS, claim("m2", "shared", kind=GLOBAL_FAKE_POOL, namespace="team-b"))
    await rw.world.claims.reconcile("team-b", "m2")
    rw.world.sync()
    (ready,) = [c for c in rw.world.claim("m2", "team-b")["status"]["conditions"] if c["type"] == "Ready"]
    assert "an IPAddress of another namespace" in ready["message"] and "team-a" not in ready["message"], ready
