"""CAPMOX's own IPAM code drives our controller: the helper of its package pkg/kubernetes/ipam (built from its Go module
through hack/providers/capmox) writes the cluster's InClusterIPPools with the Go in-cluster provider v1.1.0's types,
creates two ProxmoxMachines' claims, and resolves them with ResolveIPAddressClaim, which accepts an IPAddress only
when its claim's owner and poolRef and the IPAddress's poolRef all match. Our controller runs as a separate process.

CAPMOX's ProxmoxCluster and ProxmoxMachine CRDs come from the module's config/crd/bases; the Cluster they hang under
is Cluster API's (the session's CRDs). Nothing here runs CAPMOX's reconcilers: the harness calls the helper as they
do. The harness stores the pools in the ProxmoxCluster's status with CAPMOX's SetInClusterIPPoolRef, which in v0.9.0
panics on a second zone (after appending the zone it indexes one past the end); the harness reports the panic and sets
that zone's reference itself. The machine reconciler itself cannot run here: it and its VM service live under CAPMOX's
internal/ (not importable from another module), and its mock of the Proxmox API is an in-process testify mock, not a
server.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from ipam_provider.api.capi import ADDRESSES, CLAIMS, CLUSTERS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tests.ipam_provider.test_cli import free_port
from tests.support.cluster import wait_for
from tests.support.objects import POOLS, cluster
from tests.support.providers import Harness as Built
from tests.system.test_admission_process import controller_process, tail, wait_ready
from tools.controlplane.crds import install_crds

INFRA_GROUP = "infrastructure.cluster.x-k8s.io"
PROXMOX_CLUSTERS = Resource(INFRA_GROUP, "v1alpha2", "proxmoxclusters", "ProxmoxCluster", namespaced=True)
PROXMOX_MACHINES = Resource(INFRA_GROUP, "v1alpha2", "proxmoxmachines", "ProxmoxMachine", namespaced=True)
ZONE_LABEL = "topology.kubernetes.io/proxmox-zone"
FAMILY_ANNOTATION = "ipam.capmox.cluster.x-k8s.io/ip-family"
NAME = "c1"  # the Cluster and the ProxmoxCluster
ZONE = "zone-a"
Object = dict[str, Any]

# The ProxmoxCluster's networks: the default zone's and zone-a's, each IPv4 and IPv6.
DEFAULT_V4 = {"addresses": ["10.50.0.10-10.50.0.20"], "prefix": 24, "gateway": "10.50.0.1"}
DEFAULT_V6 = {"addresses": ["2001:db8:50::10-2001:db8:50::20"], "prefix": 64, "gateway": "2001:db8:50::1"}
ZONE_V4 = {"addresses": ["10.51.0.10-10.51.0.20"], "prefix": 24, "gateway": "10.51.0.1"}
ZONE_V6 = {"addresses": ["2001:db8:51::10-2001:db8:51::20"], "prefix": 64, "gateway": "2001:db8:51::1"}
# The pools CAPMOX names after them (`<cluster>-[<zone>-]v4-icip`), with the spec it must write.
EXPECTED_POOLS: dict[str, tuple[str, str, Object]] = {
    f"{NAME}-v4-icip": ("default", "ipv4", DEFAULT_V4),
    f"{NAME}-v6-icip": ("default", "ipv6", DEFAULT_V6),
    f"{NAME}-{ZONE}-v4-icip": (ZONE, "ipv4", ZONE_V4),
    f"{NAME}-{ZONE}-v6-icip": (ZONE, "ipv6", ZONE_V6),
}
# What our CRD defaults in a pool spec that the Go provider v1.1.0's types do not know (its client drops them on read,
# so CAPMOX's create-or-update sees no difference).
OUR_DEFAULTS = {"allocationStrategy": "LowestFree", "reserveStaticBand": False}
ZONE_POOLS = [f"{NAME}-{ZONE}-v4-icip", f"{NAME}-{ZONE}-v6-icip"]


@pytest_asyncio.fixture(scope="module")
async def capmox_build(provider_harness: Callable[[str], Built], kube: KubeClient) -> Built:
    """The capmox harness (built in a thread: a cold build takes minutes), with CAPMOX's CRDs installed from its
    module's config/crd/bases."""
    built = await asyncio.to_thread(provider_harness, "capmox")
    bases = built.module_dir / "config" / "crd" / "bases"
    paths = sorted(bases.glob("infrastructure.cluster.x-k8s.io_proxmox*.yaml"))
    assert paths, f"no ProxmoxCluster/ProxmoxMachine CRDs under {bases}"
    await install_crds(kube, paths)
    return built


