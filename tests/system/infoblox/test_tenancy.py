"""Tenants and InfobloxInstances on the real API server, with the controller and the WAPI simulator: a pool naming a
path as its instance is refused at admission, and even unvalidated it only fails on its own; an instance serves
only the namespaces its allowedNamespaces allows, and reads only Secrets of a namespace that lends them; turning TLS
off shows on the instance and its pools, with Warning Events."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
import pytest_asyncio

from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.spec import INFOBLOX_POOL, INSTANCES
from ipam_provider.api.capi import CLAIMS
from ipam_provider.backend.contract import BackendContext, ClaimContext, PoolNotReadyError, PoolRef
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import NAMESPACES
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.infoblox import (
    FAST,
    KIND,
    POOLS,
    Grid,
    fast_backend,
    wait_instance_reason,
    wait_pool_reason,
)
from tests.support.objects import claim, ready_condition, wait_address, wait_claim_reason, wait_event, wait_events

ATTACK = "../../v1beta2/namespaces/victim/ipaddressclaims/c"
Object = dict[str, Any]


@pytest_asyncio.fixture
async def make_namespace(kube: KubeClient) -> AsyncIterator[Callable[..., Any]]:
    """make(prefix, **labels) -> a new namespace's name; deleted at teardown."""
    made: list[str] = []

    async def make(prefix: str, **labels: str) -> str:
        name = f"{prefix}-{secrets.token_hex(3)}"
        await kube.create(NAMESPACES, {"metadata": {"name": name, "labels": labels}})
        made.append(name)
        return name

    yield make
    for name in made:
        await kube.delete(NAMESPACES, name)


def pool_body(name: str, instance: str, namespace: str) -> Object:
    return {
        "apiVersion": POOLS.api_version,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "uid": "never-stored", "generation": 1},
        "spec": {"instanceRef": {"name": instance}, "subnets": [{"cidr": "10.10.0.0/24"}]},
    }


async def test_a_pool_naming_another_namespaces_claim_as_its_instance_reaches_nothing(
    kube: KubeClient, make_namespace: Callable[..., Any]
) -> None:
    victim, attacker = await make_namespace("victim"), await make_namespace("attacker")
    target = claim("c", "elsewhere", kind="SomeoneElsesPool", group="example.com")
    stored = await kube.create(CLAIMS, target, victim)
    hostile = pool_body("p", ATTACK.replace("victim", victim), attacker)

    with pytest.raises(ApiError) as refused:
        await kube.create(POOLS, hostile, attacker)
    assert refused.value.status == 422 and "spec.instanceRef.name" in refused.value.message

    # The same pool, as if it had been stored without validation, served by the backend on the real API server.
    backend = InfobloxBackend(BackendContext(kube=kube), FAST)
    ref = PoolRef.from_object(hostile)
    report = await backend.report(ref, hostile, [])
    assert (report.ready, report.reason) == (False, "InvalidConfiguration"), report
    assert "spec.instanceRef.name" in report.message
    with pytest.raises(PoolNotReadyError, match=r"spec\.instanceRef\.name"):
        await backend.allocate(ref, hostile, ClaimContext(attacker, "mine", "uid-1"))
    await backend.close()
    after = await kube.get(CLAIMS, "c", victim)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"], "the victim's claim changed"
    assert "status" not in after or not after["status"].get("conditions")


