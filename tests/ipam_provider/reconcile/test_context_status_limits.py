"""What the reconcilers write fits the API: a condition message longer than metav1.Condition's maxLength (a claim's
40 KB annotation quoted in it, a backend's long report) is cut, beginning and end kept; and a status the API server
still refuses (422) becomes a StatusRefused Warning Event on the object, logged once per refusal, instead of a
failing reconcile retried forever."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from ipam_provider.api.capi import CLAIMS
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION, PoolReport
from ipam_provider.reconcile.context import REASON_STATUS_REFUSED
from ipam_provider.runtime.kube.bounds import CONDITION_MESSAGE_LENGTH, EVENT_MESSAGE_LENGTH
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.fake_backend import FAKE_POOL
from tests.support.world import NS, POOLS, Object, World, claim, make_world, pool, ready_of

HUGE = "1" * 40_000  # not an IP address: quoted whole in the claim's condition message before it was cut


def refusing_status_writes(world: World) -> list[str]:
    """Make the fake API server refuse every status patch with 422, as it refuses a status its schema does not
    take; returns the list the refused patches' resources are recorded in."""
    refused: list[str] = []
    patch: Callable[..., Any] = world.kube.patch

    async def refusing(resource: Any, name: str, body: Any, namespace: Any = None, **kwargs: Any) -> Object:
        if kwargs.get("subresource") == "status":
            refused.append(resource.kind)
            message = f'{resource.kind}.ipam.cluster.x-k8s.io "{name}" is invalid: status.conditions[0].reason: Invalid'
            raise ApiError(422, "Invalid", message)
        result: Object = await patch(resource, name, body, namespace, **kwargs)
        return result

    world.kube.patch = refusing  # type: ignore[method-assign,assignment]
    return refused


async def test_a_40kb_annotation_gives_the_claim_a_condition_the_api_accepts() -> None:
    world = make_world()
    world.add(POOLS, pool())
    world.add(CLAIMS, claim("m1", annotations={REQUESTED_ADDRESS_ANNOTATION: HUGE}))
    await world.claims.reconcile(NS, "m1")
    condition = ready_of(world.claim("m1"))
    assert condition is not None and condition["reason"] == "AllocationFailed"
    message = condition["message"]
    assert len(message) <= CONDITION_MESSAGE_LENGTH and len(message.encode()) <= CONDITION_MESSAGE_LENGTH
    assert message.startswith(f"annotation {REQUESTED_ADDRESS_ANNOTATION} of claim")
    assert message.endswith("which is not an IP address; fix or remove it"), "what to do is kept"
    await world.ctx.recorder.flush()
    (event,) = [e for e in world.kube.stored_all(EVENTS, NS) if e["reason"] == "AllocationFailed"]
    assert len(event["message"].encode()) <= EVENT_MESSAGE_LENGTH and event["message"].endswith("fix or remove it")


async def test_a_long_pool_report_gives_the_pool_a_condition_the_api_accepts() -> None:
    world = make_world()
    world.add(POOLS, pool())
    world.backend.report_with = PoolReport(False, "InvalidConfiguration", "spec.x: " + "y" * 50_000 + "; fix spec.x")
    await world.pools.reconcile(FAKE_POOL.ref(NS, "net"))
    stored = world.kube.stored(POOLS, "net", NS)
    assert stored is not None
    condition = ready_of(stored)
    assert condition is not None and len(condition["message"]) <= CONDITION_MESSAGE_LENGTH
    assert condition["message"].endswith("; fix spec.x")


async def test_a_refused_status_is_an_event_on_the_object_logged_once_and_not_a_failing_reconcile() -> None:
    world = make_world()
    world.add(POOLS, pool())
    world.add(CLAIMS, claim("m1", annotations={REQUESTED_ADDRESS_ANNOTATION: "not-an-ip"}))
    refused = refusing_status_writes(world)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            await world.claims.reconcile(NS, "m1")  # raised ApiError 422 before, and was retried forever
        await world.pools.reconcile(FAKE_POOL.ref(NS, "net"))
    assert refused == ["IPAddressClaim"] * 3 + [FAKE_POOL.kind]
    warnings = [(log["kind"], log["object"]) for log in logs if log["event"] == "status refused by the API server"]
    assert warnings == [("IPAddressClaim", f"{NS}/m1"), (FAKE_POOL.kind, f"{NS}/net")], "once per object"
    await world.ctx.recorder.flush()
    events = [e for e in world.kube.stored_all(EVENTS, NS) if e["reason"] == REASON_STATUS_REFUSED]
    assert sorted((e["involvedObject"]["kind"], e["type"], e["count"]) for e in events) == [
        (FAKE_POOL.kind, "Warning", 1),
        ("IPAddressClaim", "Warning", 3),
    ]
    assert all("status.conditions[0].reason: Invalid" in e["message"] for e in events)
    assert ready_of(world.claim("m1")) is None, "nothing was written"
