"""`rest_client_*` for requests to the real API server (answered, and not answered), and
`leader_election_master_status` through winning, losing and giving up a real Lease."""

from __future__ import annotations

import asyncio
import secrets
import socket

from kubernetes_asyncio import client
from prometheus_client import REGISTRY

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import LEASES, NAMESPACES
from ipam_provider.runtime.leader import LeaderElector
from ipam_provider.runtime.telemetry.clients import host_label


def requests_total(code: str, host: str, method: str) -> float:
    return REGISTRY.get_sample_value("rest_client_requests_total", {"code": code, "host": host, "method": method}) or 0


def latency_count(host: str, verb: str) -> float:
    found = REGISTRY.get_sample_value("rest_client_request_duration_seconds_count", {"host": host, "verb": verb})
    return found or 0


def leader_status(name: str) -> float | None:
    return REGISTRY.get_sample_value("leader_election_master_status", {"name": name})


def test_the_host_label_is_host_and_port_only() -> None:
    assert host_label("https://user:pw@127.0.0.1:6443/base") == "127.0.0.1:6443"
    assert host_label("https://[::1]:6443") == "[::1]:6443"
    assert host_label("https://kubernetes.default.svc") == "kubernetes.default.svc"


async def test_requests_to_the_api_server_are_counted_by_code_and_method(kube: KubeClient, namespace: str) -> None:
    host = host_label(kube.host)
    ok, missing = requests_total("200", host, "GET"), requests_total("404", host, "GET")
    gets = latency_count(host, "GET")
    assert await kube.get(NAMESPACES, namespace) is not None
    assert await kube.get(NAMESPACES, f"{namespace}-absent") is None
    assert requests_total("200", host, "GET") - ok >= 1
    assert requests_total("404", host, "GET") - missing >= 1
    assert latency_count(host, "GET") - gets >= 2
    created = requests_total("201", host, "POST")
    await kube.create(LEASES, {"metadata": {"name": "metrics-probe"}, "spec": {}}, namespace)
    assert requests_total("201", host, "POST") - created >= 1


async def test_a_request_without_an_answer_counts_as_error() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    unreachable = KubeClient(client.ApiClient(configuration), request_timeout=5)
    host = f"127.0.0.1:{port}"
    before, timed = requests_total("<error>", host, "GET"), latency_count(host, "GET")
    try:
        try:
            await unreachable.get(NAMESPACES, "default")
        except (ApiError, OSError, TimeoutError):
            pass
        else:
            raise AssertionError("a request to a closed port got an answer")
    finally:
        await unreachable.close()
    assert requests_total("<error>", host, "GET") - before == 1
    assert latency_count(host, "GET") - timed == 1


async def test_the_leader_gauge_follows_the_lease(kube: KubeClient, namespace: str) -> None:
    lost_name, released_name = f"metrics-{secrets.token_hex(3)}", f"metrics-{secrets.token_hex(3)}"
    elector = LeaderElector(kube, namespace, lost_name, lease_seconds=2, retry_seconds=0.2)
    assert leader_status(lost_name) == 0, "0 from the start when election is on"
    await asyncio.wait_for(elector.acquire(), 10)
    assert leader_status(lost_name) == 1
    keeper = asyncio.create_task(elector.keep())
    await kube.patch(LEASES, lost_name, {"spec": {"holderIdentity": "another-process"}}, namespace)
    await asyncio.wait_for(keeper, 10)  # keep() returns: leadership lost to another process
    assert leader_status(lost_name) == 0

    other = LeaderElector(kube, namespace, released_name, lease_seconds=2, retry_seconds=0.2)
    await asyncio.wait_for(other.acquire(), 10)
    assert leader_status(released_name) == 1
    await other.release()
    assert leader_status(released_name) == 0
