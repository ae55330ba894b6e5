"""The NetBox repair capability's view of the pool's sources, against the real NetBox: an ip-range marked
populated inside a prefix source is outside the pool (never recorded), the sources are resolved once per pool and
pass with a bounded number of requests per restore, and a restore that another object joins after its check is
taken, ours deleted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from backends.netbox import NetboxBackend, resolver
from backends.netbox.allocator import Allocator
from backends.netbox.spec import CLAIM_REF_FIELD, CLAIM_UID_FIELD, OWNER_TAG
from ipam_provider.backend.contract import Allocation, PoolRef
from ipam_provider.backend.repair import RestoreOutcome
from ipam_provider.repair.pacer import CountingPacer
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.netbox_backend import client_of, create_secret, marked, new_claim, pool_of, prefix, unique_name

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer


def at(netbox: NetBoxServer, address: str, vrf_id: Any = "null") -> list[Any]:
    found = netbox.api().ipam.ip_addresses.filter(address=address, vrf_id=vrf_id)
    return [r for r in found if str(r.address).split("/")[0] == address]


async def test_an_address_in_a_populated_range_inside_a_prefix_is_outside(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.160.0.0/24")
    netbox.create_ip_range("10.160.0.10/24", "10.160.0.20/24", mark_populated=True)
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "populated", [prefix("10.160.0.0/24")])
    ref = PoolRef.from_object(pool)
    await backend.report(ref, pool, [])

    outside = await backend.outside_pool(ref, pool, ["10.160.0.15", "10.160.0.30"])

    assert list(outside) == ["10.160.0.15"]
    assert "10.160.0.10-10.160.0.20" in outside["10.160.0.15"] and "populated" in outside["10.160.0.15"]
    claim = new_claim(namespace, "in-range")
    restore = await backend.restore(ref, pool, claim, Allocation("10.160.0.15", 24, None, {}))
    assert restore.outcome is RestoreOutcome.OUTSIDE, restore
    assert "populated" in restore.detail
    assert at(netbox, "10.160.0.15") == [], "never recorded"


async def test_a_pass_resolves_the_sources_once_and_each_restore_costs_a_bounded_number_of_requests(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    netbox.create_prefix("10.161.0.0/28")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "bulk", [prefix("10.161.0.0/28")])
    ref = PoolRef.from_object(pool)
    claims = [new_claim(namespace, f"m{i}") for i in range(3)]
    allocations = [await backend.allocate(ref, pool, claim) for claim in claims]
    for claim in claims:
        marked(netbox, claim.uid)[0].delete()  # a bulk deletion behind our back
    resolutions: list[str] = []
    real_resolve = resolver.resolve_pool

    async def counting_resolve(*args: Any, **kwargs: Any) -> Any:
        resolutions.append("resolve")
        return await real_resolve(*args, **kwargs)

    monkeypatch.setattr(resolver, "resolve_pool", counting_resolve)
    client = await client_of(backend, pool)

    await backend.list_holdings(ref, pool, CountingPacer())  # a pass starts
    costs = []
    for claim, allocation in zip(claims, allocations, strict=True):
        sent = client.requests_sent
        assert (await backend.restore(ref, pool, claim, allocation)).outcome is RestoreOutcome.RECORDED
        costs.append(client.requests_sent - sent)

    assert resolutions == ["resolve"], "afresh once in the pass"
    # populated ip-ranges, the address, POST, the check after the fact, the last look
    assert costs[1:] == [5, 5]
    await backend.list_holdings(ref, pool, CountingPacer())  # the next pass
    assert (await backend.restore(ref, pool, claims[0], allocations[0])).outcome is RestoreOutcome.HELD
    assert resolutions == ["resolve", "resolve"]


async def test_an_object_that_joins_a_restored_address_after_its_check_makes_it_taken(
    backend: NetboxBackend, kube: KubeClient, namespace: str, netbox: NetBoxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A VRF that does not refuse a second object at one address (NetBox refuses it in the global table when
    # ENFORCE_GLOBAL_UNIQUE is on, its default).
    vrf = netbox.api().ipam.vrfs.create(name=unique_name("shared"), enforce_unique=False)
    netbox.create_prefix("10.162.0.0/29", vrf=vrf.id)
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "shared", [prefix("10.162.0.0/29", vrf=vrf.name)])
    ref = PoolRef.from_object(pool)
    claim = new_claim(namespace, "victim")
    allocation = await backend.allocate(ref, pool, claim)
    marked(netbox, claim.uid)[0].delete()
    real_keep = Allocator.keep_if_alone
    joined: list[Any] = []

    async def then_another_pool_allocates(*args: Any, **kwargs: Any) -> None:
        await real_keep(*args, **kwargs)
        # Another pool over the same prefix is handed the address by POST available-ips, which checks nothing
        # after the fact.
        tag = netbox.api().extras.tags.get(slug=OWNER_TAG)
        custom = {CLAIM_UID_FIELD: "uid-of-another-pool", CLAIM_REF_FIELD: f"{namespace}/other"}
        joined.append(
            netbox.api().ipam.ip_addresses.create(
                address=f"{allocation.address}/29", vrf=vrf.id, tags=[tag.id], custom_fields=custom
            )
        )

    monkeypatch.setattr(Allocator, "keep_if_alone", then_another_pool_allocates)

    restore = await backend.restore(ref, pool, claim, allocation)

    assert restore.outcome is RestoreOutcome.TAKEN, restore
    assert restore.detail == f"NetBox IP address {joined[0].id} (claim {namespace}/other)"
    assert marked(netbox, claim.uid) == [], "ours deleted"
    assert [r.id for r in at(netbox, allocation.address, vrf.id)] == [joined[0].id]