class Capmox:
    """The capmox harness binary, run against one namespace's ProxmoxCluster."""

    def __init__(self, binary: Path, kubeconfig: Path, namespace: str) -> None:
        self.binary, self.kubeconfig, self.namespace = binary, kubeconfig, namespace

    async def __call__(self, command: str, *args: str) -> Any:
        process = await asyncio.create_subprocess_exec(
            str(self.binary), command, f"--kubeconfig={self.kubeconfig}", f"--namespace={self.namespace}",
            f"--cluster={NAME}", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 90)
        assert process.returncode == 0, f"capmox {command} {' '.join(args)} failed:\n{err.decode()}"
        return json.loads(out)

    async def resolve(self, machine: str) -> list[Object]:
        result: list[Object] = await self("resolve", f"--machine={machine}")
        return result

    async def wait_resolved(self, machine: str, timeout: float = 60) -> list[Object]:
        last: list[list[Object]] = []

        async def resolved() -> list[Object] | None:
            last[:] = [await self.resolve(machine)]
            return last[0] if last[0] and all(r["status"] == "ClaimResolved" for r in last[0]) else None

        def message() -> str:
            return f"{machine}'s claims ClaimResolved (our controller serves them); last: {last}"

        return await wait_for(resolved, timeout=timeout, interval=0.5, message=message)


def proxmox_cluster(owner: Object) -> Object:
    zone = {"zone": ZONE, "dnsServers": ["10.51.0.2"], "ipv4Config": ZONE_V4, "ipv6Config": ZONE_V6}
    uid = owner["metadata"]["uid"]
    owner_ref = {"apiVersion": CLUSTERS.api_version, "kind": CLUSTERS.kind, "name": NAME, "uid": uid}
    return {
        "apiVersion": PROXMOX_CLUSTERS.api_version,
        "kind": PROXMOX_CLUSTERS.kind,
        "metadata": {"name": NAME, "ownerReferences": [owner_ref]},
        "spec": {"dnsServers": ["10.50.0.2"], "ipv4Config": DEFAULT_V4, "ipv6Config": DEFAULT_V6, "zoneConfig": [zone]},
    }


def proxmox_machine(name: str) -> Object:
    device = {"name": "net0", "bridge": "vmbr0", "defaultIPv4": True, "defaultIPv6": True}
    return {
        "apiVersion": PROXMOX_MACHINES.api_version,
        "kind": PROXMOX_MACHINES.kind,
        "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": NAME}},
        "spec": {"sourceNode": "pve1", "templateID": 100, "network": {"zone": ZONE, "networkDevices": [device]}},
    }


@pytest_asyncio.fixture
async def capmox(capmox_build: Built, kube: KubeClient, kubeconfig: Path, namespace: str) -> Capmox:
    """The harness over a namespace holding the Cluster, its ProxmoxCluster and three ProxmoxMachines."""
    owner = await kube.create(CLUSTERS, cluster(NAME), namespace)
    await kube.create(PROXMOX_CLUSTERS, proxmox_cluster(owner), namespace)
    for machine in ("m1", "m2", "m3"):
        await kube.create(PROXMOX_MACHINES, proxmox_machine(machine), namespace)
    return Capmox(capmox_build.binary, kubeconfig, namespace)


@contextlib.asynccontextmanager
async def our_controller(kubeconfig: Path, namespace: str, log: Path) -> AsyncIterator[None]:
    health = free_port()
    async with controller_process(kubeconfig, namespace, log, [f"--health-probe-bind-address=127.0.0.1:{health}"]) as p:
        await wait_ready(p, health, log)
        yield
        assert p.returncode is None, f"our controller exited:\n{tail(log)}"


