"""CAPV v1.16.1 drives the controller: its own VSphereVM controller, against govmomi's vCenter simulator (vcsim),
creates the claims of a VM's network devices, waits for them, and gives the clone our addresses.

Everything runs for real: the API server and etcd, NetBox, our controller as a separate process, and CAPV's
VSphereVM controller with vcsim in the harness of hack/providers/capv/. What vcsim received is read back from vcsim
(`capv-harness inspect`): the cloud-init metadata CAPV wrote into the clone's guestinfo, with each device's
addresses and gateways.

The harness also runs CAPV's VSphereCluster controller (govmomi mode): a Cluster whose control-plane endpoint our
controller allocates from a pool has it copied into its VSphereCluster, which CAPV provisions against vcsim.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ipam_provider.api.capi import ADDRESSES, CLAIMS, CLUSTERS, MACHINES
from ipam_provider.endpoint import ANNOTATION_POOL_NAME, CLAIM_SUFFIX
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tests.support.cluster import wait_for
from tests.support.netbox import NetBoxServer
from tests.support.netbox_backend import NB_POOLS, create_secret, netbox_pool, owned_addresses, prefix, record_gateway
from tests.support.objects import (
    GLOBAL_POOLS,
    POOLS,
    claim,
    global_pool,
    pool,
    ready_condition,
    wait_address,
    wait_claim_reason,
)
from tests.support.providers import Harness
from tools.controller_command import controller_command
from tools.controlplane.assets import binaries_dir
from tools.controlplane.crds import install_crds

Object = dict[str, Any]
INFRA = "infrastructure.cluster.x-k8s.io"
VSPHERE_CLUSTERS = Resource(INFRA, "v1beta2", "vsphereclusters", "VSphereCluster", namespaced=True)
VSPHERE_MACHINES = Resource(INFRA, "v1beta2", "vspheremachines", "VSphereMachine", namespaced=True)
VSPHERE_VMS = Resource(INFRA, "v1beta2", "vspherevms", "VSphereVM", namespaced=True)
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"
TEMPLATE = "DC0_H0_VM0"  # a VM of vcsim's default vCenter model, on its standalone host DC0_H0
PLACEMENT = {
    "datacenter": "DC0",
    "datastore": "LocalDS_0",
    "folder": "/DC0/vm",
    "resourcePool": "/DC0/host/DC0_H0/Resources",
}


@pytest.fixture(scope="module")
def capv(provider_harness: Callable[[str], Harness]) -> Harness:
    return provider_harness("capv")


@contextlib.asynccontextmanager
async def running(*command: str, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A process for the block's duration, stopped with SIGTERM (then killed) afterwards; output goes to `log`."""
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(*command, stdout=sink, stderr=subprocess.STDOUT, env=os.environ)
        try:
            yield process
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), 20)
                except TimeoutError:
                    process.kill()
                    await process.wait()


@contextlib.asynccontextmanager
async def vcsim_and_capv(capv: Harness, kubeconfig: Path, namespace: str, tmp_path: Path) -> AsyncIterator[Object]:
    """vcsim and CAPV's VSphereVM controller on `namespace`; yields vcsim's login (the harness's state file)."""
    state = tmp_path / "vcsim.json"
    command = [str(capv.binary), "serve", f"--kubeconfig={kubeconfig}", f"--namespace={namespace}", f"--state={state}"]
    async with running(*command, log=tmp_path / "capv.log") as process:

        async def started() -> Object | None:
            if process.returncode is not None:
                pytest.fail(f"the CAPV harness exited {process.returncode}: {(tmp_path / 'capv.log').read_text()}")
            return {**json.loads(state.read_text()), "file": str(state)} if state.exists() else None

        yield await wait_for(started, timeout=60, message="vcsim to serve")


