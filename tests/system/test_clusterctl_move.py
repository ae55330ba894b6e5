"""`clusterctl move` for real, between two local control planes, with our controller running against each.

Both planes look as `clusterctl init --ipam py` leaves them (Cluster API's CRDs labelled as clusterctl labels them,
ours, clusterctl's provider inventory with cluster-api and `py`; `init_management_cluster`). The source holds a
Cluster (provisioned, as clusterctl requires), a pool of the backend's kind (with its Secret or InfobloxInstance),
a dozen fulfilled claims owned by the Cluster and naming it, and their IPAddresses; the Cluster takes its
control-plane endpoint from the pool (docs/control-plane-endpoints.md), held by one more claim. The real clusterctl
(built from the pinned Cluster API module) moves the namespace; then, per backend:

- at the target: the pool arrived, every claim is Ready again with the same IPAddress spec (the target's controller
  adopts the IPAddresses and the backend's record of each address is taken over for the claim's new UID), the
  Cluster keeps its endpoint, and new claims there never get an address a moved claim holds;
- at the source: every object of the namespace is gone, and nothing was released in NetBox or on the grid (each
  moved address is still there, with our marks);
- afterwards, deleting a claim at the target releases its address in the backend.

The count of objects clusterctl created at the target and deleted at the source, and the addresses checked, are
printed per backend (`pytest -s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from backends.incluster.naming import RESERVATIONS
from backends.infoblox.spec import INFOBLOX_POOL, INSTANCES
from ipam_provider.api.capi import ADDRESSES, CLAIMS, CLUSTERS
from ipam_provider.backend.contract import BackendContext
from ipam_provider.backend.protocol import Backend
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from ipam_provider.endpoint import ANNOTATION_POOL_KIND, ANNOTATION_POOL_NAME, claim_name
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS, Resource
from tests.support.cluster import dedicated_control_plane, wait_for
from tests.support.clusterctl import IPAM_NAMESPACE, Clusterctl, init_management_cluster
from tests.support.controller import run_controller
from tests.support.infoblox import b64
from tests.support.infoblox import fast_backend as infoblox_backend
from tests.support.netbox_backend import NB_POOLS, backend_factory, claim_uid_of, netbox_pool, owned_addresses, prefix
from tests.support.objects import POOLS as INCLUSTER_POOLS
from tests.support.objects import claim, pool, ready_condition
from tools.controlplane.cluster import LocalControlPlane
from tools.wapi_simulator import WapiSimulator

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

Object = dict[str, Any]
CLAIM_COUNT = 12
NEW_CLAIMS = 4
CLUSTER_NAME = "workload"
ENDPOINT_CLAIM = claim_name(CLUSTER_NAME)
MOVE_LABEL = "clusterctl.cluster.x-k8s.io/move"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
INFOBLOX_POOLS = pool_resource(INFOBLOX_POOL)
EA_CLAIM_UID = "CAPI-Claim-UID"


@dataclass(frozen=True)
class Planes:
    source: Path
    target: Path


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def planes() -> AsyncIterator[Planes]:
    """Two management clusters, each as `clusterctl init --ipam py` leaves it; shared by this module's tests,
    which each move a namespace of their own."""
    with contextlib.ExitStack() as stack:
        started: list[LocalControlPlane] = [stack.enter_context(dedicated_control_plane()) for _ in range(2)]
        for plane in started:
            kube = await KubeClient.from_kubeconfig(str(plane.kubeconfig_path))
            try:
                await init_management_cluster(kube)
            finally:
                await kube.close()
        yield Planes(started[0].kubeconfig_path, started[1].kubeconfig_path)


# --- the objects ---------------------------------------------------------------------------------------------


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def provisioned_cluster(kube: KubeClient, namespace: str, pool_kind: str) -> Object:
    """A v1beta2 Cluster that clusterctl accepts to move: a spec with a property besides `paused` (minProperties
    1 after the un-pause), infrastructure provisioned and the ControlPlaneInitialized condition True; its
    control-plane endpoint from the pool `net` of `pool_kind`."""
    annotations = {ANNOTATION_POOL_NAME: "net", ANNOTATION_POOL_KIND: pool_kind}
    body = {
        "apiVersion": CLUSTERS.api_version,
        "kind": CLUSTERS.kind,
        "metadata": {"name": CLUSTER_NAME, "annotations": annotations},
        "spec": {"paused": False, "clusterNetwork": {"serviceDomain": "cluster.local"}},
    }
    created = await kube.create(CLUSTERS, body, namespace)
    condition = {
        "type": "ControlPlaneInitialized",
        "status": "True",
        "reason": "Initialized",
        "message": "",
        "lastTransitionTime": now(),
    }
    status = {"initialization": {"infrastructureProvisioned": True}, "conditions": [condition]}
    await kube.patch(CLUSTERS, CLUSTER_NAME, {"status": status}, namespace, subresource="status")
    return created


def owned_claim(name: str, pool_name: str, kind: str, cluster: Object) -> Object:
    """A claim as an infrastructure machine makes it: naming its Cluster, in the Cluster's owner chain."""
    body = claim(name, pool_name, kind=kind, cluster=CLUSTER_NAME, labels={CLUSTER_NAME_LABEL: CLUSTER_NAME})
    body["metadata"]["ownerReferences"] = [
        {
            "apiVersion": CLUSTERS.api_version,
            "kind": CLUSTERS.kind,
            "name": CLUSTER_NAME,
            "uid": cluster["metadata"]["uid"],
        }
    ]
    return body