async def assert_pools_as_capmox_wrote_them(kube: KubeClient, namespace: str, proxmox_uid: str) -> dict[str, Object]:
    """The four pools exist, read back as CAPMOX's Go types wrote them (nothing pruned or rewritten; our CRD's
    defaults added)."""
    pools = {name: await kube.get(POOLS, name, namespace) for name in EXPECTED_POOLS}
    for name, (zone, family, network) in EXPECTED_POOLS.items():
        pool = pools[name]
        assert pool is not None, f"CAPMOX's pool {name} was not created"
        written = {**network, "addressReuseGracePeriodSeconds": 60}
        assert pool["spec"] == {**written, **OUR_DEFAULTS}, pool["spec"]
        assert pool["metadata"]["labels"] == {ZONE_LABEL: zone}
        assert pool["metadata"]["annotations"][FAMILY_ANNOTATION] == family
        (owner,) = pool["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("ProxmoxCluster", NAME, proxmox_uid), owner
        assert owner["controller"] is True, owner
    return {name: pool for name, pool in pools.items() if pool is not None}


def assert_addresses_from_our_controller(
    resolved: list[Object], claims: dict[str, Object], addresses: dict[str, Object]
) -> None:
    """Each resolution is our IPAddress for the claim: in the claim's pool, with its prefix and gateway, and the
    IPAddress's poolRef equal to the claim's."""
    for result in resolved:
        pool_name, (_, _, network) = result["pool"], EXPECTED_POOLS[result["pool"]]
        claim, ours = claims[result["claim"]], addresses[result["addressName"]]
        assert claim["status"]["addressRef"]["name"] == result["addressName"]
        assert ours["spec"]["claimRef"]["name"] == result["claim"]
        assert ours["spec"]["poolRef"] == claim["spec"]["poolRef"] == {
            "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": pool_name,
        }  # fmt: skip
        assert result["address"] == ours["spec"], (result["address"], ours["spec"])
        assert (ours["spec"]["prefix"], ours["spec"]["gateway"]) == (network["prefix"], network["gateway"])
        first, last = (ipaddress.ip_address(end) for end in network["addresses"][0].split("-"))
        value = ipaddress.ip_address(ours["spec"]["address"])
        assert value.version == first.version and int(first) <= int(value) <= int(last), (pool_name, value)
        assert claim["metadata"]["labels"] == {"cluster.x-k8s.io/cluster-name": NAME, ZONE_LABEL: ZONE}
        (owner,) = [o for o in claim["metadata"]["ownerReferences"] if o.get("controller")]
        assert owner["kind"] == "ProxmoxMachine" and result["claim"].startswith(f"{owner['name']}-net0-"), owner


async def by_name(kube: KubeClient, resource: Resource, namespace: str) -> dict[str, Object]:
    items, _ = await kube.list(resource, namespace)
    return {item["metadata"]["name"]: item for item in items}


async def used_counts(kube: KubeClient, namespace: str) -> dict[str, int | None]:
    counts: dict[str, int | None] = {}
    for name in ZONE_POOLS:
        pool = await kube.get(POOLS, name, namespace) or {}
        counts[name] = ((pool.get("status") or {}).get("ipAddresses") or {}).get("used")
    return counts


async def wait_used(kube: KubeClient, namespace: str, used: int) -> None:
    async def probe() -> bool:
        return all(count == used for count in (await used_counts(kube, namespace)).values())

    await wait_for(probe, timeout=30, message=lambda: f"zone pools' status.ipAddresses.used == {used}")


def writes(result: Object) -> list[tuple[str, str, str]]:
    return sorted((w["verb"], w["kind"], w["name"]) for w in result["writes"])


async def create_pools(capmox: Capmox, kube: KubeClient, namespace: str) -> dict[str, Object]:
    """CAPMOX's CreateOrUpdateInClusterIPPool creates the four pools, our CRDs accept them as written, and the
    ProxmoxCluster's status names them per zone (as CAPMOX's cluster reconciler stores them)."""
    created = await capmox("pools")
    assert writes(created) == sorted(("create", "InClusterIPPool", name) for name in EXPECTED_POOLS), created
    proxmox = await kube.get(PROXMOX_CLUSTERS, NAME, namespace)
    assert proxmox is not None
    pools = await assert_pools_as_capmox_wrote_them(kube, namespace, proxmox["metadata"]["uid"])
    zones = {z["zone"]: (z["ipv4"], z["ipv6"]) for z in created["zones"]}
    assert zones == {"default": (f"{NAME}-v4-icip", f"{NAME}-v6-icip"), ZONE: tuple(ZONE_POOLS)}, created
    return pools


async def assert_pools_unchanged(capmox: Capmox, kube: KubeClient, namespace: str, before: dict[str, Object]) -> None:
    """Running the create-or-update again sends no write at all (CAPMOX's mutate finds nothing to change in what our
    CRDs stored and our controller added): generation, spec, labels, annotations and owner unchanged. The
    resourceVersion is not compared: our controller writes the pools' status and finalizer."""
    again = await capmox("pools")
    assert writes(again) == [], f"CAPMOX rewrote pools our API server had accepted: {again['writes']}"
    for name, old in before.items():
        new = await kube.get(POOLS, name, namespace)
        assert new is not None
        assert new["metadata"]["generation"] == old["metadata"]["generation"], name
        assert new["spec"] == old["spec"], name
        for field in ("labels", "annotations", "ownerReferences"):
            assert new["metadata"].get(field) == old["metadata"].get(field), (name, field)


async def claim_and_resolve(capmox: Capmox, kube: KubeClient, namespace: str) -> dict[str, list[Object]]:
    """m1's claims are created before our controller runs (they stay ClaimPending until it does), m2's after."""
    resolved = {machine: await capmox.wait_resolved(machine) for machine in ("m1", "m2")}
    results = [*resolved["m1"], *resolved["m2"]]
    assert sorted(r["pool"] for r in results) == sorted(ZONE_POOLS * 2)
    claims, addresses = await by_name(kube, CLAIMS, namespace), await by_name(kube, ADDRESSES, namespace)
    assert_addresses_from_our_controller(results, claims, addresses)
    for pool_name in ZONE_POOLS:
        values = [r["address"]["address"] for r in results if r["pool"] == pool_name]
        assert len(set(values)) == 2, f"{pool_name} handed out {values}"
    return resolved


async def release_and_reuse(
    capmox: Capmox, kube: KubeClient, namespace: str, resolved: dict[str, list[Object]]
) -> None:
    """Deleting m1's claims (what CAPMOX leaves to the garbage collector when the machine goes) deletes its
    IPAddresses and frees them in the pools' status counts; the pools' 60 s reuse grace period keeps them from the
    next machine: m3 (whose lowest free addresses, without it, would be m1's) gets others."""
    released = {r["pool"]: r["address"]["address"] for r in resolved["m1"]}
    for result in resolved["m1"]:
        assert await kube.delete(CLAIMS, result["claim"], namespace)

    async def gone() -> bool:
        names = await by_name(kube, ADDRESSES, namespace)
        return not any(r["addressName"] in names for r in resolved["m1"])

    await wait_for(gone, timeout=30, message="m1's IPAddresses deleted with its claims")
    missing = await capmox.resolve("m1")
    assert [(r["status"], r["orphanedAddress"]) for r in missing] == [("ClaimMissing", "")] * 2, missing
    await wait_used(kube, namespace, 1)
    assert len((await capmox("claim", "--machine=m3"))["writes"]) == 2
    taken = {r["pool"]: r["address"]["address"] for r in await capmox.wait_resolved("m3")}
    held = {r["pool"]: r["address"]["address"] for r in resolved["m2"]}
    for pool_name in ZONE_POOLS:
        assert taken[pool_name] not in (released[pool_name], held[pool_name]), (pool_name, taken, released, held)
    await wait_used(kube, namespace, 2)


@pytest.mark.apiserver
async def test_capmox_ipam_helper_is_served_by_our_controller(
    capmox: Capmox, kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    pools = await create_pools(capmox, kube, namespace)
    created = await capmox("claim", "--machine=m1")
    assert [(w[0], w[1]) for w in writes(created)] == [("create", "IPAddressClaim")] * 2, created
    pending = await capmox.resolve("m1")
    assert [r["status"] for r in pending] == ["ClaimPending"] * 2, f"resolved without our controller: {pending}"
    async with our_controller(kubeconfig, namespace, tmp_path / "controller.log"):
        await capmox("claim", "--machine=m2")
        resolved = await claim_and_resolve(capmox, kube, namespace)
        await wait_used(kube, namespace, 2)
        await assert_pools_unchanged(capmox, kube, namespace, pools)
        await release_and_reuse(capmox, kube, namespace, resolved)
