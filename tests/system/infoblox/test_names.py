"""Host records against what real NIOS grids do (real API server, controller, infoblox-client, WAPI simulator):
IPAM-only records live in a blank view and are never adopted nor duplicated, a search naming a DNS view the grid
does not have is a 404 that makes the pool not ready, and host names are lower case DNS names within the limits."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import pytest

from backends.infoblox.spec import ANNOTATION_HOSTNAME
from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.infoblox import POOLS, Grid, wait_gone, wait_instance_reason, wait_pool_reason
from tests.support.objects import ready_condition, wait_address, wait_claim_reason, wait_event
from tools.wapi_simulator import WapiError

ZONE = "nodes.example.com"


def condition_text(obj: dict[str, Any]) -> str:
    condition = ready_condition(obj) or {}
    return f"{condition.get('reason')}: {condition.get('message')}"


async def wait_pool_not_ready(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    """The pool, once its Ready condition is False (whatever the reason)."""

    async def probe() -> dict[str, Any] | None:
        pool = await kube.get(POOLS, name, namespace)
        condition = ready_condition(pool)
        return pool if condition is not None and condition.get("status") == "False" else None

    return await wait_for(probe, message=f"pool {namespace}/{name} to be not ready")


def host_searches(grid: Grid) -> list[dict[str, list[str]]]:
    """The query arguments of every search of host records by name, oldest first."""
    found = []
    for entry in grid.sim.request_log.entries:
        query = parse_qs(entry.query, keep_blank_values=True)
        if entry.method == "GET" and entry.object_type == "record:host" and "name" in query:
            found.append(query)
    return found


async def test_an_ipam_only_host_record_of_the_same_name_is_never_adopted_nor_duplicated(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    # On a real grid an IPAM-only record has view " " and a search with view=default does not find it.
    foreign = grid.sim.state.add_host_record(f"web-0.{ZONE}", "10.10.0.50", configure_for_dns=False)
    host = {"dnsZone": ZONE, "hostnameSource": "claimName", "configureForDNS": False}
    await grid.create_pool("ipam", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
    async with infoblox_controller():
        await wait_pool_reason(kube, namespace, "ipam", "PoolReady")
        await grid.create_claim("web-0", "ipam")
        failed = await wait_claim_reason(kube, namespace, "web-0", "AllocationFailed")
        text = condition_text(failed)
        assert f"host record web-0.{ZONE} already exists as an IPAM-only host record" in text, text
        assert "never adopted" in text, text
        assert grid.sim.request_log.count("POST", "record:host") == 0, "nothing is posted over an IPAM-only record"
        assert [q for q in host_searches(grid) if "view" in q] == [], "a search naming a view misses such records"
        await grid.create_claim("web-1", "ipam")
        address = await wait_address(kube, namespace, "web-1")
        (mine,) = [o for o in grid.sim.state.objects("record:host") if o["name"] == f"web-1.{ZONE}"]
        assert (mine["view"], mine["configure_for_dns"]) == (" ", False) and mine["_ref"].endswith("/%20")
        assert address["spec"]["address"] == mine["ipv4addrs"][0]["ipv4addr"]
        await kube.delete(CLAIMS, "web-1", namespace)
        await kube.delete(CLAIMS, "web-0", namespace)
        await wait_gone(kube, namespace, "web-1")
        await wait_gone(kube, namespace, "web-0")
    (left,) = grid.sim.state.objects("record:host")
    assert left["_ref"] == foreign and not left.get("extattrs"), "the hand-made record was adopted or changed"
    assert (left["view"], foreign.endswith(f":web-0.{ZONE}/%20")) == (" ", True)
    assert grid.sim.request_log.count("PUT") == 0


async def test_a_dns_view_that_goes_makes_the_pool_not_ready(
    kube: KubeClient, namespace: str, grid_factory: Any, infoblox_controller: Any
) -> None:
    grid: Grid = await grid_factory(defaultDNSView="internal")
    grid.sim.state.add_network("10.10.0.0/24")
    view = grid.sim.state.add_dns_view("internal")
    grid.sim.state.add_zone(ZONE, "internal")
    host = {"dnsZone": ZONE, "hostnameSource": "claimName"}
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller() as controller:
        await wait_instance_reason(kube, grid.instance, "Connected")
        # The instance saw the view; it goes before the hostRecord pool is checked. The pool check's zone search
        # names the view, and a real grid answers it with 404 "View internal not found" (not []).
        grid.sim.state.delete(view)
        await grid.create_pool("dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
        text = condition_text(await wait_pool_not_ready(kube, namespace, "dns"))
        assert text.startswith("DNSViewNotFound: DNS view 'internal' does not exist on the grid"), text
        assert "spec.defaultDNSView" in text, text
        await grid.create_claim("c0", "dns")
        claim = await wait_claim_reason(kube, namespace, "c0", "PoolNotReady")
        assert "DNSViewNotFound" in condition_text(claim)
        assert grid.sim.request_log.count("POST", "record:host") == 0
        grid.sim.state.add_dns_view("internal")
        grid.sim.state.add_zone(ZONE, "internal")
        await wait_address(kube, namespace, "c0", timeout=60)
        await wait_pool_reason(kube, namespace, "dns", "PoolReady")
        # Gone again while the pool's check is fresh: the POST of the next claim is the one that meets the 404.
        (view,) = [ref for ref in grid.sim.state.refs("view") if ":internal/" in ref]
        grid.sim.state.delete(view)
        await grid.create_claim("c1", "dns")
        await wait_claim_reason(kube, namespace, "c1", "PoolNotReady")
        # The claim's first failure (its Event) is the POST's; later ones come from the pool check.
        posted = "network 10.10.0.0/24: the pool's DNS view does not exist on the grid (the grid answered "
        await wait_event(kube, namespace, controller, "PoolNotReady", posted + "'View internal not found'); create it")
        # Release never names a view: the claim whose record went with the view is released all the same.
        await kube.delete(CLAIMS, "c0", namespace)
        await wait_gone(kube, namespace, "c0")


async def test_host_names_are_lower_case(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_zone(ZONE)
    # Someone made WEB-0 on the grid; NIOS keeps it as web-0, and a search with `=` is case-sensitive.
    foreign = grid.sim.state.add_host_record(f"WEB-0.{ZONE}", "10.10.0.50", configure_for_dns=True)
    host = {"dnsZone": "Nodes.Example.COM.", "hostnameSource": "claimName"}
    await grid.create_pool("dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
    async with infoblox_controller():
        await grid.create_claim("web-0", "dns")
        failed = await wait_claim_reason(kube, namespace, "web-0", "AllocationFailed")
        text = condition_text(failed)
        assert f"host record web-0.{ZONE} already exists in DNS view default" in text, text
        assert "never adopted" in text, text
        await grid.create_claim("web-1", "dns")
        address = await wait_address(kube, namespace, "web-1")
        assert address["metadata"]["annotations"][ANNOTATION_HOSTNAME] == f"web-1.{ZONE}"
    names = sorted(o["name"] for o in grid.sim.state.objects("record:host"))
    assert names == [f"web-0.{ZONE}", f"web-1.{ZONE}"]
    assert grid.sim.state.get(foreign) is not None


LABEL_64 = "a" * 64
NAME_271 = ".".join(["x" * 63, "y" * 63, "z" * 63, "w" * 61])  # a valid claim name of 253 characters


@pytest.mark.parametrize(
    ("claim_name", "limit"),
    [(LABEL_64, "a DNS label is 1 to 63 characters"), (NAME_271, "over the 253-character limit of a DNS name")],
    ids=["label-64", "name-271"],
)
async def test_a_host_name_over_the_dns_limits_fails_the_claim_as_the_grid_would_refuse_it(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any, claim_name: str, limit: str
) -> None:
    grid.sim.state.add_zone(ZONE)
    host = {"dnsZone": ZONE, "hostnameSource": "claimName"}
    await grid.create_pool("dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
    fqdn = f"{claim_name}.{ZONE}"
    with pytest.raises(WapiError, match="Invalid value for name"):  # the grid refuses this name...
        grid.sim.state.add_host_record(fqdn, "10.10.0.50", configure_for_dns=True)
    at_limit = f"{claim_name[:63]}.{ZONE}" if claim_name == LABEL_64 else f"{claim_name[: 252 - len(ZONE)]}.{ZONE}"
    grid.sim.state.add_host_record(at_limit, "10.10.0.51", configure_for_dns=True)  # ...and takes one at the limit
    async with infoblox_controller():
        await grid.create_claim(claim_name, "dns")  # ...and the backend says why before asking it
        failed = await wait_claim_reason(kube, namespace, claim_name, "AllocationFailed")
        text = condition_text(failed)
        assert f"of claim {namespace}/{claim_name}" in text and limit in text, text
        assert "use a shorter claim name or spec.hostRecord.dnsZone" in text, text
        await grid.create_claim("fits", "dns")
        await wait_address(kube, namespace, "fits")
    assert grid.sim.request_log.count("POST", "record:host") == 1, "only the claim whose name fits was posted"
    assert len(at_limit) in (63 + 1 + len(ZONE), 253)