@contextlib.asynccontextmanager
async def garbage_collector(kubeconfig: Path, tmp_path: Path) -> AsyncIterator[None]:
    """kube-controller-manager with its garbage collector alone: CAPV leaves a deleted VM's claims to it (it drops
    its finalizer and lets the owner reference delete them), as every CAPI provider leaves owned objects."""
    binary = binaries_dir() / "kube-controller-manager"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: hack/control-plane/build-binaries.sh builds it", pytrace=False)
    flags = ["--controllers=garbagecollector", "--leader-elect=false", "--secure-port=0"]
    async with running(str(binary), f"--kubeconfig={kubeconfig}", *flags, log=tmp_path / "kcm.log"):
        yield


async def inspect(capv: Harness, login: Object, vm: str) -> Object:
    """What vcsim holds for the VM `vm`: found, powerState and the metadata CAPV wrote (parsed)."""
    process = await asyncio.create_subprocess_exec(
        str(capv.binary), "inspect", f"--state={login['file']}", f"--vm={vm}", stdout=subprocess.PIPE
    )
    out, _ = await process.communicate()
    assert process.returncode == 0, f"capv-harness inspect {vm} failed"
    report: Object = json.loads(out)
    report["metadata"] = yaml.safe_load(report.get("metadata") or "null")
    return report


def owner(obj: Object) -> Object:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"]}  # fmt: skip


async def create_vm(
    kube: KubeClient, namespace: str, cluster: str, name: str, server: str, devices: list[Object]
) -> None:
    """A Machine, its VSphereMachine and the VSphereVM CAPV reconciles, owned in that chain as CAPI's controllers
    would leave them; the VSphereVM is a full clone of vcsim's template with `devices`."""
    labels = {CLUSTER_LABEL: cluster}
    machine = await kube.create(MACHINES, {
        "apiVersion": MACHINES.api_version, "kind": "Machine", "metadata": {"name": name, "labels": labels},
        "spec": {"clusterName": cluster, "bootstrap": {"dataSecretName": "none"},
                 "infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereMachine", "name": name}},
    }, namespace)  # fmt: skip
    network = {"devices": devices}
    spec = {"server": server, "template": TEMPLATE, "cloneMode": "fullClone", "network": network, **PLACEMENT}
    vsphere_machine = await kube.create(VSPHERE_MACHINES, {
        "apiVersion": VSPHERE_MACHINES.api_version, "kind": "VSphereMachine",
        "metadata": {"name": name, "labels": labels, "ownerReferences": [owner(machine)]}, "spec": spec,
    }, namespace)  # fmt: skip
    await kube.create(VSPHERE_VMS, {
        "apiVersion": VSPHERE_VMS.api_version, "kind": "VSphereVM",
        "metadata": {"name": name, "labels": labels, "ownerReferences": [owner(vsphere_machine)]}, "spec": spec,
    }, namespace)  # fmt: skip


async def create_cluster(kube: KubeClient, namespace: str, name: str, server: str) -> None:
    await kube.create(VSPHERE_CLUSTERS, {
        "apiVersion": VSPHERE_CLUSTERS.api_version, "kind": "VSphereCluster", "metadata": {"name": name},
        "spec": {"server": server},
    }, namespace)  # fmt: skip
    await kube.create(CLUSTERS, {
        "apiVersion": CLUSTERS.api_version, "kind": "Cluster", "metadata": {"name": name},
        "spec": {"infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereCluster", "name": name}},
    }, namespace)  # fmt: skip


def from_pools(network: str, *pools: tuple[str, str]) -> Object:
    return {"networkName": network, "addressesFromPools": [{"apiGroup": POOLS.group, "kind": kind, "name": name}
                                                           for kind, name in pools]}  # fmt: skip


