"""The Infoblox backend against two grid-wide bindings real grids enforce, end to end (real API server, controller,
infoblox-client, WAPI simulator): extensible-attribute definitions restricted by `allowed_object_types`
(terraform-provider-infoblox #420), and the one network view of a host record's DNS view. Each test fails
against a simulator that accepts what a real grid refuses, or refuses what real clients send."""

from __future__ import annotations

from typing import Any

from ipam_provider.runtime.kube.client import KubeClient
from tests.support.infoblox import POOLS, Grid, wait_pool_reason
from tests.support.objects import ready_condition, wait_address, wait_claim_reason

HOST = {"dnsZone": "nodes.example.com", "hostnameSource": "claimName"}
REFUSAL = "Extensible attribute 'CAPI-Pool' is not allowed for this operation"


def condition_text(obj: dict[str, Any]) -> str:
    condition = ready_condition(obj) or {}
    return f"{condition.get('reason')}: {condition.get('message')}"


def restrict(grid: Grid, name: str, *types: str) -> None:
    """Set an extensible-attribute definition's allowed_object_types on the grid, as an admin would."""
    (definition,) = grid.sim.state.find("extensibleattributedef", name=name)
    grid.sim.state.update(definition["_ref"], allowed_object_types=list(types))


async def test_a_restricted_attribute_refused_on_a_host_record_is_pool_not_ready_not_a_name_conflict(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_zone("nodes.example.com")
    await grid.create_pool("dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=HOST)
    async with infoblox_controller():
        await wait_pool_reason(kube, namespace, "dns", "PoolReady")
        # An admin restricts CAPI-Pool after the pool was checked: the grid refuses the next host record.
        restrict(grid, "CAPI-Pool", "Network", "IPv6Network")
        grid.sim.request_log.reset()
        await grid.create_claim("web-0", "dns")
        claim = await wait_claim_reason(kube, namespace, "web-0", "PoolNotReady")
        text = condition_text(claim)
        assert REFUSAL in text and "allowed_object_types" in text, text
        assert "already exists" not in text
        assert grid.sim.state.count("record:host") == 0
        searched = [e for e in grid.sim.request_log.entries if e.method == "GET" and e.object_type == "record:host"]
        assert not [e for e in searched if "name=" in e.query], "a refused attribute is not a name conflict"
        pool = await wait_pool_reason(kube, namespace, "dns", "ExtensibleAttributeNotAllowed", timeout=60)
        text = condition_text(pool)
        assert "CAPI-Pool" in text and "Network, IPv6Network" in text and "HostRecord" in text, text
        restrict(grid, "CAPI-Pool", "Network", "HostRecord")
        address = await wait_address(kube, namespace, "web-0", timeout=60)
        (record,) = grid.sim.state.objects("record:host")
        assert [e["ipv4addr"] for e in record["ipv4addrs"]] == [address["spec"]["address"]]


async def test_the_pool_check_names_a_pool_attribute_its_definition_does_not_allow_on_fixed_addresses(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_ea_definition("Site", allowed_object_types=["HostRecord"])
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}], extensibleAttributes={"Site": "fra1"})
    async with infoblox_controller():
        pool = await wait_pool_reason(kube, namespace, "net", "ExtensibleAttributeNotAllowed")
        text = condition_text(pool)
        assert "extensible attribute Site allows it only on HostRecord" in text, text
        assert "FixedAddress" in text and "remove it from spec.extensibleAttributes" in text, text
        await grid.create_claim("web-0", "net")
        claim = await wait_claim_reason(kube, namespace, "web-0", "PoolNotReady")
        assert "Extensible attribute 'Site' is not allowed for this operation" in condition_text(claim)
        assert grid.sim.state.count("fixedaddress") == 0
        restrict(grid, "Site", "HostRecord", "FixedAddress")
        address = await wait_address(kube, namespace, "web-0", timeout=60)
        (fixed,) = grid.sim.state.objects("fixedaddress")
        assert fixed["ipv4addr"] == address["spec"]["address"] and fixed["extattrs"]["Site"] == {"value": "fra1"}
        await wait_pool_reason(kube, namespace, "net", "PoolReady", timeout=60)


async def test_a_host_record_pool_needs_a_dns_view_of_its_network_view_and_posts_that_network_view(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_network_view("nv2")
    grid.sim.state.add_network("10.20.0.0/24", network_view="nv2")
    grid.sim.state.add_zone("nodes.example.com")
    grid.sim.state.add_zone("nodes.example.com", view="default.nv2")
    host = {**HOST, "dnsView": "default"}
    spec = {"networkView": "nv2", "subnets": [{"cidr": "10.20.0.0/24"}], "mode": "hostRecord", "hostRecord": host}
    await grid.create_pool("dns", **spec)
    async with infoblox_controller():
        pool = await wait_pool_reason(kube, namespace, "dns", "DNSViewNotInNetworkView")
        text = condition_text(pool)
        assert "DNS view 'default' belongs to network view 'default', not to the pool's network view 'nv2'" in text
        assert "spec.hostRecord.dnsView" in text and "'default.nv2'" in text, text
        await grid.create_claim("web-0", "dns")
        claim = await wait_claim_reason(kube, namespace, "web-0", "PoolNotReady")
        assert "DNSViewNotInNetworkView" in condition_text(claim)
        assert grid.sim.request_log.count("POST", "record:host") == 0, "nothing is posted into the wrong view"
        await kube.patch(POOLS, "dns", {"spec": {"hostRecord": {"dnsView": "default.nv2"}}}, namespace)
        address = await wait_address(kube, namespace, "web-0", timeout=60)
        (record,) = grid.sim.state.objects("record:host")
        assert (record["view"], record["network_view"]) == ("default.nv2", "nv2")
        assert grid.sim.state.used_addresses("nv2") == [address["spec"]["address"]]
        await wait_pool_reason(kube, namespace, "dns", "PoolReady", timeout=60)


async def test_a_custom_default_dns_view_of_another_network_view_is_named_from_the_instance_check(
    kube: KubeClient, namespace: str, grid_factory: Any, infoblox_controller: Any
) -> None:
    grid: Grid = await grid_factory(defaultDNSView="internal")
    grid.sim.state.add_dns_view("internal")  # bound to network view default
    grid.sim.state.add_network_view("nv2")
    grid.sim.state.add_network("10.20.0.0/24", network_view="nv2")
    grid.sim.state.add_zone("nodes.example.com", view="default.nv2")
    spec = {"networkView": "nv2", "subnets": [{"cidr": "10.20.0.0/24"}], "mode": "hostRecord", "hostRecord": HOST}
    await grid.create_pool("dns", **spec)
    async with infoblox_controller():
        pool = await wait_pool_reason(kube, namespace, "dns", "DNSViewNotInNetworkView")
        text = condition_text(pool)
        assert "DNS view 'internal' belongs to network view 'default'" in text, text
        assert "the InfobloxInstance's spec.defaultDNSView" in text, text
        asked = [e.query for e in grid.sim.request_log.entries if e.method == "GET" and e.object_type == "view"]
        assert len(asked) == 1, "the instance check's answer is used, the pool check does not ask again"
        await kube.patch(POOLS, "dns", {"spec": {"hostRecord": {"dnsView": "default.nv2"}}}, namespace)
        await grid.create_claim("web-0", "dns")
        await wait_address(kube, namespace, "web-0", timeout=60)
        (record,) = grid.sim.state.objects("record:host")
        assert (record["view"], record["network_view"]) == ("default.nv2", "nv2")