async def test_an_instance_serves_only_the_namespaces_it_allows(
    kube: KubeClient,
    namespace: str,
    grid: Grid,
    controller_factory: ControllerFactory,
    make_namespace: Callable[..., Any],
) -> None:
    team = await make_namespace("team", team="b")
    body = {**pool_body("net", grid.instance, team), "metadata": {"name": "net"}}
    await kube.create(POOLS, body, team)
    await kube.create(CLAIMS, claim("node-0", "net", kind=KIND), team)
    run = controller_factory(namespaces=[namespace, team], extra_backends=[fast_backend], include_in_cluster=False)
    async with run:
        pool = await wait_pool_reason(kube, team, "net", "InstanceNotAllowed")
        message = ready_condition(pool)["message"]  # type: ignore[index]
        assert f"InfobloxInstance {grid.instance}" in message and "spec.allowedNamespaces" in message
        assert grid.secret not in message.replace(f"InfobloxInstance {grid.instance}", ""), "no Secret named"
        refused = await wait_claim_reason(kube, team, "node-0", "PoolNotReady")
        assert "InstanceNotAllowed" in str(refused["status"]) or "spec.allowedNamespaces" in str(refused["status"])
        assert not grid.sim.state.objects("fixedaddress"), "nothing allocated on the grid for the team"
        instance = await kube.get(INSTANCES, grid.instance)
        assert team not in str((instance or {}).get("status")), "the refusal is written on the team's pool only"

        # The instance's owner lets the team's namespace in by its labels.
        await grid.patch_instance(
            {"allowedNamespaces": {"list": [namespace], "selector": {"matchLabels": {"team": "b"}}}}
        )
        await wait_pool_reason(kube, team, "net", "PoolReady")
        assert (await wait_address(kube, team, "node-0"))["spec"]["address"] == "10.10.0.1"

        # And out again: new claims wait, and the pool says why at its next report (instances are not watched:
        # a change of the pool brings it forward).
        await grid.patch_instance({"allowedNamespaces": {"list": [namespace], "selector": None}})
        await asyncio.sleep(2 * FAST.instance_cache_seconds)  # the instance as read is trusted this long
        await kube.create(CLAIMS, claim("node-1", "net", kind=KIND), team)
        await wait_claim_reason(kube, team, "node-1", "PoolNotReady")
        await kube.patch(POOLS, "net", {"metadata": {"labels": {"touched": "yes"}}}, team)
        await wait_pool_reason(kube, team, "net", "InstanceNotAllowed")


async def test_an_instance_reads_secrets_only_of_a_namespace_that_lends_them(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        await wait_pool_reason(kube, namespace, "net", "PoolReady")
        await kube.patch(NAMESPACES, namespace, {"metadata": {"labels": {SECRET_REFS_LABEL: None}}})
        instance = await wait_instance_reason(kube, grid.instance, "SecretNotAllowed")
        message = ready_condition(instance)["message"]  # type: ignore[index]
        assert SECRET_REFS_LABEL in message and grid.sim.password not in message
        await grid.create_claim("node-0", "net")
        await wait_claim_reason(kube, namespace, "node-0", "PoolNotReady")
        await kube.patch(POOLS, "net", {"metadata": {"labels": {"touched": "yes"}}}, namespace)  # report it now
        await wait_pool_reason(kube, namespace, "net", "SecretNotAllowed")


async def test_turning_tls_off_warns_on_the_instance_and_its_pools(
    kube: KubeClient, namespace: str, grid_factory: Callable[..., Any], infoblox_controller: Any
) -> None:
    grid: Grid = await grid_factory(ca=None, insecureSkipVerify=True)
    grid.sim.state.add_network("10.10.0.0/24")
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller() as controller:
        pool = await wait_pool_reason(kube, namespace, "net", "PoolReady")
        (tls,) = [c for c in pool["status"]["conditions"] if c["type"] == "TLSVerified"]
        assert (tls["status"], tls["reason"]) == ("False", "InsecureSkipVerify")

        async def instance_tls() -> Object | None:
            instance = await kube.get(INSTANCES, grid.instance)
            found = [
                c for c in ((instance or {}).get("status") or {}).get("conditions") or [] if c["type"] == "TLSVerified"
            ]
            return found[0] if found else None

        condition = await wait_for(instance_tls, message="the instance's TLSVerified condition")
        assert (condition["status"], condition["reason"]) == ("False", "InsecureSkipVerify")
        await wait_event(kube, namespace, controller, "InsecureSkipVerify")  # the pool's Warning Event
        found = controller.registry.lookup(INFOBLOX_POOL.group, INFOBLOX_POOL.kind)
        assert found is not None
        recorder = cast(InfobloxBackend, found[0]).recorder
        about = await wait_events(
            kube,
            "default",
            recorder,
            lambda e: bool(e["involvedObject"].get("name") == grid.instance),
            "the instance's Warning Event",
        )
        assert [(e["type"], e["reason"]) for e in about] == [("Warning", "InsecureSkipVerify")]
        assert grid.sim.password not in str(about)