async def bound_addresses(kube: KubeClient, namespace: str, vm: str, count: int) -> list[Object]:
    """The IPAddresses of the VM's claims (CAPV names them <vm>-<device>-<pool>), once all `count` are bound."""

    async def probe() -> list[Object] | None:
        claims, _ = await kube.list(CLAIMS, namespace)
        mine = sorted((c for c in claims if c["metadata"]["name"].startswith(f"{vm}-")),
                      key=lambda c: c["metadata"]["name"])  # fmt: skip
        names: list[str] = [((c.get("status") or {}).get("addressRef") or {}).get("name") or "" for c in mine]
        if len(mine) != count or not all(names):
            return None
        addresses = [await kube.get(ADDRESSES, name, namespace) for name in names]
        return [a for a in addresses if a is not None] if all(addresses) else None

    return await wait_for(probe, timeout=90, message=f"the {count} claims of {vm} to be bound")


async def provisioned(capv: Harness, login: Object, vm: str) -> Object:
    """vcsim's view of the VM once CAPV has written its metadata and powered it on."""

    async def probe() -> Object | None:
        report = await inspect(capv, login, vm)
        return report if report["found"] and report["metadata"] and report["powerState"] == "poweredOn" else None

    return await wait_for(probe, timeout=120, interval=1.0, message=f"{vm} cloned, customized and powered on in vcsim")


def received(report: Object) -> list[tuple[list[str], str | None, str | None]]:
    """Per device of the clone's cloud-init network configuration: its addresses, IPv4 and IPv6 gateways."""
    ethernets = report["metadata"]["network"]["ethernets"]
    return [(sorted(e.get("addresses") or []), e.get("gateway4"), e.get("gateway6"))
            for _, e in sorted(ethernets.items())]  # fmt: skip


def expected(addresses: list[list[Object]]) -> list[tuple[list[str], str | None, str | None]]:
    """The same, as our IPAddresses say it, grouped by device."""
    rows = []
    for device in addresses:
        specs = [a["spec"] for a in device]
        rows.append((
            sorted(f"{s['address']}/{s['prefix']}" for s in specs),
            next((s.get("gateway") for s in specs if ":" not in s["address"]), None),
            next((s.get("gateway") for s in specs if ":" in s["address"]), None),
        ))  # fmt: skip
    return rows


async def wait_vm_condition(kube: KubeClient, namespace: str, vm: str, kind: str, text: str) -> Object:
    """The VSphereVM's condition `kind` once it is False and `text` is in its reason or message."""
    seen: list[Object] = []

    async def probe() -> Object | None:
        obj = await kube.get(VSPHERE_VMS, vm, namespace)
        seen[:] = ((obj or {}).get("status") or {}).get("conditions") or []
        return next(
            (
                c
                for c in seen
                if c["type"] == kind and c["status"] == "False" and text in c["reason"] + c.get("message", "")
            ),
            None,
        )

    return await wait_for(
        probe, timeout=60, message=lambda: f"VSphereVM {vm}: {kind} False with {text}; conditions {seen}"
    )


async def create_pools(kube: KubeClient, namespace: str, netbox: NetBoxServer, global_name: str) -> None:
    """One address in an InClusterIPPool (so that a second VM finds it exhausted), IPv6 from a GlobalInClusterIPPool,
    IPv4 from a NetboxIPPool over a real NetBox prefix."""
    await kube.create(POOLS, pool("ic", ["10.50.0.10"], 24, gateway="10.50.0.1"), namespace)
    await kube.create(GLOBAL_POOLS, global_pool(global_name, ["fd00:50::10-fd00:50::1f"], 64, gateway="fd00:50::1"))
    netbox.create_prefix("10.61.0.0/24")
    record_gateway(netbox, "10.61.0.1/24")
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("nb", [prefix("10.61.0.0/24")], gateway="10.61.0.1"), namespace)