async def wait_ready(kube: KubeClient, namespace: str, names: Sequence[str], timeout: float = 120) -> dict[str, Object]:
    """Wait until every claim is Ready=True/AddressAllocated with its IPAddress; answer the IPAddresses by name."""
    found: dict[str, Object] = {}

    async def probe() -> bool:
        claims, _ = await kube.list(CLAIMS, namespace)
        ready = {
            c["metadata"]["name"]
            for c in claims
            if (ready_condition(c) or {}).get("reason") == "AddressAllocated"
            and (ready_condition(c) or {}).get("status") == "True"
        }
        addresses, _ = await kube.list(ADDRESSES, namespace)
        found.clear()
        found.update({a["metadata"]["name"]: a for a in addresses})
        return all(name in ready and name in found for name in names)

    async def describe() -> str:
        claims, _ = await kube.list(CLAIMS, namespace)
        return "; ".join(f"{c['metadata']['name']}: {ready_condition(c)}" for c in claims)

    state: dict[str, str] = {}

    async def probe_and_note() -> bool:
        done = await probe()
        if not done:
            state["last"] = await describe()
        return done

    await wait_for(
        probe_and_note,
        timeout=timeout,
        interval=0.5,
        message=lambda: f"claims {list(names)} in {namespace} to be Ready ({state.get('last')})",
    )
    return {name: found[name] for name in names}


async def namespace_objects(kube: KubeClient, namespace: str, resources: Sequence[Resource]) -> dict[str, list[str]]:
    """The names of the objects of `resources` in `namespace`, by kind (kinds with none left out)."""
    result: dict[str, list[str]] = {}
    for resource in resources:
        items, _ = await kube.list(resource, namespace)
        if items:
            result[resource.kind] = sorted(i["metadata"]["name"] for i in items)
    return result


def logged(output: str, verb: str) -> list[tuple[str, str]]:
    """(kind, name) of each object clusterctl -v 1 logs as `<verb> <Kind>="<name>" Namespace=...`."""
    return re.findall(rf'^{verb} (\w+)="([^"]+)"', output, re.MULTILINE)


# --- one move ------------------------------------------------------------------------------------------------


@dataclass
class Backend_:
    """What differs per backend: the pool, what must exist before the move, and the backend's view of an
    address (`held`: address → the claim UID the backend records for it; None where it keeps no such mark)."""

    name: str
    pool_resource: Resource
    pool_kind: str
    factories: Sequence[Callable[[BackendContext], Backend]]
    include_in_cluster: bool
    create_pool: Callable[[KubeClient, KubeClient, str], Awaitable[None]]
    held: Callable[[KubeClient, list[str]], Awaitable[dict[str, str | None]]]
    extra_source_kinds: Sequence[Resource] = ()


@dataclass
class Outcome:
    created: list[tuple[str, str]] = field(default_factory=list)
    deleted: list[tuple[str, str]] = field(default_factory=list)
    moved: dict[str, Object] = field(default_factory=dict)  # the source IPAddresses, by claim name
    after: dict[str, Object] = field(default_factory=dict)  # the target IPAddresses, by claim name
    target_uids: dict[str, str] = field(default_factory=dict)  # claim name → its UID at the target
    new_addresses: list[str] = field(default_factory=list)


