"""An Infoblox credential rotated in the instance's Secret, end to end (real API server, real controller, the WAPI
simulator): the new password is used from then on without a restart, once the grid refuses the old one (its
sessions ended too); a wrong one is reported on the instance, the pool (its condition and a Warning Event) and its
claims, and no password ever shows in a log line, a condition or an Event."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import structlog

from backends.infoblox.spec import INSTANCES
from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import EVENTS
from tests.support.infoblox import FAST, POOLS, Grid, b64, wait_instance_reason, wait_pool_reason
from tests.support.objects import wait_address, wait_claim_reason, wait_events


async def shown(kube: KubeClient, namespace: str, grid: Grid, controller: Any) -> list[str]:
    """What the cluster shows: the instance's, the pool's and the claims' statuses and the namespace's Events."""
    await controller.context.recorder.flush()
    instance = await kube.get(INSTANCES, grid.instance)
    pools, _ = await kube.list(POOLS, namespace)
    claims, _ = await kube.list(CLAIMS, namespace)
    events, _ = await kube.list(EVENTS, namespace)
    return [*(str((o or {}).get("status")) for o in [instance, *pools, *claims]), *(str(e) for e in events)]


async def test_a_rotated_password_is_used_at_once_and_a_wrong_one_is_reported_not_logged(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Distinctive passwords (unlike the simulator's default, a common word), so that a leak cannot hide.
    first, second, wrong = "First-Correct-Horse-5", "Rotated-Staple-Horse-7", "Wrong-Battery-Horse-3"
    grid.sim.auth.add_user(grid.sim.username, first)
    await grid.set_password(first)
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    grid.sim.state.add_network("10.11.0.0/24")
    await grid.create_pool("idle", subnets=[{"cidr": "10.11.0.0/24"}])  # no claim: only its reports use the grid
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs:
        async with infoblox_controller() as controller:
            await grid.create_claim("before", "net")
            await wait_address(kube, namespace, "before", timeout=60)

            grid.sim.auth.add_user(grid.sim.username, second)  # the grid's password changed: the old one refused,
            grid.sim.auth.expire_sessions()  # and so are the sessions opened with it
            await grid.set_password(second)
            await grid.create_claim("after", "net")
            await wait_address(kube, namespace, "after", timeout=60)
            await wait_pool_reason(kube, namespace, "net", "PoolReady")

            await grid.set_password(wrong)
            await asyncio.sleep(2 * FAST.instance_cache_seconds)  # then the next call (the claim's) reads the Secret
            await grid.create_claim("refused", "net")
            await wait_claim_reason(kube, namespace, "refused", "PoolNotReady", timeout=60)
            instance = await wait_instance_reason(kube, grid.instance, "AuthenticationFailed")
            # The pools follow their instance at once, well before their next 60 s report.
            for pool in ("net", "idle"):
                await wait_pool_reason(kube, namespace, pool, "AuthenticationFailed", timeout=20)
            assert "refused the credentials" in str(instance["status"]["conditions"])
            await wait_events(
                kube,
                namespace,
                controller.context.recorder,
                lambda e: (e.get("type"), e.get("reason")) == ("Warning", "AuthenticationFailed"),
                "an AuthenticationFailed Warning Event on each pool",
                until=lambda failed: {e["involvedObject"]["name"] for e in failed} == {"net", "idle"},
            )
            texts = await shown(kube, namespace, grid, controller)

            await grid.set_password(second)  # fixed
            await wait_address(kube, namespace, "refused", timeout=60)
            await wait_pool_reason(kube, namespace, "idle", "PoolReady", timeout=20)
    logged = [repr(entry) for entry in logs] + [record.getMessage() for record in caplog.records] + [caplog.text]
    assert any("AuthenticationFailed" in line for line in logged), "the logs were captured"
    for password in (first, second, wrong):
        basic = b64(f"{grid.sim.username}:{password}")
        assert not [text for text in [*logged, *texts] if password in text or basic in text], "a password was shown"