async def test_capv_clones_vms_with_our_addresses_and_waits_while_a_pool_is_exhausted(
    kube: KubeClient, kubeconfig: Path, namespace: str, netbox: NetBoxServer, capv: Harness, tmp_path: Path
) -> None:
    await install_crds(kube, sorted((capv.module_dir / "config/default/crd/bases").glob("*.yaml")))
    global_name = f"capv-{uuid.uuid4().hex[:8]}"
    await create_pools(kube, namespace, netbox, global_name)
    controller = [
        *controller_command(kubeconfig, namespace),
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
    ]
    try:
        async with (
            running(*controller, log=tmp_path / "controller.log"),
            garbage_collector(kubeconfig, tmp_path),
            vcsim_and_capv(capv, kubeconfig, namespace, tmp_path) as login,
        ):
            await create_cluster(kube, namespace, "c1", login["server"])
            dual_stack = from_pools("VM Network", ("InClusterIPPool", "ic"), ("GlobalInClusterIPPool", global_name))
            await create_vm(
                kube,
                namespace,
                "c1",
                "vm1",
                login["server"],
                [dual_stack, from_pools("VM Network", ("NetboxIPPool", "nb"))],
            )
            first = await bound_addresses(kube, namespace, "vm1", 3)
            assert received(await provisioned(capv, login, "vm1")) == expected([first[:2], first[2:]])
            netbox_address = first[2]["spec"]["address"]
            assert [str(r.address) for r in owned_addresses(netbox)] == [f"{netbox_address}/24"]

            # The pool's one address is vm1's: CAPV sees our claim's PoolExhausted and waits.
            await create_vm(
                kube, namespace, "c1", "vm2", login["server"], [from_pools("VM Network", ("InClusterIPPool", "ic"))]
            )
            exhausted = await wait_claim_reason(kube, namespace, "vm2-0-0", "PoolExhausted")
            message = ready_condition(exhausted)["message"]  # type: ignore[index]
            await wait_vm_condition(kube, namespace, "vm2", "IPAddressClaimsFulfilled", message)
            assert (await inspect(capv, login, "vm2"))["powerState"] != "poweredOn"

            # Deleting vm1 releases every address, in the pools and in NetBox; vm2 then gets the freed one.
            await kube.delete(VSPHERE_VMS, "vm1", namespace)
            second = await bound_addresses(kube, namespace, "vm2", 1)
            assert received(await provisioned(capv, login, "vm2")) == expected([second])
            assert second[0]["spec"]["address"] == "10.50.0.10"

            async def released() -> bool:
                names = {a["metadata"]["name"] for a in (await kube.list(ADDRESSES, namespace))[0]}
                return not names & {"vm1-0-0", "vm1-0-1", "vm1-1-0"} and not owned_addresses(netbox)

            await wait_for(released, timeout=60, message="vm1's IPAddresses and NetBox record released")
            assert not (await inspect(capv, login, "vm1"))["found"]
    finally:
        await kube.delete(GLOBAL_POOLS, global_name)


async def endpoint_of(kube: KubeClient, namespace: str, cluster: str) -> Object:
    """The Cluster's spec.controlPlaneEndpoint, once our controller has written it from its pool."""

    async def probe() -> Object | None:
        found = await kube.get(CLUSTERS, cluster, namespace)
        endpoint: Object | None = ((found or {}).get("spec") or {}).get("controlPlaneEndpoint")
        return endpoint

    return await wait_for(probe, timeout=60, message=f"Cluster {cluster}'s controlPlaneEndpoint from its pool")


async def provisioned_cluster(kube: KubeClient, namespace: str, name: str) -> Object:
    """The VSphereCluster once CAPV's VSphereCluster controller has it provisioned, Ready and VCenterAvailable."""
    seen: list[Object] = []

    async def probe() -> Object | None:
        obj = await kube.get(VSPHERE_CLUSTERS, name, namespace)
        status = (obj or {}).get("status") or {}
        seen[:] = status.get("conditions") or []
        true = {c["type"] for c in seen if c["status"] == "True"}
        done = (status.get("initialization") or {}).get("provisioned") and {"Ready", "VCenterAvailable"} <= true
        return obj if done else None

    return await wait_for(probe, timeout=60, message=lambda: f"VSphereCluster {name} provisioned; conditions {seen}")


