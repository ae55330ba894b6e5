"""The core's part of the requested-address annotation, whatever the backend: a value that is not an IP address
fails a claim without an IPAddress before the backend is asked; on a fulfilled claim, a value other than its
IPAddress's changes nothing and is told once per change by a RequestedAddressIgnored Event."""

from __future__ import annotations

import pytest

from ipam_provider.api.capi import CLAIMS
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION, AllocationFailedError, ClaimContext
from ipam_provider.reconcile.claims import REASON_REQUESTED_ADDRESS_IGNORED
from ipam_provider.runtime.kube.resources import EVENTS
from tests.ipam_provider.reconcile.test_claims import ALLOCATED, fulfilled
from tests.support.world import NS, POOLS, Object, World, claim, make_world, pool, ready_of, ready_state


async def annotate(world: World, value: str | None, name: str = "m1") -> None:
    await world.kube.patch(CLAIMS, name, {"metadata": {"annotations": {REQUESTED_ADDRESS_ANNOTATION: value}}}, NS)
    world.sync()


async def ignored_events(world: World) -> list[Object]:
    await world.ctx.recorder.flush()
    return [e for e in world.kube.stored_all(EVENTS, NS) if e["reason"] == REASON_REQUESTED_ADDRESS_IGNORED]


async def test_a_requested_address_that_is_no_ip_fails_the_claim_before_the_backend_is_asked() -> None:
    world = make_world()
    world.add(POOLS, pool())
    world.add(CLAIMS, claim("m1", annotations={REQUESTED_ADDRESS_ANNOTATION: "10.0.0.300"}))
    assert await world.claims.reconcile(NS, "m1") is not None  # retried later
    condition = ready_of(world.claim("m1"))
    assert condition is not None and (condition["status"], condition["reason"]) == ("False", "AllocationFailed")
    assert "'10.0.0.300', which is not an IP address" in condition["message"]
    assert world.backend.calls_of("allocate") == []
    assert world.address("m1") is None

    await annotate(world, " 10.0.0.10 ")  # blanks around it are fine
    assert await world.claims.reconcile(NS, "m1") is None
    assert ready_state(world.claim("m1")) == ALLOCATED
    (call,) = world.backend.calls_of("allocate")
    assert call.claim is not None and call.claim.requested_address == "10.0.0.10"


async def test_a_changed_annotation_on_a_fulfilled_claim_changes_nothing_and_is_told_once_per_change() -> None:
    world = make_world()
    await fulfilled(world, annotations={REQUESTED_ADDRESS_ANNOTATION: "10.0.0.10"})  # what it got: no Event
    assert await ignored_events(world) == []

    await annotate(world, "10.0.0.77")
    for _ in range(3):
        assert await world.claims.reconcile(NS, "m1") is None
    (event,) = await ignored_events(world)
    assert event["type"] == "Warning" and event["count"] == 1, "one Event per change, not one per reconcile"
    assert "asks for 10.0.0.77" in event["message"] and "already has 10.0.0.10" in event["message"]
    assert "immutable" in event["message"] and "delete and recreate the claim" in event["message"]
    address = world.address("m1")
    assert address is not None and address["spec"]["address"] == "10.0.0.10"
    assert ready_state(world.claim("m1")) == ALLOCATED
    allocations = world.backend.calls_of("allocate")
    assert allocations[-1].allocation is not None and allocations[-1].allocation.address == "10.0.0.10"

    await annotate(world, "not-an-ip")  # a fulfilled claim keeps its address: no failure either
    assert await world.claims.reconcile(NS, "m1") is None
    assert await world.claims.reconcile(NS, "m1") is None
    assert ready_state(world.claim("m1")) == ALLOCATED
    messages = sorted(e["message"] for e in await ignored_events(world))
    assert len(messages) == 2 and "'not-an-ip', which is not an IP address" in messages[1]

    await annotate(world, "10.0.0.10")  # matches again: forgotten, so the next change is told again
    assert await world.claims.reconcile(NS, "m1") is None
    await annotate(world, "10.0.0.77")
    assert await world.claims.reconcile(NS, "m1") is None
    total = sum(e["count"] for e in await ignored_events(world))
    assert total == 3


def test_an_ipv6_address_carrying_an_ipv4_address_is_refused_with_the_ipv4_address_to_write() -> None:
    """::ffff:10.0.0.5 and ::10.0.0.5 are written differently by Python and by PostgreSQL, so a lookup by text would
    miss their holders: they are refused, naming the IPv4 address to write instead. Other IPv6 addresses pass."""
    for text in ("::ffff:10.0.0.5", "::FFFF:a00:5", "::10.0.0.5"):
        asking = ClaimContext(NS, "m1", "uid-1", annotations={REQUESTED_ADDRESS_ANNOTATION: text})
        with pytest.raises(AllocationFailedError) as failure:
            _ = asking.requested_address
        assert "write the IPv4 address 10.0.0.5 instead" in failure.value.message, text
    for text, canonical in (("2001:db8::10.0.0.5", "2001:db8::a00:5"), ("::1", "::1"), ("fd00::ffff:a00:5", None)):
        asking = ClaimContext(NS, "m1", "uid-1", annotations={REQUESTED_ADDRESS_ANNOTATION: text})
        assert asking.requested_address == (canonical or text)
