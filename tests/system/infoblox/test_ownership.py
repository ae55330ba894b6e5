"""Ownership: the provider owns exactly the grid objects that carry the claim's uid in CAPI-Claim-UID. It never
adopts nor deletes anything else (a same-named host record, an object at the same address, an object an IPAddress's
annotation points at), and it finds what it does own after a restart without posting again."""

from __future__ import annotations

from typing import Any

from backends.infoblox.spec import ANNOTATION_REF, INFOBLOX_POOL
from ipam_provider.api.capi import ADDRESSES, CLAIMS, IPAM_GROUP
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.infoblox import POOLS, Grid, wait_gone, wait_pool_reason
from tests.support.objects import wait_address, wait_claim_reason

Object = dict[str, Any]


def ownership(uid: str, namespace: str, name: str, pool: str) -> dict[str, str]:
    return {
        "CAPI-Claim-UID": uid,
        "CAPI-Claim-Namespace": namespace,
        "CAPI-Claim-Name": name,
        "CAPI-Pool": f"{namespace}/{pool}",
    }


def define_eas(grid: Grid) -> None:
    for name in ("CAPI-Claim-UID", "CAPI-Claim-Namespace", "CAPI-Claim-Name", "CAPI-Cluster-Name", "CAPI-Pool"):
        grid.sim.state.add_ea_definition(name)


