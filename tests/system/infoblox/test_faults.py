"""The Infoblox backend when things go wrong: lost replies, dropped and timed-out requests, 503 bursts, bad
credentials, a wrong CA, an unreachable grid, missing views and networks, and 100 claims at once."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

import pytest

from backends.infoblox.spec import INSTANCES
from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.infoblox import Grid, b64, wait_gone, wait_instance_reason, wait_pool_reason
from tests.support.objects import events_text, ready_condition, wait_address, wait_claim_reason
from tools.wapi_simulator import make_tls_material

Object = dict[str, Any]


def claim_objects(grid: Grid) -> collections.Counter[str]:
    """Fixed addresses per CAPI-Claim-UID on the grid."""
    return collections.Counter(
        o["extattrs"]["CAPI-Claim-UID"]["value"]
        for o in grid.sim.state.objects("fixedaddress")
        if "CAPI-Claim-UID" in (o.get("extattrs") or {})
    )


async def test_a_lost_reply_is_found_by_the_claim_uid_no_duplicate_no_leak(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        await wait_pool_reason(kube, namespace, "net", "PoolReady")
        grid.sim.request_log.reset()
        grid.sim.faults.drop_reply_after_commit(1, methods="POST", object_types="fixedaddress")
        created = await grid.create_claim("lost", "net")
        address = await wait_address(kube, namespace, "lost")
        (obj,) = grid.objects_of(created["metadata"]["uid"])
        assert obj["ipv4addr"] == address["spec"]["address"]
        posts = [e for e in grid.sim.request_log.entries if e.method == "POST"]
        assert [e.fault for e in posts] == ["drop_after_commit"], "the committed object is found, not posted again"
        searches = [e for e in grid.sim.request_log.entries if e.method == "GET"]
        assert len(searches) == 1 and f"CAPI-Claim-UID={created['metadata']['uid']}" in searches[0].query
        await kube.delete(CLAIMS, "lost", namespace)
        await wait_gone(kube, namespace, "lost")
        assert not grid.sim.state.objects("fixedaddress"), "nothing leaks"


async def test_a_dropped_request_is_sent_again(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        await wait_pool_reason(kube, namespace, "net", "PoolReady")
        grid.sim.faults.drop_next(1, methods="POST", object_types="fixedaddress")
        created = await grid.create_claim("dropped", "net")
        address = await wait_address(kube, namespace, "dropped")
        (obj,) = grid.objects_of(created["metadata"]["uid"])
        assert obj["ipv4addr"] == address["spec"]["address"] == "10.10.0.1"
        assert grid.sim.request_log.count("POST", "fixedaddress") == 2


async def test_a_timed_out_request_committed_late_leaves_nothing_behind(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    await grid.patch_instance({"requestTimeoutSeconds": 1})
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        await wait_pool_reason(kube, namespace, "net", "PoolReady")
        # The grid takes 1.5 s over the first POST: the client gives up after 1 s, the grid commits anyway.
        grid.sim.faults.add_latency(1.5, count=1, methods="POST")
        created = await grid.create_claim("slow", "net")
        address = await wait_address(kube, namespace, "slow")
        uid = created["metadata"]["uid"]
        # The late object lands at 1.5 s; the provider looks again 2 s after its second POST and removes it.

        async def only_the_held_one() -> list[Object] | None:
            objects = grid.objects_of(uid)
            return objects if [o["ipv4addr"] for o in objects] == [address["spec"]["address"]] else None

        async def both_committed() -> bool:
            posts = [e for e in grid.sim.request_log.entries if e.method == "POST" and e.object_type == "fixedaddress"]
            return [e.status for e in posts] == [201, 201]

        await wait_for(both_committed, message="the late POST to be committed (else this test tests nothing)")
        await wait_for(only_the_held_one, timeout=15, message="the late object to be removed")
        assert grid.sim.request_log.count("DELETE", "fixedaddress") == 1
        others = [a for a in (await kube.list(ADDRESSES, namespace))[0] if a["metadata"]["name"] != "slow"]
        assert not others
        await kube.delete(CLAIMS, "slow", namespace)
        await wait_gone(kube, namespace, "slow")
        assert not grid.sim.state.objects("fixedaddress"), "release removes every object the claim owns"


async def test_503_bursts_are_retried_then_succeed(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller() as controller:
        await wait_pool_reason(kube, namespace, "net", "PoolReady")
        grid.sim.request_log.reset()
        grid.sim.faults.fail_next(3, methods="POST")
        created = await grid.create_claim("busy", "net")
        await wait_address(kube, namespace, "busy")
        statuses = [e.status for e in grid.sim.request_log.entries if e.method == "POST"]
        assert statuses == [503, 503, 503, 201]
        assert "AllocationFailed" not in await events_text(kube, namespace, controller), "retried within one allocation"
        assert len(grid.objects_of(created["metadata"]["uid"])) == 1
        # A burst on release too: the search and the DELETE are retried within the one release.
        grid.sim.request_log.reset()
        grid.sim.faults.fail_next(2, methods="GET")
        grid.sim.faults.fail_next(2, methods="DELETE")
        await kube.delete(CLAIMS, "busy", namespace)
        await wait_gone(kube, namespace, "busy")
        assert not grid.sim.state.objects("fixedaddress")
        by_method = collections.defaultdict(list)
        for entry in grid.sim.request_log.entries:
            by_method[(entry.method, entry.object_type)].append(entry.status)
        assert by_method == {("GET", "fixedaddress"): [503, 503, 200], ("DELETE", "fixedaddress"): [503, 503, 200]}


async def test_bad_credentials_give_conditions_never_the_password(
    kube: KubeClient,
    namespace: str,
    grid_factory: Any,
    infoblox_controller: Any,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)  # infoblox-client, requests and urllib3 at their most talkative
    grid: Grid = await grid_factory(password="Hunter2-not-the-password")
    correct = "Correct-Horse-Battery-9"  # distinctive, unlike the simulator's default, so a leak cannot hide
    grid.sim.auth.add_user(grid.sim.username, correct)
    grid.sim.state.add_network("10.10.0.0/24")
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller() as controller:
        await grid.create_claim("c", "net")
        instance = await wait_instance_reason(kube, grid.instance, "AuthenticationFailed")
        pool = await wait_pool_reason(kube, namespace, "net", "AuthenticationFailed")
        claim = await wait_claim_reason(kube, namespace, "c", "PoolNotReady")
        for obj in (instance, pool, claim):
            text = str(obj["status"]["conditions"])
            assert "refused the credentials" in text and f"{namespace}/{grid.secret}" in text, text
            assert "Hunter2" not in text and grid.sim.password not in text
        assert "Hunter2" not in await events_text(kube, namespace, controller)
        # The refused credentials are re-checked later and later, but a fixed Secret is tried at once.
        fixed_at = time.monotonic()
        await grid.set_password(correct)
        await wait_address(kube, namespace, "c", timeout=60)
        assert time.monotonic() - fixed_at < 10, "recovery after the Secret is fixed waits for no backoff"
        await wait_instance_reason(kube, grid.instance, "Connected")
    printed = capfd.readouterr()
    logged = caplog.text + printed.out + printed.err
    assert "AuthenticationFailed" in logged, "the logs were captured"
    for secret in ("Hunter2", correct, b64(f"{grid.sim.username}:{correct}")):
        assert secret not in logged, "a credential reached the logs"


async def test_the_ca_bundle_is_used_and_a_wrong_ca_fails_clearly(
    kube: KubeClient, namespace: str, grid_factory: Any, infoblox_controller: Any, tmp_path: Any
) -> None:
    other_ca = make_tls_material(tmp_path).ca_path.read_text()
    grid: Grid = await grid_factory(ca=other_ca)
    grid.sim.state.add_network("10.10.0.0/24")
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        await grid.create_claim("c", "net")
        instance = await wait_instance_reason(kube, grid.instance, "TLSVerificationFailed")
        assert "certificate could not be verified" in str(instance["status"]["conditions"])
        assert "caBundle" in str(instance["status"]["conditions"])
        await wait_pool_reason(kube, namespace, "net", "TLSVerificationFailed")
        await wait_claim_reason(kube, namespace, "c", "PoolNotReady")
        assert not grid.sim.request_log.entries, "no request got past the TLS handshake"
        # No CA at all means the public CAs, which do not know the grid's: still refused.
        await grid.patch_instance({"caBundle": None})
        generation = (await kube.get(INSTANCES, grid.instance) or {})["metadata"]["generation"]

        async def refused_again() -> bool:
            condition = ready_condition(await kube.get(INSTANCES, grid.instance)) or {}
            current = condition.get("observedGeneration") == generation
            return bool(current and condition["reason"] == "TLSVerificationFailed")

        await wait_for(refused_again, message="the instance without a CA bundle to be refused too")
        assert not grid.sim.request_log.entries
        assert grid.sim.ca_path is not None
        await grid.patch_instance({"caBundle": grid.sim.ca_path.read_text()})
        await wait_address(kube, namespace, "c", timeout=60)


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
async def test_insecure_skip_verify_is_explicit(
    kube: KubeClient, namespace: str, grid_factory: Any, infoblox_controller: Any
) -> None:
    grid: Grid = await grid_factory(ca=None, insecureSkipVerify=True)
    grid.sim.state.add_network("10.10.0.0/24")
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        await grid.create_claim("c", "net")
        await wait_address(kube, namespace, "c")


async def test_an_unreachable_grid(kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any) -> None:
    port = grid.sim.port
    grid.sim.stop()
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        await grid.create_claim("c", "net")
        instance = await wait_instance_reason(kube, grid.instance, "Unreachable")
        assert f"127.0.0.1:{port}" in str(instance["status"]["conditions"])
        await wait_pool_reason(kube, namespace, "net", "Unreachable")
        await wait_claim_reason(kube, namespace, "c", "PoolNotReady")


async def test_missing_view_network_and_range_are_reported(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    await grid.create_pool("no-view", networkView="lab", subnets=[{"cidr": "10.10.0.0/24"}])
    await grid.create_pool("no-net", subnets=[{"cidr": "10.10.0.0/24"}, {"cidr": "10.99.0.0/24"}])
    await grid.create_pool("no-range", ranges=[{"start": "10.10.0.10", "end": "10.10.0.20", "prefix": 24}])
    async with infoblox_controller():
        pool = await wait_pool_reason(kube, namespace, "no-view", "NetworkViewNotFound")
        assert "'lab'" in str(pool["status"]["conditions"])
        pool = await wait_pool_reason(kube, namespace, "no-net", "NetworkNotFound")
        assert "10.99.0.0/24" in str(pool["status"]["conditions"])
        await wait_pool_reason(kube, namespace, "no-range", "RangeNotFound")
        await grid.create_claim("c", "no-view")
        claim = await wait_claim_reason(kube, namespace, "c", "PoolNotReady")
        assert "lab" in str(claim["status"]["conditions"])
        # Creating the view on the grid makes the pool usable (the claim is retried on its own).
        grid.sim.state.add_network_view("lab")
        grid.sim.state.add_network("10.10.0.0/24", network_view="lab")
        await wait_address(kube, namespace, "c", timeout=60)


async def test_extensible_attribute_definitions_missing_and_not_managed(
    kube: KubeClient, namespace: str, grid_factory: Any, infoblox_controller: Any
) -> None:
    grid: Grid = await grid_factory(manageExtensibleAttributeDefinitions=False)
    grid.sim.state.add_network("10.10.0.0/24")
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    async with infoblox_controller():
        instance = await wait_instance_reason(kube, grid.instance, "ExtensibleAttributesMissing")
        assert "CAPI-Claim-UID" in str(instance["status"]["conditions"])
        for name in ("CAPI-Claim-UID", "CAPI-Claim-Namespace", "CAPI-Claim-Name", "CAPI-Cluster-Name", "CAPI-Pool"):
            grid.sim.state.add_ea_definition(name)
        await grid.create_claim("c", "net")
        await wait_address(kube, namespace, "c", timeout=60)


async def test_100_concurrent_claims_are_all_unique(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    # Four pools on one subnet: the controller runs different pools in parallel, so the grid sees concurrent
    # POSTs for the same subnet, as it would from several pools or several controller replicas.
    pools = [f"net-{n}" for n in range(4)]
    for name in pools:
        await grid.create_pool(name, subnets=[{"cidr": "10.10.0.0/24"}])
    grid.sim.faults.add_latency(0.02, methods="POST", count=None)
    async with infoblox_controller(workers=8):
        for name in pools:
            await wait_pool_reason(kube, namespace, name, "PoolReady")
        started = time.monotonic()
        semaphore = asyncio.Semaphore(20)

        async def one(i: int) -> None:
            async with semaphore:
                await grid.create_claim(f"c{i:03}", pools[i % len(pools)])

        await asyncio.gather(*(one(i) for i in range(100)))

        async def all_served() -> list[Object] | None:
            items, _ = await kube.list(ADDRESSES, namespace)
            return items if len(items) == 100 else None

        addresses = await wait_for(all_served, timeout=120, message="100 IPAddresses")
        elapsed = time.monotonic() - started
        values = [a["spec"]["address"] for a in addresses]
        assert len(set(values)) == 100, "an address was handed out twice"
        claims, _ = await kube.list(CLAIMS, namespace)
        per_claim = claim_objects(grid)
        assert set(per_claim) == {c["metadata"]["uid"] for c in claims} and set(per_claim.values()) == {1}
        by_uid = {
            o["extattrs"]["CAPI-Claim-UID"]["value"]: o["ipv4addr"] for o in grid.sim.state.objects("fixedaddress")
        }
        for address in addresses:
            uid = next(c["metadata"]["uid"] for c in claims if c["metadata"]["name"] == address["metadata"]["name"])
            assert by_uid[uid] == address["spec"]["address"], "the IPAddress names the grid object of its claim"
        print(f"\n100 claims served in {elapsed:.1f} s ({100 / elapsed:.0f}/s)")
