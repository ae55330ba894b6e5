"""The Infoblox backend's DNS checks end to end (real API server, controller, infoblox-client, WAPI simulator): a
missing DNS view or authoritative zone makes the instance or the hostRecord pool not ready with its own reason,
claims get PoolNotReady without any POST reaching the grid, and creating the view or zone on the grid recovers."""

from __future__ import annotations

from typing import Any

from ipam_provider.runtime.kube.client import KubeClient
from tests.support.infoblox import Grid, wait_instance_reason, wait_pool_reason
from tests.support.objects import ready_condition, wait_address, wait_claim_reason

HOST = {"dnsZone": "nodes.example.com", "hostnameSource": "claimName"}


def condition_text(obj: dict[str, Any]) -> str:
    condition = ready_condition(obj) or {}
    return f"{condition.get('reason')}: {condition.get('message')}"


async def test_a_missing_dns_view_of_a_host_record_pool_then_recovery(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    host = {**HOST, "dnsView": "internal"}
    await grid.create_pool("dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
    async with infoblox_controller():
        pool = await wait_pool_reason(kube, namespace, "dns", "DNSViewNotFound")
        text = condition_text(pool)
        assert "DNS view 'internal' does not exist" in text and "spec.hostRecord.dnsView" in text, text
        await grid.create_claim("web-0", "dns")
        claim = await wait_claim_reason(kube, namespace, "web-0", "PoolNotReady")
        assert "DNSViewNotFound" in condition_text(claim) and "'internal'" in condition_text(claim)
        assert grid.sim.request_log.count("POST", "record:host") == 0, "nothing is posted into a missing view"
        grid.sim.state.add_dns_view("internal")
        grid.sim.state.add_zone("nodes.example.com", "internal")
        address = await wait_address(kube, namespace, "web-0", timeout=60)
        (record,) = grid.sim.state.objects("record:host")
        assert (record["name"], record["view"]) == ("web-0.nodes.example.com", "internal")
        assert [e["ipv4addr"] for e in record["ipv4addrs"]] == [address["spec"]["address"]]
        pool = await wait_pool_reason(kube, namespace, "dns", "PoolReady")
        assert "zone 'nodes.example.com' in DNS view 'internal'" in condition_text(pool)


async def test_a_missing_zone_of_a_host_record_pool_then_recovery_through_a_parent_zone(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_zone("example.org")  # another zone of the view does not count
    await grid.create_pool("dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=HOST)
    async with infoblox_controller():
        pool = await wait_pool_reason(kube, namespace, "dns", "DNSZoneNotFound")
        text = condition_text(pool)
        assert "'nodes.example.com'" in text and "DNS view 'default'" in text and "dnsZone" in text, text
        await grid.create_claim("web-0", "dns")
        claim = await wait_claim_reason(kube, namespace, "web-0", "PoolNotReady")
        assert "DNSZoneNotFound" in condition_text(claim)
        assert grid.sim.request_log.count("POST", "record:host") == 0, "no host record is posted without its zone"
        # NIOS puts a record into the closest enclosing zone: a parent zone is enough.
        grid.sim.state.add_zone("example.com")
        await wait_address(kube, namespace, "web-0", timeout=60)
        (record,) = grid.sim.state.objects("record:host")
        assert record["zone"] == "example.com"
        await wait_pool_reason(kube, namespace, "dns", "PoolReady")
        # The checks run at pool-check time; an allocation is still exactly one request.
        grid.sim.request_log.reset()
        await grid.create_claim("web-1", "dns")
        await wait_address(kube, namespace, "web-1")
        assert grid.sim.request_log.counts() == {("POST", "record:host"): 1}


async def test_a_missing_default_dns_view_of_the_instance_then_recovery(
    kube: KubeClient, namespace: str, grid_factory: Any, infoblox_controller: Any
) -> None:
    grid: Grid = await grid_factory(defaultDNSView="internal")
    grid.sim.state.add_network("10.10.0.0/24")
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        instance = await wait_instance_reason(kube, grid.instance, "DNSViewNotFound")
        text = condition_text(instance)
        assert "DNS view 'internal' does not exist" in text and "spec.defaultDNSView" in text, text
        await wait_pool_reason(kube, namespace, "net", "DNSViewNotFound")
        await grid.create_claim("c", "net")
        claim = await wait_claim_reason(kube, namespace, "c", "PoolNotReady")
        assert "spec.defaultDNSView" in condition_text(claim)
        grid.sim.state.add_dns_view("internal")
        await wait_address(kube, namespace, "c", timeout=60)
        instance = await wait_instance_reason(kube, grid.instance, "Connected")
        assert "DNS view 'internal'" in condition_text(instance)


async def test_fixed_address_pools_on_the_builtin_dns_view_never_ask_about_dns(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    # An API user limited to IPAM/DHCP permissions may not read DNS views: with NIOS's built-in `default` view and
    # fixedAddress pools only, nothing about DNS is asked, so such a user is served.
    await grid.create_pool("plain", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        await wait_instance_reason(kube, grid.instance, "Connected")
        await wait_pool_reason(kube, namespace, "plain", "PoolReady")
        await grid.create_claim("node-0", "plain")
        await wait_address(kube, namespace, "node-0")
    asked = {entry.object_type for entry in grid.sim.request_log.entries if entry.method == "GET"}
    assert not asked & {"view", "zone_auth"}, asked
