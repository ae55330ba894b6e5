"""The requested-address annotation on in-cluster pools, against the real API server: a free allowed address is
granted exactly; a held one, or one the pool may not hand out, fails the claim with a message that says which; a
value that is no IP address fails it; a change after fulfilment changes nothing and is told by an Event; two claims
asking for one address at once: exactly one gets it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION
from ipam_provider.controller import Controller
from ipam_provider.reconcile.claims import REASON_REQUESTED_ADDRESS_IGNORED, ignored_message
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.cluster import wait_for
from tests.support.objects import (
    GLOBAL_POOLS,
    POOLS,
    Object,
    claim,
    global_pool,
    pool,
    ready_condition,
    wait_address,
    wait_claim_reason,
)


def requesting(name: str, pool_name: str, address: str, kind: str = "InClusterIPPool") -> Object:
    return claim(name, pool_name, kind=kind, annotations={REQUESTED_ADDRESS_ANNOTATION: address})


async def failure_message(kube: KubeClient, namespace: str, name: str) -> str:
    failed = await wait_claim_reason(kube, namespace, name, "AllocationFailed")
    condition = ready_condition(failed)
    assert condition is not None and condition["status"] == "False"
    assert not (failed.get("status") or {}).get("addressRef")
    assert await kube.get(ADDRESSES, name, namespace) is None, f"{name} must get no IPAddress"
    return str(condition["message"])


async def test_a_requested_free_address_is_granted_exactly_and_dynamic_claims_keep_lowest_first(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("net", ["10.60.0.0/24"], 24, gateway="10.60.0.1"), namespace)
    await kube.create(CLAIMS, requesting("wanted", "net", "10.60.0.77"), namespace)
    assert (await wait_address(kube, namespace, "wanted"))["spec"]["address"] == "10.60.0.77"
    await kube.create(CLAIMS, claim("dynamic", "net"), namespace)
    assert (await wait_address(kube, namespace, "dynamic"))["spec"]["address"] == "10.60.0.2"
    # The lowest address, requested while free, is granted too; the next dynamic claim skips it.
    await kube.create(CLAIMS, requesting("lowest", "net", "10.60.0.3"), namespace)
    assert (await wait_address(kube, namespace, "lowest"))["spec"]["address"] == "10.60.0.3"
    await kube.create(CLAIMS, claim("dynamic-2", "net"), namespace)
    assert (await wait_address(kube, namespace, "dynamic-2"))["spec"]["address"] == "10.60.0.4"

    # IPv6 from a cluster-scoped pool: any spelling of the address, granted in canonical form.
    await kube.create(GLOBAL_POOLS, global_pool(f"{namespace}-v6", ["fd00:60::/120"], 64), None)
    try:
        v6 = requesting("v6", f"{namespace}-v6", "FD00:60:0::0:42", kind="GlobalInClusterIPPool")
        await kube.create(CLAIMS, v6, namespace)
        assert (await wait_address(kube, namespace, "v6"))["spec"]["address"] == "fd00:60::42"
    finally:
        await kube.delete(CLAIMS, "v6", namespace)
        await wait_for(lambda: _gone(kube, "v6", namespace), message="claim v6 to be released")
        await kube.delete(GLOBAL_POOLS, f"{namespace}-v6", None)


async def _gone(kube: KubeClient, name: str, namespace: str) -> bool:
    return await kube.get(CLAIMS, name, namespace) is None


async def test_a_requested_address_held_by_another_claim_fails_until_it_is_released(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("net", ["10.61.0.10-10.61.0.20"], 24), namespace)
    await kube.create(CLAIMS, claim("holder", "net"), namespace)
    assert (await wait_address(kube, namespace, "holder"))["spec"]["address"] == "10.61.0.10"
    await kube.create(CLAIMS, requesting("late", "net", "10.61.0.10"), namespace)
    message = await failure_message(kube, namespace, "late")
    assert message.startswith(f"requested address 10.61.0.10 is already held by claim {namespace}/holder in ")
    assert f"InClusterIPPool/{namespace}/net" in message and "request another address" in message
    # Released: the waiting claim gets exactly that address, not the lowest free one.
    await kube.delete(CLAIMS, "holder", namespace)
    assert (await wait_address(kube, namespace, "late"))["spec"]["address"] == "10.61.0.10"


async def test_addresses_the_pool_may_not_hand_out_fail_with_the_reason(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    spec = {"gateway": "10.62.0.1", "excludedAddresses": ["10.62.0.100-10.62.0.110"]}
    await kube.create(POOLS, pool("net", ["10.62.0.0/24"], 24, **spec), namespace)
    cases = {
        "elsewhere": ("10.63.0.5", "it is not in spec.addresses"),
        "excluded": ("10.62.0.105", "it is in spec.excludedAddresses"),
        "gateway": ("10.62.0.1", "it is the pool's gateway"),
        "network": (
            "10.62.0.0",
            "it is the subnet's network address, reserved unless spec.allocateReservedIPAddresses",
        ),
        "broadcast": ("10.62.0.255", "it is the subnet's broadcast address"),
        "family": ("fd00::5", "it is not an IPv4 address"),
    }
    for name, (address, _) in cases.items():
        await kube.create(CLAIMS, requesting(name, "net", address), namespace)
    for name, (address, why) in cases.items():
        message = await failure_message(kube, namespace, name)
        assert message.startswith(f"requested address {address} is outside InClusterIPPool/{namespace}/net ("), message
        assert why in message and message.endswith("request an address of the pool"), message
    # Reserved addresses are allowed where the pool allows them.
    await kube.create(POOLS, pool("all", ["10.64.0.0/30"], 30, allocateReservedIPAddresses=True), namespace)
    await kube.create(CLAIMS, requesting("reserved-ok", "all", "10.64.0.3"), namespace)
    assert (await wait_address(kube, namespace, "reserved-ok"))["spec"]["address"] == "10.64.0.3"


async def test_a_requested_address_that_is_no_ip_fails_the_claim_until_it_is_fixed(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("net", ["10.65.0.0/24"], 24), namespace)
    await kube.create(CLAIMS, requesting("typo", "net", "10.65.0.256"), namespace)
    message = await failure_message(kube, namespace, "typo")
    assert REQUESTED_ADDRESS_ANNOTATION in message and "'10.65.0.256', which is not an IP address" in message
    patch = {"metadata": {"annotations": {REQUESTED_ADDRESS_ANNOTATION: "10.65.0.50"}}}
    await kube.patch(CLAIMS, "typo", patch, namespace)
    assert (await wait_address(kube, namespace, "typo"))["spec"]["address"] == "10.65.0.50"


async def test_changing_the_annotation_after_fulfilment_changes_nothing_and_an_event_says_so(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("net", ["10.66.0.0/24"], 24), namespace)
    await kube.create(CLAIMS, requesting("m", "net", "10.66.0.20"), namespace)
    before = await wait_address(kube, namespace, "m")
    assert before["spec"]["address"] == "10.66.0.20"
    recorder = in_process_controller.context.recorder

    async def annotate(value: str) -> None:
        await kube.patch(CLAIMS, "m", {"metadata": {"annotations": {REQUESTED_ADDRESS_ANNOTATION: value}}}, namespace)

    def noticed(requested: str, count: int) -> Callable[[], Awaitable[list[Object] | None]]:
        """The claim's RequestedAddressIgnored Events, once those about `requested` add up to `count`."""

        async def probe() -> list[Object] | None:
            await recorder.flush()
            events, _ = await kube.list(EVENTS, namespace)
            found = [e for e in events if e["reason"] == REASON_REQUESTED_ADDRESS_IGNORED]
            about = [e for e in found if e["message"] == ignored_message(requested, "10.66.0.20", True)]
            return found if sum(int(e.get("count") or 1) for e in about) == count else None

        return probe

    await annotate("10.66.0.21")
    (event,) = await wait_for(noticed("10.66.0.21", 1), message="one RequestedAddressIgnored Event")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "m"
    assert "immutable" in event["message"]
    # More reconciles of the same annotation stay silent; a new value is told once; so is an old one told again.
    await kube.patch(CLAIMS, "m", {"metadata": {"labels": {"touched": "yes"}}}, namespace)
    await annotate("10.66.0.22")
    events = await wait_for(noticed("10.66.0.22", 1), message="an Event for the second value")
    assert sorted((e["message"], e.get("count") or 1) for e in events) == [
        (ignored_message("10.66.0.21", "10.66.0.20", True), 1),
        (ignored_message("10.66.0.22", "10.66.0.20", True), 1),
    ]
    await annotate("10.66.0.20")  # matches the IPAddress again: forgotten
    await annotate("10.66.0.21")
    await wait_for(noticed("10.66.0.21", 2), message="the first value told a second time")
    after = await kube.get(ADDRESSES, "m", namespace)
    assert after is not None and after["spec"] == before["spec"]
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    claim_now = await kube.get(CLAIMS, "m", namespace)
    condition = ready_condition(claim_now)
    assert condition is not None and condition["reason"] == "AddressAllocated"
    # The address asked for later was not taken either: another claim can have it.
    await kube.create(CLAIMS, requesting("other", "net", "10.66.0.21"), namespace)
    assert (await wait_address(kube, namespace, "other"))["spec"]["address"] == "10.66.0.21"


