"""Credentials the grid refuses are not tried again every few seconds (a real grid may lock the account): the
instance's re-check backs off exponentially while the Secret is unchanged, and a changed Secret is tried at once.
Runs the real Connections and GridHealth against the WAPI simulator (through infoblox-client) on a fake clock."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from backends.infoblox import connections as connections_module
from backends.infoblox.client import Failure, WapiError
from backends.infoblox.connections import Connections, GridHealth, InstanceStatus
from backends.infoblox.settings import InfobloxSettings
from tests.backends.infoblox.test_backend import StubKube, grid_instance, secret
from tools.wapi_simulator import WapiSimulator

SECRET_KEY = ("secrets", "sys", "creds")


def fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The monotonic clock of Connections and GridHealth, set by the test through the answered list's one element
    (starts at 1000)."""
    now = [1000.0]
    clock = SimpleNamespace(monotonic=lambda: now[0])
    monkeypatch.setattr(connections_module, "time", clock)
    return now


def instance_parts(kube: StubKube) -> tuple[Connections, GridHealth]:
    """The connections and grid checks of one backend, writing to one InstanceStatus."""
    status = InstanceStatus(cast(Any, kube))
    return Connections(cast(Any, kube), InfobloxSettings(), status), GridHealth(InfobloxSettings(), status)


def stub_grid(sim: WapiSimulator, password: str, **spec: Any) -> StubKube:
    """An InfobloxInstance "grid" pointing at the simulator, with the Secret "creds" holding `password`."""
    assert sim.ca_path is not None
    instance = grid_instance(host=sim.host, port=sim.port, caBundle=sim.ca_path.read_text(), **spec)
    creds = secret("creds", username=sim.username, password=password)
    return StubKube({("infobloxinstances", None, "grid"): instance, SECRET_KEY: creds})


async def test_refused_credentials_are_rechecked_later_and_later_until_the_secret_changes(
    wapi_simulator: WapiSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = wapi_simulator
    now = fake_clock(monkeypatch)
    kube = stub_grid(sim, "Wrong-password-1")
    connections, grid = instance_parts(kube)  # re-check after 10 s, doubling up to 300 s
    connection = await connections.connect("grid", "ns")
    assert (await grid.health(connection)).reason == "AuthenticationFailed"
    assert sim.request_log.entries and all(e.status == 401 for e in sim.request_log.entries)

    rechecked_at: list[int] = []
    for second in range(1, 1201):  # twenty minutes of pools and claims asking every second
        now[0] = 1000.0 + second
        assert await connections.connect("grid", "ns") is connection, "the Secret did not change: same connection"
        before = len(sim.request_log.entries)
        health = await grid.health(connection)
        assert health.reason == "AuthenticationFailed"
        if len(sim.request_log.entries) > before:
            rechecked_at.append(second)
        elif second > 10:
            assert grid.refused(connection) is health, "releases do not ask the grid meanwhile either"
    assert rechecked_at == [10, 30, 70, 150, 310, 610, 910], "waits of 10, 20, 40, 80, 160, then 300 s"

    # The Secret is fixed: a new resourceVersion builds a new connection, which is checked at once.
    fixed = secret("creds", username=sim.username, password=sim.password)
    fixed["metadata"]["resourceVersion"] = "8"
    kube.objects[SECRET_KEY] = fixed
    now[0] += 6  # past instance_cache_seconds: the Secret is read again
    renewed = await connections.connect("grid", "ns")
    assert renewed is not connection
    health = await grid.health(renewed)
    assert (health.ready, health.reason) == (True, "Connected")
    assert renewed.auth_failures == 0 and grid.refused(renewed) is None
    await connections.close()


async def test_other_failures_keep_the_short_recheck(
    wapi_simulator: WapiSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = wapi_simulator
    now = fake_clock(monkeypatch)
    kube = stub_grid(sim, sim.password, defaultDNSView="nope")
    connections, grid = instance_parts(kube)
    connection = await connections.connect("grid", "ns")
    checks = 0
    for second in range(0, 100):
        now[0] = 1000.0 + second
        before = len(sim.request_log.entries)
        health = await grid.health(connection)
        assert health.reason == "DNSViewNotFound" and "spec.defaultDNSView" in health.message
        checks += len(sim.request_log.entries) > before
    assert checks == 10, "a missing view is asked for every 10 s: fixing it on the grid shows quickly"
    assert grid.refused(connection) is None
    await connections.close()


async def test_refusals_of_other_calls_double_the_wait_only_when_they_probed_again(
    wapi_simulator: WapiSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = wapi_simulator
    now = fake_clock(monkeypatch)
    kube = stub_grid(sim, "Wrong-password-1")
    connections, grid = instance_parts(kube)
    connection = await connections.connect("grid", "ns")
    await grid.health(connection)  # refused at 1000: the wait is 10 s
    refusal = WapiError(Failure.AUTH, "the grid refused the credentials (HTTP 401)", 401)
    now[0] = 1001.0
    await grid.failed(connection, refusal)  # a call that was under way: no doubling
    assert connection.auth_failures == 1 and grid.refused(connection) is not None
    now[0] = 1011.5  # the wait (from 1001) is over: a release asks the grid again and is refused
    assert grid.refused(connection) is None
    await grid.failed(connection, refusal)
    assert connection.auth_failures == 2
    now[0] = 1031.0  # 19.5 s later: still within the doubled wait of 20 s
    assert grid.refused(connection) is not None
    now[0] = 1032.0
    assert grid.refused(connection) is None
    await connections.close()