async def move_and_check(planes: Planes, clusterctl: Clusterctl, spec: Backend_) -> Outcome:
    namespace = f"move-{spec.name}-{secrets.token_hex(3)}"
    names = [f"m{i:02d}" for i in range(CLAIM_COUNT)]
    outcome = Outcome()
    source = await KubeClient.from_kubeconfig(str(planes.source))
    target = await KubeClient.from_kubeconfig(str(planes.target))
    kinds = [CLUSTERS, spec.pool_resource, CLAIMS, ADDRESSES, *spec.extra_source_kinds]
    try:
        await source.create(NAMESPACES, {"metadata": {"name": namespace}})
        cluster = await provisioned_cluster(source, namespace, spec.pool_kind)
        await spec.create_pool(source, target, namespace)
        for name in names:
            await source.create(CLAIMS, owned_claim(name, "net", spec.pool_kind, cluster), namespace)

        run: dict[str, Any] = {
            "namespaces": [namespace],
            "extra_backends": spec.factories,
            "include_in_cluster": spec.include_in_cluster,
        }
        async with run_controller(planes.source, **run), run_controller(planes.target, **run):
            outcome.moved = await wait_ready(source, namespace, [*names, ENDPOINT_CLAIM])
            endpoint = await wait_endpoint(source, namespace)
            assert endpoint["host"] == outcome.moved.pop(ENDPOINT_CLAIM)["spec"]["address"]
            moved_addresses = [outcome.moved[n]["spec"]["address"] for n in names] + [endpoint["host"]]
            assert len(set(moved_addresses)) == CLAIM_COUNT + 1, moved_addresses
            held_before = await spec.held(source, moved_addresses)
            assert set(held_before) == set(moved_addresses), f"the backend does not hold every address: {held_before}"

            started = time.monotonic()
            result = clusterctl.run(
                "move",
                "--kubeconfig",
                str(planes.source),
                "--to-kubeconfig",
                str(planes.target),
                "-n",
                namespace,
                "-v",
                "1",
                timeout=300,
            )
            output = result.stdout + result.stderr
            assert result.returncode == 0, f"clusterctl move failed ({result.returncode}):\n{output}"
            print(f"\n[{spec.name}] clusterctl move took {time.monotonic() - started:.1f} s")
            outcome.created = logged(output, "Creating")
            outcome.deleted = logged(output, "Deleting")

            # The target: the pool and every claim arrived; each claim is Ready with the same IPAddress spec.
            assert await target.get(spec.pool_resource, "net", namespace) is not None, "the pool did not arrive"
            outcome.after = await wait_ready(target, namespace, [*names, ENDPOINT_CLAIM])
            assert outcome.after.pop(ENDPOINT_CLAIM)["spec"]["address"] == endpoint["host"]
            for name in names:
                assert outcome.after[name]["spec"] == outcome.moved[name]["spec"], name
            assert await wait_endpoint(target, namespace) == endpoint, "the Cluster's endpoint changed in the move"
            target_claims, _ = await target.list(CLAIMS, namespace)
            outcome.target_uids = {c["metadata"]["name"]: c["metadata"]["uid"] for c in target_claims}
            source_uids = {a["spec"]["claimRef"]["name"]: a for a in outcome.moved.values()}
            assert set(outcome.target_uids) == {*source_uids, ENDPOINT_CLAIM}

            # The source: every object of the namespace is gone.
            async def source_empty() -> bool:
                return not await namespace_objects(source, namespace, kinds)

            await wait_for(
                source_empty,
                timeout=60,
                message=lambda: f"the source namespace {namespace} to be empty",
            )

            # Nothing was released in the backend: each moved address is still held, for the claim at the target.
            held_after = await spec.held(target, moved_addresses)
            assert set(held_after) == set(moved_addresses), f"addresses released by the move: {held_after}"
            for name in names:
                recorded = held_after[outcome.moved[name]["spec"]["address"]]
                assert recorded is None or recorded == outcome.target_uids[name], (name, recorded)
            recorded = held_after[endpoint["host"]]
            assert recorded is None or recorded == outcome.target_uids[ENDPOINT_CLAIM], recorded

            # New claims at the target never get a moved claim's address.
            cluster_at_target = await target.get(CLUSTERS, CLUSTER_NAME, namespace)
            assert cluster_at_target is not None and not cluster_at_target["spec"].get("paused")
            fresh = [f"new{i}" for i in range(NEW_CLAIMS)]
            for name in fresh:
                await target.create(CLAIMS, owned_claim(name, "net", spec.pool_kind, cluster_at_target), namespace)
            new = await wait_ready(target, namespace, fresh)
            outcome.new_addresses = [new[n]["spec"]["address"] for n in fresh]
            assert not set(outcome.new_addresses) & set(moved_addresses), (outcome.new_addresses, moved_addresses)
            assert len(set(outcome.new_addresses)) == NEW_CLAIMS

            # Deleting a moved claim at the target releases its address in the backend.
            released = names[0]
            released_address = outcome.moved[released]["spec"]["address"]
            await target.delete(CLAIMS, released, namespace)

            async def gone() -> bool:
                claim_gone = await target.get(CLAIMS, released, namespace) is None
                return claim_gone and released_address not in await spec.held(target, [released_address])

            await wait_for(gone, timeout=60, message=f"claim {released} and {released_address} to be released")
            still = await spec.held(target, moved_addresses[1:])
            assert set(still) == set(moved_addresses[1:]), "deleting one claim released others"
    finally:
        await source.close()
        await target.close()
    print(
        f"[{spec.name}] objects created at the target: {len(outcome.created)} "
        f"({', '.join(sorted({k for k, _ in outcome.created}))}); deleted at the source: {len(outcome.deleted)}; "
        f"addresses checked: {CLAIM_COUNT} moved (same spec, still held in the backend) + {NEW_CLAIMS} new "
        f"(none of the moved) + 1 released"
    )
    return outcome


