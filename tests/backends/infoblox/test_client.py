"""WapiClient against the WAPI simulator: one request per attempt, complete paged answers, fresh logins, and
closing a client while calls are in flight; and Connections replacing a connection that calls are still using."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any, cast

import pytest

from backends.infoblox.client import PAGE_SIZE, Failure, RetryPolicy, WapiClient, WapiError
from backends.infoblox.connections import Connections, InstanceStatus
from backends.infoblox.ledger import parse_object
from backends.infoblox.settings import InfobloxSettings
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from tools.wapi_simulator import WapiSimulator

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)


def client(sim: WapiSimulator, **options: Any) -> WapiClient:
    base = sim.connector_options()
    base.pop("http_request_timeout")
    return WapiClient({**base, **options}, max_workers=4, request_timeout=2, retry=FAST, label="test")


def exists(path: str) -> bool:
    return Path(path).exists()


def get_statuses(sim: WapiSimulator) -> list[int | None]:
    return [entry.status for entry in sim.request_log.entries if entry.method == "GET"]


async def test_each_search_attempt_is_exactly_one_get(wapi_simulator: WapiSimulator) -> None:
    sim = wapi_simulator
    sim.state.add_network("10.0.0.0/24")
    wapi = client(sim)
    await wapi.search("network", ["network"])  # log in once
    sim.request_log.reset()
    sim.faults.fail_next(2, methods="GET")
    assert [n["network"] for n in await wapi.search("network", ["network"])] == ["10.0.0.0/24"]
    assert get_statuses(sim) == [503, 503, 200], "our backoff decides every re-send; the library re-sends nothing"
    sim.request_log.reset()
    sim.faults.fail_next(10, methods="GET")
    with pytest.raises(WapiError) as caught:
        await wapi.search("network", ["network"])
    assert caught.value.failure is Failure.UNAVAILABLE
    assert get_statuses(sim) == [503] * FAST.attempts
    await wapi.close()


async def test_a_paged_search_failing_midway_is_answered_whole(
    wapi_simulator: WapiSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = wapi_simulator
    total = PAGE_SIZE * 2 + 500
    for index in range(total):
        sim.state.add_network(f"10.{index // 256}.{index % 256}.0/30")
    wapi = client(sim)
    original = wapi._get
    calls = 0

    def second_page_fails_once(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            sim.faults.fail_next(1, methods="GET")
        return original(*args)

    monkeypatch.setattr(wapi, "_get", second_page_fails_once)
    found = await wapi.search("network", ["network"], page_size=PAGE_SIZE)
    assert get_statuses(sim) == [200, 503, 200, 200, 200], "restarted from the first page after the 503"
    assert len(found) == total and len({n["_ref"] for n in found}) == total, "every object, each once"
    await wapi.close()


async def test_a_grid_that_ended_the_session_gets_one_fresh_login(wapi_simulator: WapiSimulator) -> None:
    sim = wapi_simulator
    sim.state.add_network("10.0.0.0/24")
    wapi = client(sim)
    await wapi.search("network", ["network"])
    await wapi.search("network", ["network"])
    assert sim.request_log.entries[-1].auth == "cookie", "later requests ride on the ibapauth session"
    sim.auth.expire_sessions()  # as a grid restart does
    sim.request_log.reset()
    assert len(await wapi.search("network", ["network"])) == 1
    assert [(e.status, e.auth) for e in sim.request_log.entries] == [(401, "cookie"), (200, "basic")]
    await wapi.close()


async def test_closing_lets_queued_calls_finish_and_refuses_new_ones(wapi_simulator: WapiSimulator) -> None:
    sim = wapi_simulator
    sim.state.add_network("10.0.0.0/24")
    sim.faults.add_latency(0.2, methods="GET", count=None)
    wapi = client(sim)
    in_flight = [asyncio.create_task(wapi.search("network", ["network"])) for _ in range(10)]
    await asyncio.sleep(0.05)
    await wapi.close()
    answers = await asyncio.gather(*in_flight, return_exceptions=True)
    assert all(isinstance(a, list) and len(a) == 1 for a in answers), answers
    with pytest.raises(WapiError) as caught:
        await wapi.search("network", ["network"])
    assert caught.value.failure is Failure.UNAVAILABLE and "replaced" in caught.value.detail


class SecretsStub:
    """`get` and `patch` from a dict, with a settable Secret resourceVersion (what Connections reads)."""

    def __init__(self, sim: WapiSimulator) -> None:
        assert sim.ca_path is not None
        spec = {
            "host": sim.host,
            "port": sim.port,
            "wapiVersion": sim.wapi_version,
            "caBundle": sim.ca_path.read_text(),
            "credentialsSecretRef": {"name": "creds", "namespace": "sys"},
            "allowedNamespaces": {"list": ["ns"]},
        }
        self.instance = {"metadata": {"name": "grid", "uid": "u1", "generation": 1}, "spec": spec}
        data = {"username": sim.username, "password": sim.password}
        self.secret = {
            "metadata": {"name": "creds", "namespace": "sys", "resourceVersion": "1"},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        if resource.plural == "namespaces":
            return {"metadata": {"name": name, "labels": {SECRET_REFS_LABEL: "true"}}}
        return self.secret if resource.plural == "secrets" else self.instance

    async def patch(self, resource: Any, name: str, patch: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return self.instance


async def test_a_replaced_connection_serves_its_calls_in_flight_then_closes(wapi_simulator: WapiSimulator) -> None:
    sim = wapi_simulator
    sim.state.add_network("10.0.0.0/24")
    kube = SecretsStub(sim)
    settings = InfobloxSettings(instance_cache_seconds=0, retry=FAST)
    connections = Connections(cast(Any, kube), settings, InstanceStatus(cast(Any, kube)))
    old = await connections.connect("grid", "ns")
    ca_file = old.client._connector.ssl_verify
    sim.faults.add_latency(0.3, methods="GET", count=4)
    in_flight = [asyncio.create_task(old.client.search("network", ["network"])) for _ in range(4)]
    await asyncio.sleep(0.05)
    kube.secret["metadata"]["resourceVersion"] = "2"  # the password was rotated
    new = await connections.connect("grid", "ns")
    assert new is not old
    answers = await asyncio.gather(*in_flight, return_exceptions=True)
    assert all(isinstance(a, list) and len(a) == 1 for a in answers), answers
    assert exists(ca_file), "the old connection's files stay while it may still serve calls"
    assert len(await new.client.search("network", ["network"])) == 1
    await connections.close()
    assert not exists(ca_file) and not exists(new.client._connector.ssl_verify)


@pytest.mark.parametrize(
    "raw",
    [
        {"_ref": "record:host/x", "ipv4addrs": ["10.0.0.1"], "extattrs": {}},
        {"_ref": "record:host/x", "ipv4addrs": "10.0.0.1", "ipv6addrs": None},
        {"_ref": "record:host/x", "ipv4addrs": [{"ipv4addr": "10.0.0.1"}], "extattrs": ["CAPI-Claim-UID"]},
        {"_ref": 7, "ipv4addr": "10.0.0.1"},
    ],
)
def test_malformed_grid_objects_are_skipped_or_read_without_crashing(raw: dict[str, Any]) -> None:
    parsed = parse_object("record:host", raw)
    assert parsed is None or (parsed.address == "10.0.0.1" and dict(parsed.extattrs) == {})