async def test_two_claims_requesting_one_address_at_once_exactly_one_gets_it(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("net", ["10.67.0.0/24"], 24), namespace)
    names = [f"race-{index}" for index in range(6)]
    await asyncio.gather(*(kube.create(CLAIMS, requesting(n, "net", "10.67.0.9"), namespace) for n in names))

    async def all_decided() -> dict[str, str] | None:
        reasons: dict[str, str] = {}
        for name in names:
            condition = ready_condition(await kube.get(CLAIMS, name, namespace))
            if condition is None or condition["reason"] not in ("AddressAllocated", "AllocationFailed"):
                return None
            reasons[name] = condition["reason"]
        return reasons

    reasons = await wait_for(all_decided, message="every racing claim to be decided")
    winners = [name for name, reason in reasons.items() if reason == "AddressAllocated"]
    assert len(winners) == 1, reasons
    (winner,) = winners
    addresses, _ = await kube.list(ADDRESSES, namespace)
    assert [(a["metadata"]["name"], a["spec"]["address"]) for a in addresses] == [(winner, "10.67.0.9")]
    for loser in set(names) - {winner}:
        message = await failure_message(kube, namespace, loser)
        assert f"is already held by claim {namespace}/{winner}" in message, message


async def test_a_requested_address_in_its_reuse_grace_period_is_held_by_its_former_claim(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    spec = {"addressReuseGracePeriodSeconds": 3600}
    await kube.create(POOLS, pool("net", ["10.68.0.0/24"], 24, **spec), namespace)
    await kube.create(CLAIMS, requesting("first", "net", "10.68.0.5"), namespace)
    assert (await wait_address(kube, namespace, "first"))["spec"]["address"] == "10.68.0.5"
    await kube.delete(CLAIMS, "first", namespace)
    await wait_for(lambda: _gone(kube, "first", namespace), message="claim first to be released")
    await kube.create(CLAIMS, requesting("second", "net", "10.68.0.5"), namespace)
    message = await failure_message(kube, namespace, "second")
    assert message.startswith(f"requested address 10.68.0.5 is already held by claim {namespace}/first (released;")
    assert "addressReuseGracePeriodSeconds" in message