async def wait_endpoint(kube: KubeClient, namespace: str) -> Object:
    """Wait until the Cluster carries its control-plane endpoint; answer it."""

    async def probe() -> Object | None:
        found = await kube.get(CLUSTERS, CLUSTER_NAME, namespace)
        endpoint: Object | None = ((found or {}).get("spec") or {}).get("controlPlaneEndpoint")
        return endpoint

    return await wait_for(probe, timeout=60, message=f"Cluster {CLUSTER_NAME} to carry its control-plane endpoint")


def check_counts(outcome: Outcome, expected_kinds: dict[str, int]) -> None:
    """clusterctl created (and deleted) exactly the namespace's objects: per kind as expected (the claims and
    IPAddresses: one more each, the control-plane endpoint's)."""
    expected_kinds = {k: v + 1 if k in ("IPAddressClaim", "IPAddress") else v for k, v in expected_kinds.items()}
    counted: dict[str, int] = {}
    for kind, _ in outcome.created:
        counted[kind] = counted.get(kind, 0) + 1
    assert counted == expected_kinds, f"clusterctl created {counted}"
    deleted: dict[str, int] = {}
    for kind, _ in outcome.deleted:
        deleted[kind] = deleted.get(kind, 0) + 1
    expected_deleted = {k: v for k, v in expected_kinds.items() if k not in ("Namespace", "InfobloxInstance")}
    assert deleted == expected_deleted, f"clusterctl deleted {deleted}"


# --- in-cluster ------------------------------------------------------------------------------------------------


async def incluster_pool(source: KubeClient, target: KubeClient, namespace: str) -> None:
    await source.create(INCLUSTER_POOLS, pool("net", ["10.77.0.10-10.77.0.60"], 24, gateway="10.77.0.1"), namespace)


async def incluster_held(kube: KubeClient, addresses: list[str]) -> dict[str, str | None]:
    """The addresses a reservation holds (cluster-wide), with the claim UID it records."""
    items, _ = await kube.list(RESERVATIONS)
    held: dict[str, str | None] = {}
    for item in items:
        address = item["metadata"]["name"].split(".", 1)[1]
        if address in addresses:
            held[address] = ((item.get("spec") or {}).get("claim") or {}).get("uid")
    return held


@pytest.mark.apiserver
async def test_move_with_the_incluster_backend(planes: Planes, clusterctl: Clusterctl) -> None:
    spec = Backend_("incluster", INCLUSTER_POOLS, "InClusterIPPool", (), True, incluster_pool, incluster_held)
    outcome = await move_and_check(planes, clusterctl, spec)
    check_counts(
        outcome,
        {"Namespace": 1, "Cluster": 1, "InClusterIPPool": 1, "IPAddressClaim": CLAIM_COUNT, "IPAddress": CLAIM_COUNT},
    )


# --- NetBox ----------------------------------------------------------------------------------------------------

NETBOX_PREFIX = "10.88.0.0/26"