async def free_in(kube: KubeClient, namespace: str, name: str) -> int | None:
    found = await kube.get(POOLS, name, namespace)
    free = ((found or {}).get("status") or {}).get("ipAddresses", {}).get("free")
    return int(free) if free is not None else None


async def gone(found: Awaitable[Object | None]) -> bool:
    return await found is None


async def released(kube: KubeClient, namespace: str, cluster: str, pool_name: str, free: int) -> None:
    """Wait until the Cluster's endpoint claim, its IPAddress and its VSphereCluster are gone and `pool_name`
    counts `free` free addresses."""
    left: list[object] = []

    async def probe() -> bool:
        left[:] = [
            await kube.get(CLAIMS, f"{cluster}{CLAIM_SUFFIX}", namespace),
            await kube.get(ADDRESSES, f"{cluster}{CLAIM_SUFFIX}", namespace),
            await kube.get(VSPHERE_CLUSTERS, cluster, namespace),
            await free_in(kube, namespace, pool_name),
        ]
        return left == [None, None, None, free]

    await wait_for(probe, timeout=60, message=lambda: f"claim, IPAddress, VSphereCluster gone, {free} free: {left}")


async def test_capv_accepts_the_control_plane_endpoint_we_allocate_and_machines_never_get_it(
    kube: KubeClient, kubeconfig: Path, namespace: str, capv: Harness, tmp_path: Path
) -> None:
    await install_crds(kube, sorted((capv.module_dir / "config/default/crd/bases").glob("*.yaml")))
    await kube.create(POOLS, pool("vips", ["10.80.0.10-10.80.0.11"], 24), namespace)
    controller = [
        *controller_command(kubeconfig, namespace),
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
    ]
    async with (
        running(*controller, log=tmp_path / "controller.log"),
        garbage_collector(kubeconfig, tmp_path),
        vcsim_and_capv(capv, kubeconfig, namespace, tmp_path) as login,
    ):
        cluster = await kube.create(CLUSTERS, {
            "apiVersion": CLUSTERS.api_version, "kind": "Cluster",
            "metadata": {"name": "c2", "annotations": {ANNOTATION_POOL_NAME: "vips"}},
            "spec": {"infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereCluster", "name": "c2"}},
        }, namespace)  # fmt: skip
        endpoint = await endpoint_of(kube, namespace, "c2")
        assert endpoint == {"host": "10.80.0.10", "port": 6443}

        # The VSphereCluster as a ClusterClass patch would write it, owned by its Cluster as CAPI's controller does.
        await kube.create(VSPHERE_CLUSTERS, {
            "apiVersion": VSPHERE_CLUSTERS.api_version, "kind": "VSphereCluster",
            "metadata": {"name": "c2", "ownerReferences": [owner(cluster)]},
            "spec": {"server": login["server"], "controlPlaneEndpoint": endpoint},
        }, namespace)  # fmt: skip
        accepted = await provisioned_cluster(kube, namespace, "c2")
        assert accepted["spec"]["controlPlaneEndpoint"] == endpoint
        conditions = {c["type"]: c["status"] for c in accepted["status"]["conditions"]}
        assert conditions == {"Paused": "False", "Ready": "True", "VCenterAvailable": "True"}

        # The pool's other address is the only one a machine can get.
        await kube.create(CLAIMS, claim("machine", "vips"), namespace)
        assert (await wait_address(kube, namespace, "machine"))["spec"]["address"] == "10.80.0.11"

        # Deletion in CAPI's order: the VSphereCluster first (CAPV needs its Cluster to finish it), then the Cluster,
        # which gives the endpoint back.
        await kube.delete(VSPHERE_CLUSTERS, "c2", namespace)
        await wait_for(lambda: gone(kube.get(VSPHERE_CLUSTERS, "c2", namespace)), message="CAPV to delete c2")
        await kube.delete(CLUSTERS, "c2", namespace)
        await released(kube, namespace, "c2", "vips", 1)
