"""Every request to NetBox is counted in ipam_provider_backend_requests_total{backend="netbox"} by operation (method
and API path without ids or query) and outcome: answers and error answers from the real NetBox, and a NetBox that
does not answer at all."""

from __future__ import annotations

import dataclasses
import socket
from typing import TYPE_CHECKING

import pytest
from prometheus_client import REGISTRY

from backends.netbox import calls
from backends.netbox.client import ClientSettings, Endpoint, NetboxClient, UnreachableError, request_operation

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

FAST = dataclasses.replace(ClientSettings(), attempts=2, backoff=0.01, max_backoff=0.02, connect_timeout=2)


def requests_total(operation: str, outcome: str) -> float:
    labels = {"backend": "netbox", "operation": operation, "outcome": outcome}
    return REGISTRY.get_sample_value("ipam_provider_backend_requests_total", labels) or 0


def timed(operation: str) -> float:
    labels = {"backend": "netbox", "operation": operation}
    return REGISTRY.get_sample_value("ipam_provider_backend_request_duration_seconds_count", labels) or 0


def test_operation_names_carry_no_id_or_query() -> None:
    base = "https://netbox.example/api"
    assert request_operation("GET", f"{base}/ipam/prefixes/?prefix=10.0.0.0%2F24&limit=0") == "GET ipam/prefixes"
    assert request_operation("GET", f"{base}/ipam/prefixes/12/") == "GET ipam/prefixes"
    assert request_operation("POST", f"{base}/ipam/ip-ranges/7/available-ips/") == "POST ipam/ip-ranges/available-ips"
    assert request_operation("PATCH", "https://h/netbox/api/ipam/ip-addresses/99/") == "PATCH ipam/ip-addresses"
    assert request_operation("GET", f"{base}/") == "GET api"
    assert request_operation("GET", "https://netbox.example/login/") == "GET other"


async def test_answers_and_error_answers_are_counted(netbox: NetBoxServer) -> None:
    created = netbox.create_prefix("10.93.0.0/29")
    client = NetboxClient(Endpoint(netbox.url, netbox.token), FAST)
    ok, missing = requests_total("GET ipam/prefixes", "success"), requests_total("GET ipam/ip-addresses", "error")
    durations = timed("GET ipam/prefixes")
    try:
        found = await client.call("GET prefix", calls.get("ipam", "prefixes", int(created.id)))
        assert found is not None and found["prefix"] == "10.93.0.0/29"
        assert (
            await client.call("GET address", calls.get("ipam", "ip_addresses", 2_000_000_000)) is None
        )  # a 404 answer
    finally:
        await client.close()
    assert requests_total("GET ipam/prefixes", "success") - ok == 1
    assert requests_total("GET ipam/ip-addresses", "error") - missing == 1
    assert timed("GET ipam/prefixes") - durations == 1


async def test_requests_without_an_answer_count_as_unreachable() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = NetboxClient(Endpoint(f"http://127.0.0.1:{port}", "nbt_x.y"), FAST)
    before = requests_total("GET ipam/prefixes", "unreachable")
    try:
        with pytest.raises(UnreachableError):
            await client.call("GET prefix", calls.get("ipam", "prefixes", 1))
    finally:
        await client.close()
    assert requests_total("GET ipam/prefixes", "unreachable") - before == FAST.attempts