def netbox_backend(netbox: NetBoxServer) -> Backend_:
    async def create(source: KubeClient, target: KubeClient, namespace: str) -> None:
        netbox.create_prefix(NETBOX_PREFIX)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "netbox", "labels": {MOVE_LABEL: ""}},  # so that clusterctl moves it
            "stringData": {"url": netbox.url, "token": netbox.token},
        }
        await source.create(SECRETS, secret, namespace)
        await source.create(NB_POOLS, netbox_pool("net", [prefix(NETBOX_PREFIX)]), namespace)

    async def held(kube: KubeClient, addresses: list[str]) -> dict[str, str | None]:
        records = await asyncio.to_thread(owned_addresses, netbox)
        found = {str(r.address).split("/")[0]: claim_uid_of(r) for r in records}
        return {address: uid for address, uid in found.items() if address in addresses}

    return Backend_("netbox", NB_POOLS, NB_POOLS.kind, (backend_factory(),), False, create, held, (SECRETS,))


@pytest.mark.apiserver
async def test_move_with_the_netbox_backend(planes: Planes, clusterctl: Clusterctl, netbox: NetBoxServer) -> None:
    outcome = await move_and_check(planes, clusterctl, netbox_backend(netbox))
    check_counts(
        outcome,
        {
            "Namespace": 1,
            "Cluster": 1,
            "NetboxIPPool": 1,
            "Secret": 1,
            "IPAddressClaim": CLAIM_COUNT,
            "IPAddress": CLAIM_COUNT,
        },
    )


# --- Infoblox --------------------------------------------------------------------------------------------------

INFOBLOX_NETWORK = "10.99.0.0/24"


def infoblox_backend_spec(sim: WapiSimulator) -> Backend_:
    instance = f"grid-{secrets.token_hex(3)}"

    async def create(source: KubeClient, target: KubeClient, namespace: str) -> None:
        sim.state.add_network(INFOBLOX_NETWORK)
        # The instance's credentials are kept in the provider's namespace, which clusterctl never looks at: they
        # are created in both clusters before the move (docs/clusterctl.md).
        credentials = {
            "metadata": {"name": instance},
            "type": "kubernetes.io/basic-auth",
            "data": {"username": b64(sim.username), "password": b64(sim.password)},
        }
        lend = {"metadata": {"labels": {SECRET_REFS_LABEL: "true"}}}  # to the cluster-scoped instance
        for kube in (source, target):
            await kube.create(SECRETS, credentials, IPAM_NAMESPACE)
            await kube.patch(NAMESPACES, IPAM_NAMESPACE, lend)
        assert sim.ca_path is not None
        spec = {
            "host": sim.host,
            "port": sim.port,
            "wapiVersion": sim.wapi_version,
            "credentialsSecretRef": {"name": instance, "namespace": IPAM_NAMESPACE},
            "caBundle": sim.ca_path.read_text(),
            "allowedNamespaces": {"list": [namespace]},
        }
        body = {"apiVersion": INSTANCES.api_version, "kind": INSTANCES.kind, "metadata": {"name": instance}}
        await source.create(INSTANCES, {**body, "spec": spec})
        pool_body = {
            "apiVersion": INFOBLOX_POOLS.api_version,
            "kind": INFOBLOX_POOLS.kind,
            "metadata": {"name": "net"},
            "spec": {"instanceRef": {"name": instance}, "subnets": [{"cidr": INFOBLOX_NETWORK}]},
        }
        await source.create(INFOBLOX_POOLS, pool_body, namespace)

    async def held(kube: KubeClient, addresses: list[str]) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        for obj in sim.state.objects("fixedaddress"):
            uid = ((obj.get("extattrs") or {}).get(EA_CLAIM_UID) or {}).get("value")
            if obj["ipv4addr"] in addresses and uid:
                found[obj["ipv4addr"]] = uid
        return found

    return Backend_("infoblox", INFOBLOX_POOLS, INFOBLOX_POOLS.kind, (infoblox_backend,), False, create, held)


@pytest.mark.apiserver
async def test_move_with_the_infoblox_backend(
    planes: Planes, clusterctl: Clusterctl, wapi_simulator_factory: Callable[..., WapiSimulator]
) -> None:
    outcome = await move_and_check(planes, clusterctl, infoblox_backend_spec(wapi_simulator_factory()))
    check_counts(
        outcome,
        {
            "Namespace": 1,
            "Cluster": 1,
            "InfobloxInstance": 1,
            "InfobloxIPPool": 1,
            "IPAddressClaim": CLAIM_COUNT,
            "IPAddress": CLAIM_COUNT,
        },
    )
