"""Several management clusters sharing one NetBox, against the real NetBox: every address made carries the
backend's management cluster identity (custom field capi_cluster_identity), a re-keyed claim's address gets the
identity of the cluster that re-keyed it, another cluster's addresses are never listed nor released, and an
address without identity (made before identities were stamped) is listed as never releasable; through the
controller, the repair loop reports it and never releases it, while it does release a leak of its own."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import pytest_asyncio

from backends.netbox import NetboxBackend
from backends.netbox.spec import (
    CLAIM_REF_FIELD,
    CLAIM_UID_FIELD,
    CLUSTER_IDENTITY_FIELD,
    OWNER_TAG,
)
from ipam_provider.backend.contract import (
    REQUESTED_ADDRESS_ANNOTATION,
    Allocation,
    BackendContext,
    ClaimContext,
    PoolRef,
)
from ipam_provider.backend.repair import Holding
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.cluster import wait_for
from tests.support.netbox_backend import (
    NB_POOLS,
    create_secret,
    fast_settings,
    marked,
    netbox_pool,
    new_claim,
    pool_of,
    prefix,
)

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

Object = dict[str, Any]
Backends = Callable[[str], NetboxBackend]


class NoWait:
    async def wait(self) -> None:
        return None


@pytest_asyncio.fixture
async def cluster(kube: KubeClient) -> AsyncIterator[Backends]:
    """cluster(identity) -> a NetboxBackend of the management cluster `identity`; closed at teardown."""
    made: list[NetboxBackend] = []

    def make(identity: str) -> NetboxBackend:
        backend = NetboxBackend(BackendContext(kube=kube, cluster_identity=identity), fast_settings())
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.close()


def identity_of(netbox: NetBoxServer, uid: str) -> Any:
    (record,) = marked(netbox, uid)
    return (record.custom_fields or {}).get(CLUSTER_IDENTITY_FIELD)


def unstamped(netbox: NetBoxServer, address: str, uid: str, ref: str) -> Any:
    """An address with both ownership marks and no identity, as this provider made them before identities."""
    tag = netbox.api().extras.tags.get(slug=OWNER_TAG)
    custom = {CLAIM_UID_FIELD: uid, CLAIM_REF_FIELD: ref}
    return netbox.api().ipam.ip_addresses.create(address=address, tags=[tag.id], custom_fields=custom)


async def test_new_addresses_carry_our_identity(
    cluster: Backends, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.171.0.0/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "net", [prefix("10.171.0.0/24")])
    ref = PoolRef.from_object(pool)
    backend = cluster("cluster-a")
    plain = new_claim(namespace, "plain")
    asked = ClaimContext(
        namespace, "asked", str(uuid.uuid4()), annotations={REQUESTED_ADDRESS_ANNOTATION: "10.171.0.9"}
    )
    await backend.allocate(ref, pool, plain)
    assert (await backend.allocate(ref, pool, asked)).address == "10.171.0.9"
    assert identity_of(netbox, plain.uid) == "cluster-a"
    assert identity_of(netbox, asked.uid) == "cluster-a"
    field = netbox.api().extras.custom_fields.get(name=CLUSTER_IDENTITY_FIELD)
    assert field is not None and field.type.value == "text", "the field is created like the other two"


async def test_a_re_keyed_claim_gets_our_identity(
    cluster: Backends, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.172.0.0/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "net", [prefix("10.172.0.0/24")])
    ref = PoolRef.from_object(pool)
    before, after = cluster("cluster-old"), cluster("cluster-new")
    moved = new_claim(namespace, "moved")
    allocation = await before.allocate(ref, pool, moved)
    assert identity_of(netbox, moved.uid) == "cluster-old"
    # `clusterctl move`: the IPAddress (with its annotations) arrives in the new cluster; its claim has a new uid.
    renewed = dataclasses.replace(moved, uid=str(uuid.uuid4()))
    adopted = await after.allocate(ref, pool, renewed, allocation)
    assert adopted.address == allocation.address
    assert identity_of(netbox, renewed.uid) == "cluster-new"
    # The repair loop's restore path re-keys too, and stamps again.
    again = dataclasses.replace(renewed, uid=str(uuid.uuid4()))
    bare = Allocation(allocation.address, allocation.prefix)
    restored = await before.restore(ref, pool, again, bare)
    assert "re-keyed" in restored.detail, restored
    assert identity_of(netbox, again.uid) == "cluster-old"


async def test_another_clusters_addresses_are_not_listed_and_the_unstamped_never_released(
    cluster: Backends, kube: KubeClient, namespace: str, netbox: NetBoxServer
) -> None:
    netbox.create_prefix("10.173.0.0/24")
    await create_secret(kube, namespace, netbox)
    pool = pool_of(namespace, "net", [prefix("10.173.0.0/24")])
    ref = PoolRef.from_object(pool)
    ours, theirs = cluster("cluster-a"), cluster("cluster-b")
    # The same namespace, pool name and claim name in both clusters: only the identity tells them apart.
    mine, other = new_claim(namespace, "m1"), new_claim(namespace, "m1")
    await ours.allocate(ref, pool, mine)
    await theirs.allocate(ref, pool, other)
    old_uid = str(uuid.uuid4())
    old = unstamped(netbox, "10.173.0.80/24", old_uid, f"{namespace}/old")

    seen = {h.claim_uid: h for h in await ours.list_holdings(ref, pool, NoWait())}
    assert set(seen) == {mine.uid, old_uid}, "cluster B's address is not listed by cluster A"
    assert seen[mine.uid].releasable and not seen[old_uid].releasable
    assert CLUSTER_IDENTITY_FIELD in seen[old_uid].why_kept
    assert {h.claim_uid for h in await theirs.list_holdings(ref, pool, NoWait())} == {other.uid, old_uid}

    assert await ours.release_holding(ref, pool, seen[old_uid]) is False, "an unstamped address is never released"
    assert netbox.api().ipam.ip_addresses.get(old.id) is not None
    (b_record,) = marked(netbox, other.uid)
    forged = Holding(str(b_record.address).split("/")[0], f"{namespace}/m1", other.uid, str(b_record.id))
    assert await ours.release_holding(ref, pool, forged) is False, "never another cluster's, even if asked"
    assert len(marked(netbox, other.uid)) == 1


async def test_the_loop_reports_an_unstamped_leak_and_never_releases_it(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    netbox.create_prefix("10.174.0.0/24")
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("net", [prefix("10.174.0.0/24")]), namespace)
    old_uid, own_uid = str(uuid.uuid4()), str(uuid.uuid4())
    old = unstamped(netbox, "10.174.0.80/24", old_uid, f"{namespace}/old")
    tag = netbox.api().extras.tags.get(slug=OWNER_TAG)
    own = {CLAIM_UID_FIELD: own_uid, CLAIM_REF_FIELD: f"{namespace}/ghost", CLUSTER_IDENTITY_FIELD: "cluster-a"}
    ghost = netbox.api().ipam.ip_addresses.create(address="10.174.0.81/24", tags=[tag.id], custom_fields=own)
    repair = RepairSettings(interval=0.5, grace_period=1.0)
    async with netbox_controller(repair=repair, cluster_identity="cluster-a") as controller:

        async def ghost_released() -> int | None:
            gone = netbox.api().ipam.ip_addresses.get(ghost.id) is None
            return controller.repair.passes if gone else None

        released_at = await wait_for(ghost_released, timeout=60, message="the loop to release its own leak")

        async def more_passes() -> bool:
            return bool(controller.repair.passes >= released_at + 4)

        await wait_for(more_passes, timeout=60, message="four more repair passes")
        assert netbox.api().ipam.ip_addresses.get(old.id) is not None, "the unstamped leak is never released"
        await controller.context.recorder.flush()
        events, _ = await kube.list(EVENTS, namespace)
        [suspected] = [e for e in events if e["reason"] == "RepairSuspectedLeak" and "10.174.0.80" in e["message"]]
        assert "never released by the repair loop" in suspected["message"], suspected["message"]
        assert not [e for e in events if e["reason"] == "RepairReleasedLeak" and "10.174.0.80" in e["message"]]
