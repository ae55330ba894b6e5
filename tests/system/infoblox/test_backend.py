"""The Infoblox backend end to end: the real API server, the controller, infoblox-client, and the WAPI simulator.

Allocation and release of fixed addresses (IPv4, IPv6) and host records (claim name, Machine owner chain), the
ownership attributes, the gateway, subnet fall-through then exhaustion, the pool's status, and one WAPI request per
allocation in steady state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from backends.infoblox.spec import ANNOTATION_HOSTNAME, ANNOTATION_INSTANCE, ANNOTATION_REF
from ipam_provider.api.capi import CLAIMS, CLUSTERS, MACHINES
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tests.support.cluster import wait_for
from tests.support.infoblox import POOLS, Grid, wait_gone, wait_pool_reason
from tests.support.objects import cluster, wait_address, wait_claim_reason
from tools.controlplane.crds import install_crds

CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)
Object = dict[str, Any]


def ea(obj: Object, name: str) -> Any:
    return ((obj.get("extattrs") or {}).get(name) or {}).get("value")


async def test_allocate_and_release_a_fixed_address(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_fixed_address("10.10.0.1")  # the router holds the gateway on the grid
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24", "gateway": "10.10.0.1"}])
    async with infoblox_controller():
        created = await grid.create_claim("node-0", "net")
        address = await wait_address(kube, namespace, "node-0")
        assert address["spec"]["address"] == "10.10.0.2"
        assert (address["spec"]["prefix"], address["spec"]["gateway"]) == (24, "10.10.0.1")
        (obj,) = grid.objects_of(created["metadata"]["uid"])
        annotations = address["metadata"]["annotations"]
        assert annotations[ANNOTATION_REF] == obj["_ref"] and annotations[ANNOTATION_INSTANCE] == grid.instance
        assert obj["ipv4addr"] == "10.10.0.2" and obj["mac"] == "00:00:00:00:00:00"

        await kube.delete(CLAIMS, "node-0", namespace)
        await wait_gone(kube, namespace, "node-0")
        assert grid.sim.state.get(obj["_ref"]) is None, "the fixed address outlived its claim"
        assert grid.sim.state.used_addresses() == ["10.10.0.1"], "only the router's address remains"


async def test_ownership_attributes_are_on_every_object(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_ea_definition("Site")
    await kube.create(CLUSTERS, cluster("prod"), namespace)
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}], extensibleAttributes={"Site": "fra1"})
    async with infoblox_controller():
        created = await grid.create_claim("node-0", "net", cluster="prod")
        await wait_address(kube, namespace, "node-0")
        (obj,) = grid.objects_of(created["metadata"]["uid"])
        assert {name: entry["value"] for name, entry in obj["extattrs"].items()} == {
            "CAPI-Claim-UID": created["metadata"]["uid"],
            "CAPI-Claim-Namespace": namespace,
            "CAPI-Claim-Name": "node-0",
            "CAPI-Cluster-Name": "prod",
            "CAPI-Pool": f"{namespace}/net",
            "Site": "fra1",
        }
        assert obj["comment"] == f"Cluster API IPAddressClaim {namespace}/node-0"
        # The provider defined its attributes on the grid itself (the instance allows it by default).
        names = {d["name"] for d in grid.sim.state.objects("extensibleattributedef")}
        assert {"CAPI-Claim-UID", "CAPI-Claim-Namespace", "CAPI-Claim-Name", "CAPI-Cluster-Name", "CAPI-Pool"} <= names


async def test_ipv6_fixed_address(kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any) -> None:
    grid.sim.state.add_network("fd00:10::/64")
    await grid.create_pool("net6", subnets=[{"cidr": "fd00:10::/64", "gateway": "fd00:10::1"}])
    grid.sim.state.add_fixed_address("fd00:10::1")
    async with infoblox_controller():
        created = await grid.create_claim("node-0", "net6")
        address = await wait_address(kube, namespace, "node-0")
        assert (address["spec"]["address"], address["spec"]["prefix"]) == ("fd00:10::2", 64)
        (obj,) = grid.objects_of(created["metadata"]["uid"], "ipv6fixedaddress")
        uid_hex = created["metadata"]["uid"].replace("-", "")
        assert obj["duid"].replace(":", "") == "0004" + uid_hex, "a DUID-UUID made of the claim's uid"
        await kube.delete(CLAIMS, "node-0", namespace)
        await wait_gone(kube, namespace, "node-0")
        assert not grid.objects_of(created["metadata"]["uid"], "ipv6fixedaddress")


async def test_a_free_gateway_is_reserved_not_handed_out(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24", "gateway": "10.10.0.1"}])
    async with infoblox_controller():
        await grid.create_claim("a", "net")
        await grid.create_claim("b", "net")
        got = {(await wait_address(kube, namespace, n))["spec"]["address"] for n in ("a", "b")}
        assert got == {"10.10.0.2", "10.10.0.3"}
        (reservation,) = grid.sim.state.find("fixedaddress", ipv4addr="10.10.0.1")
        assert {name: e["value"] for name, e in reservation["extattrs"].items()} == {"CAPI-Pool": f"{namespace}/net"}


async def test_host_record_named_after_the_claim(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_zone("nodes.example.com")
    host = {"dnsZone": "nodes.example.com", "hostnameSource": "claimName"}
    await grid.create_pool("dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
    async with infoblox_controller():
        created = await grid.create_claim("web-0", "dns")
        address = await wait_address(kube, namespace, "web-0")
        (record,) = grid.objects_of(created["metadata"]["uid"], "record:host")
        assert record["name"] == "web-0.nodes.example.com" and record["view"] == "default"
        assert record["configure_for_dns"] is True and record["zone"] == "nodes.example.com"
        assert [e["ipv4addr"] for e in record["ipv4addrs"]] == [address["spec"]["address"]]
        assert address["metadata"]["annotations"][ANNOTATION_HOSTNAME] == "web-0.nodes.example.com"
        assert not grid.sim.state.objects("fixedaddress"), "host record mode writes no fixed address"
        await kube.delete(CLAIMS, "web-0", namespace)
        await wait_gone(kube, namespace, "web-0")
        assert not grid.sim.state.objects("record:host")


async def test_ipv6_host_record(kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any) -> None:
    grid.sim.state.add_network("fd00:20::/64")
    grid.sim.state.add_zone("v6.example.com")
    host = {"dnsZone": "v6.example.com", "hostnameSource": "claimName"}
    await grid.create_pool("dns6", subnets=[{"cidr": "fd00:20::/64"}], mode="hostRecord", hostRecord=host)
    async with infoblox_controller():
        created = await grid.create_claim("web-6", "dns6")
        address = await wait_address(kube, namespace, "web-6")
        assert (address["spec"]["address"], address["spec"]["prefix"]) == ("fd00:20::1", 64)
        (record,) = grid.objects_of(created["metadata"]["uid"], "record:host")
        assert record["name"] == "web-6.v6.example.com" and "ipv4addrs" not in record
        assert [e["ipv6addr"] for e in record["ipv6addrs"]] == ["fd00:20::1"]
        await kube.delete(CLAIMS, "web-6", namespace)
        await wait_gone(kube, namespace, "web-6")
        assert not grid.sim.state.objects("record:host")


async def test_host_record_named_after_the_machine_owning_the_claim(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any, tmp_path: Path
) -> None:
    grid.sim.state.add_zone("nodes.example.com")
    await install_crds(kube, [infrastructure_crd(tmp_path, "Metal3Data", "metal3datas")])
    await kube.create(CLUSTERS, cluster("prod"), namespace)
    machine = await kube.create(
        MACHINES,
        {
            "apiVersion": MACHINES.api_version,
            "kind": "Machine",
            "metadata": {"name": "prod-md-0-x7k2p"},
            "spec": {
                "clusterName": "prod",
                "bootstrap": {"dataSecretName": "prod-md-0-x7k2p-bootstrap"},
                "infrastructureRef": {
                    "apiGroup": "infrastructure.cluster.x-k8s.io",
                    "kind": "Metal3Machine",
                    "name": "prod-md-0-x7k2p",
                },
            },
        },
        namespace,
    )
    # An infrastructure object between the Machine and the claim, as CAPM3's Metal3Data is.
    owned_by_machine = {"name": "infra-vm", "ownerReferences": [owner(machine, controller=True)]}
    infra = await kube.create(METAL3_DATAS, {**METAL3_DATA, "metadata": owned_by_machine}, namespace)
    # A ConfigMap is no infrastructure kind: the walk does not read it, even when it names the Machine.
    config_map = await kube.create(CONFIGMAPS, {"metadata": owned_by_machine}, namespace)
    await grid.create_pool(
        "dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord={"dnsZone": "nodes.example.com"}
    )
    async with infoblox_controller():
        direct = await grid.create_claim("direct", "dns", cluster="prod")
        await kube.patch(CLAIMS, "direct", {"metadata": {"ownerReferences": [owner(machine, True)]}}, namespace)
        chained = await grid.create_claim("chained-eth0", "dns", cluster="prod")
        await kube.patch(CLAIMS, "chained-eth0", {"metadata": {"ownerReferences": [owner(infra, True)]}}, namespace)
        orphan = await grid.create_claim("orphan", "dns", cluster="prod")
        unknown = await grid.create_claim("unknown", "dns", cluster="prod")
        await kube.patch(CLAIMS, "unknown", {"metadata": {"ownerReferences": [owner(config_map, True)]}}, namespace)
        forged = await grid.create_claim("forged", "dns", cluster="prod")
        other_uid = {**owner(machine, True), "uid": "0f0f0f0f-0000-4000-8000-000000000000"}
        await kube.patch(CLAIMS, "forged", {"metadata": {"ownerReferences": [other_uid]}}, namespace)

        await wait_address(kube, namespace, "direct")
        (record,) = grid.objects_of(direct["metadata"]["uid"], "record:host")
        assert record["name"] == "prod-md-0-x7k2p.nodes.example.com"
        # The second claim reaches the same Machine through the Metal3Data: the name is taken, and not by it.
        failed = await wait_claim_reason(kube, namespace, "chained-eth0", "AllocationFailed")
        message = next(c for c in failed["status"]["conditions"] if c["type"] == "Ready")["message"]
        assert "prod-md-0-x7k2p.nodes.example.com already exists" in message and "direct" in message
        assert not grid.objects_of(chained["metadata"]["uid"], "record:host")
        await kube.delete(CLAIMS, "direct", namespace)
        await wait_address(kube, namespace, "chained-eth0")
        (record,) = grid.objects_of(chained["metadata"]["uid"], "record:host")
        assert record["name"] == "prod-md-0-x7k2p.nodes.example.com"
        for name, why in (
            ("orphan", "no cluster.x-k8s.io Machine among its owners"),
            ("unknown", "not followed: ConfigMap 'infra-vm' of an unknown kind"),
            ("forged", "is not the object its owner reference names (another uid)"),
        ):
            refused = await wait_claim_reason(kube, namespace, name, "AllocationFailed")
            assert why in str(refused["status"]["conditions"]), refused["status"]
        for refused_claim in (orphan, unknown, forged):
            assert not grid.objects_of(refused_claim["metadata"]["uid"], "record:host"), "no guessed host name"


METAL3_DATAS = Resource("infrastructure.cluster.x-k8s.io", "v1beta1", "metal3datas", "Metal3Data", namespaced=True)
METAL3_DATA = {"apiVersion": METAL3_DATAS.api_version, "kind": "Metal3Data"}


def infrastructure_crd(directory: Path, kind: str, plural: str) -> Path:
    """A minimal CRD of an infrastructure kind (any fields kept), written to `directory`."""
    body = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.infrastructure.cluster.x-k8s.io"},
        "spec": {
            "group": "infrastructure.cluster.x-k8s.io",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1beta1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    path = directory / f"{plural}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def owner(obj: Object, controller: bool = False) -> Object:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": controller,
    }


async def test_subnets_fall_through_then_the_pool_is_exhausted(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_network("10.20.0.0/30")
    grid.sim.state.add_network("10.20.1.0/30")
    subnets = [{"cidr": "10.20.0.0/30"}, {"cidr": "10.20.1.0/30"}]
    await grid.create_pool("small", subnets=subnets)
    async with infoblox_controller():
        for i in range(4):
            await grid.create_claim(f"c{i}", "small")
            address = await wait_address(kube, namespace, f"c{i}")
            expected = ["10.20.0.1", "10.20.0.2", "10.20.1.1", "10.20.1.2"][i]
            assert address["spec"]["address"] == expected, "subnets are used in the pool's order"
            assert address["spec"]["prefix"] == 30
        await grid.create_claim("c4", "small")
        exhausted = await wait_claim_reason(kube, namespace, "c4", "PoolExhausted")
        assert "10.20.0.0/30" in str(exhausted["status"]["conditions"])
        await kube.delete(CLAIMS, "c1", namespace)
        address = await wait_address(kube, namespace, "c4", timeout=60)
        assert address["spec"]["address"] == "10.20.0.2", "a released address of the first subnet is used again"


async def test_pool_status_counts_and_is_ready(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_range("10.10.0.100", "10.10.0.109")
    await grid.create_pool(
        "net",
        subnets=[{"cidr": "10.10.0.0/24"}],
        ranges=[{"start": "10.10.0.100", "end": "10.10.0.109", "prefix": 24}],
    )
    async with infoblox_controller():
        ready = await wait_pool_reason(kube, namespace, "net", "PoolReady")
        # The range lies inside the subnet: its ten addresses are counted once.
        assert ready["status"]["ipAddresses"] == {"total": 254, "used": 0, "free": 254}
        assert ready["status"]["networkView"] == "default"
        await grid.create_claim("a", "net")
        await wait_address(kube, namespace, "a")

        async def counted() -> Object | None:
            pool = await kube.get(POOLS, "net", namespace)
            return pool if (pool or {}).get("status", {}).get("ipAddresses", {}).get("used") == 1 else None

        pool = await wait_for(counted, message="the pool to count its address")
        assert pool["status"]["ipAddresses"]["free"] == 253


async def test_one_wapi_request_per_allocation_in_steady_state(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_fixed_address("10.10.0.1")
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24", "gateway": "10.10.0.1"}])
    async with infoblox_controller():
        await wait_pool_reason(kube, namespace, "net", "PoolReady")
        await grid.create_claim("warm-up", "net")
        await wait_address(kube, namespace, "warm-up")
        grid.sim.request_log.reset()
        for i in range(20):
            await grid.create_claim(f"c{i}", "net")
        addresses = [(await wait_address(kube, namespace, f"c{i}"))["spec"]["address"] for i in range(20)]
        assert len(set(addresses)) == 20
        counts = grid.sim.request_log.counts()
        assert counts == {("POST", "fixedaddress"): 20}, f"expected exactly one POST per allocation, got {counts}"
        entry = grid.sim.request_log.entries[0]
        assert "func:nextavailableip:10.10.0.0/24,default" in entry.body.decode()
        assert "_return_fields=ipv4addr%2Cnetwork_view%2Cextattrs" in entry.query

        grid.sim.request_log.reset()
        await kube.delete(CLAIMS, "c0", namespace)
        await wait_gone(kube, namespace, "c0")
        counts = grid.sim.request_log.counts()
        assert counts == {("GET", "fixedaddress"): 1, ("DELETE", "fixedaddress"): 1}, counts