async def test_a_same_named_host_record_is_never_adopted_nor_deleted(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_zone("nodes.example.com")
    foreign = grid.sim.state.add_host_record("web-0.nodes.example.com", "10.10.0.50", configure_for_dns=True)
    host = {"dnsZone": "nodes.example.com", "hostnameSource": "claimName"}
    await grid.create_pool("dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
    async with infoblox_controller():
        await grid.create_claim("web-0", "dns")
        failed = await wait_claim_reason(kube, namespace, "web-0", "AllocationFailed")
        message = next(c for c in failed["status"]["conditions"] if c["type"] == "Ready")["message"]
        assert "web-0.nodes.example.com already exists" in message and "never adopted" in message
        assert await kube.get(ADDRESSES, "web-0", namespace) is None
        await kube.delete(CLAIMS, "web-0", namespace)
        await wait_gone(kube, namespace, "web-0")
    record = grid.sim.state.get(foreign)
    assert record is not None, "the hand-made record was deleted"
    assert record["ipv4addrs"][0]["ipv4addr"] == "10.10.0.50" and not record.get("extattrs")
    assert grid.sim.request_log.count("PUT") == 0 and grid.sim.request_log.count("DELETE") == 0


async def test_release_never_deletes_what_an_ipaddress_annotation_points_at_unless_the_claim_owns_it(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    define_eas(grid)
    foreign = grid.sim.state.add_fixed_address("10.10.0.77", comment="the DNS server")
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        created = await grid.create_claim("node-0", "net")
        await wait_address(kube, namespace, "node-0")
        (mine,) = grid.objects_of(created["metadata"]["uid"])
        # Someone edits the IPAddress to name another grid object (or the grid re-used a reference).
        await kube.patch(ADDRESSES, "node-0", {"metadata": {"annotations": {ANNOTATION_REF: foreign}}}, namespace)
        await kube.delete(CLAIMS, "node-0", namespace)
        await wait_gone(kube, namespace, "node-0")
    assert grid.sim.state.get(foreign) is not None, "an object without the claim's uid was deleted"
    assert grid.sim.state.get(mine["_ref"]) is None, "the claim's own object must still be released"


async def test_an_ipaddress_naming_an_address_held_by_someone_else_is_not_adopted(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    foreign = grid.sim.state.add_fixed_address("10.10.0.9", comment="a printer")
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    claim = await grid.create_claim("restored", "net")
    await kube.create(ADDRESSES, restored_address(namespace, claim, "10.10.0.9"), namespace)
    async with infoblox_controller():
        failed = await wait_claim_reason(kube, namespace, "restored", "AllocationFailed")
        assert "held on the grid by fixedaddress/" in str(failed["status"]["conditions"])
        await kube.delete(CLAIMS, "restored", namespace)
        await wait_gone(kube, namespace, "restored")
    assert grid.sim.state.get(foreign) is not None
    assert grid.sim.state.count("fixedaddress") == 1


async def test_an_ipaddress_whose_grid_object_vanished_gets_its_address_back(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    claim = await grid.create_claim("restored", "net")
    await kube.create(ADDRESSES, restored_address(namespace, claim, "10.10.0.42"), namespace)
    async with infoblox_controller():
        await wait_claim_reason(kube, namespace, "restored", "AddressAllocated")
        (obj,) = grid.objects_of(claim["metadata"]["uid"])
        assert obj["ipv4addr"] == "10.10.0.42", "the address the IPAddress names is reserved for the claim"


async def test_an_object_held_for_the_claims_name_under_an_old_uid_is_re_keyed_not_duplicated(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    """`clusterctl move` (or a restore) re-creates a claim under a new uid, with its IPAddress: the grid object that
    the same claim namespace/name held from the same pool is taken over, not refused nor reserved again. One held
    for another claim name is still refused."""
    define_eas(grid)
    moved = grid.sim.state.add_fixed_address("10.10.0.43", extattrs=ownership("old-uid", namespace, "moved", "net"))
    other = grid.sim.state.add_fixed_address("10.10.0.44", extattrs=ownership("old-2", namespace, "someone", "net"))
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    claim = await grid.create_claim("moved", "net")
    stranger = await grid.create_claim("stranger", "net")
    await kube.create(ADDRESSES, restored_address(namespace, claim, "10.10.0.43"), namespace)
    await kube.create(ADDRESSES, restored_address(namespace, stranger, "10.10.0.44"), namespace)
    async with infoblox_controller():
        await wait_claim_reason(kube, namespace, "moved", "AddressAllocated")
        (obj,) = grid.objects_of(claim["metadata"]["uid"])
        assert obj["_ref"] == moved and obj["ipv4addr"] == "10.10.0.43"
        assert grid.sim.state.count("fixedaddress") == 2, "nothing reserved twice"
        failed = await wait_claim_reason(kube, namespace, "stranger", "AllocationFailed")
        assert "held on the grid by fixedaddress/" in str(failed["status"]["conditions"])
        assert grid.objects_of("old-2")[0]["_ref"] == other

        await kube.delete(CLAIMS, "moved", namespace)
        await wait_gone(kube, namespace, "moved")
        assert grid.sim.state.get(moved) is None, "released as the claim's own"
        await kube.delete(CLAIMS, "stranger", namespace)
        await wait_gone(kube, namespace, "stranger")
    assert grid.sim.state.get(other) is not None


async def test_an_object_posted_before_a_crash_is_found_without_posting_again(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    """The previous process posted (the grid committed) and died before it created the IPAddress."""
    define_eas(grid)
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    claim = await grid.create_claim("survivor", "net")
    uid = claim["metadata"]["uid"]
    grid.sim.state.add_fixed_address("10.10.0.200", extattrs=ownership(uid, namespace, "survivor", "net"))
    # And a claim that posted twice (a reply lost, then searched for too early): one object must go.
    twice = await grid.create_claim("twice", "net")
    for value in ("10.10.0.201", "10.10.0.202"):
        eas = ownership(twice["metadata"]["uid"], namespace, "twice", "net")
        grid.sim.state.add_fixed_address(value, extattrs=eas)
    async with infoblox_controller():
        address = await wait_address(kube, namespace, "survivor")
        assert address["spec"]["address"] == "10.10.0.200"
        kept = (await wait_address(kube, namespace, "twice"))["spec"]["address"]
        assert kept in ("10.10.0.201", "10.10.0.202")
        await wait_pool_reason(kube, namespace, "net", "PoolReady")
        assert grid.sim.request_log.count("POST", "fixedaddress") == 0, "nothing posted: the index knew"
        # The next look at the claim (its IPAddress's creation brings one) finds the IPAddress and drops the surplus.

        async def one_left() -> bool:
            return len(grid.objects_of(twice["metadata"]["uid"])) == 1

        await wait_for(one_left, message="the surplus object of claim twice to be released")
        assert grid.objects_of(twice["metadata"]["uid"])[0]["ipv4addr"] == kept


def restored_address(namespace: str, claim: Object, address: str) -> Object:
    """An IPAddress as a backup restore (or a previous process) leaves it: no owner references yet."""
    return {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {"name": claim["metadata"]["name"], "namespace": namespace},
        "spec": {
            "claimRef": {"name": claim["metadata"]["name"]},
            "poolRef": {"apiGroup": IPAM_GROUP, "kind": INFOBLOX_POOL.kind, "name": "net"},
            "address": address,
            "prefix": 24,
        },
    }


async def test_release_goes_to_the_grid_that_holds_the_address_after_the_pool_is_repointed(
    kube: KubeClient, namespace: str, grid: Grid, grid_factory: Any, infoblox_controller: Any
) -> None:
    other: Grid = await grid_factory()
    other.sim.state.add_network("10.10.0.0/24")
    pool = await grid.create_pool("moving", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        created = await grid.create_claim("node-0", "moving")
        await wait_address(kube, namespace, "node-0")
        assert len(grid.objects_of(created["metadata"]["uid"])) == 1
        # The operator moves the pool to another grid; the address stays where it was allocated.
        repoint = {"spec": {"instanceRef": {"name": other.instance}}}
        await kube.patch(POOLS, pool["metadata"]["name"], repoint, namespace)
        await kube.delete(CLAIMS, "node-0", namespace)
        await wait_gone(kube, namespace, "node-0")
        assert grid.objects_of(created["metadata"]["uid"]) == [], "released on the grid that held it"
        assert not other.sim.request_log.count("DELETE")
