"""Every WAPI request is counted in ipam_provider_backend_requests_total{backend="infoblox"} by operation (method and
object type, never a reference) and outcome, against the WAPI simulator: answered, refused, and never answered."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from prometheus_client import REGISTRY

from backends.infoblox.client import Failure, RetryPolicy, WapiClient, WapiError, request_operation
from tools.wapi_simulator import WapiSimulator

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


def requests_total(operation: str, outcome: str) -> float:
    labels = {"backend": "infoblox", "operation": operation, "outcome": outcome}
    return REGISTRY.get_sample_value("ipam_provider_backend_requests_total", labels) or 0


def timed(operation: str) -> float:
    labels = {"backend": "infoblox", "operation": operation}
    return REGISTRY.get_sample_value("ipam_provider_backend_request_duration_seconds_count", labels) or 0


def client(options: dict[str, Any]) -> WapiClient:
    return WapiClient(options, max_workers=2, request_timeout=2, retry=FAST, label="metrics")


def test_operation_names_carry_no_reference_or_query() -> None:
    base = "https://grid.example:8443/wapi/v2.12"
    assert request_operation("GET", f"{base}/network?network=10.0.0.0/24&_return_fields=network") == "GET network"
    assert request_operation("DELETE", f"{base}/record:host/ZG5zLmhvc3Qk:a.example.com/default") == "DELETE record:host"
    assert request_operation("POST", f"{base}/fixedaddress?_return_fields=ipv4addr") == "POST fixedaddress"
    assert request_operation("GET", "https://grid.example/other/path") == "GET other"


async def test_answers_and_error_answers_are_counted(wapi_simulator: WapiSimulator) -> None:
    sim = wapi_simulator
    sim.state.add_network("10.0.0.0/24")
    options = sim.connector_options()
    options.pop("http_request_timeout")
    wapi = client(options)
    ok, refused, deleted = (
        requests_total("GET network", "success"),
        requests_total("GET network", "error"),
        requests_total("DELETE network", "error"),
    )
    durations = timed("GET network")
    try:
        assert [n["network"] for n in await wapi.search("network", ["network"])] == ["10.0.0.0/24"]
        sim.faults.fail_next(2, methods="GET")
        await wapi.search("network", ["network"])  # two 503 answers, then the answer
        assert not await wapi.delete("network/ZG5zLm5ldHdvcmskMTAuOS45LjAvMjQvMA:10.9.9.0/24/default")  # 404
    finally:
        await wapi.close()
    assert requests_total("GET network", "success") - ok >= 2  # a first login may add one
    assert requests_total("GET network", "error") - refused == 2
    assert requests_total("DELETE network", "error") - deleted == 1
    assert timed("GET network") - durations >= 4


async def test_requests_without_an_answer_count_as_unreachable() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = {
        "host": f"127.0.0.1:{port}",
        "username": "u",
        "password": "p",
        "wapi_version": "2.12",
        "ssl_verify": False,
    }
    before = requests_total("GET network", "unreachable")
    wapi = client(options)
    try:
        with pytest.raises(WapiError) as caught:
            await wapi.search("network", ["network"])
    finally:
        await wapi.close()
    assert caught.value.failure is Failure.UNREACHABLE
    assert requests_total("GET network", "unreachable") - before >= FAST.attempts
