"""The Infoblox backend's parts on their own: pool parsing, names, DUIDs, and the WAPI client's error mapping,
retries and thread pool against the simulator through the real infoblox-client (no API server)."""

from __future__ import annotations

import asyncio
import base64
import copy
import stat
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest

from backends.infoblox.client import Failure, RetryPolicy, WapiClient, WapiError
from backends.infoblox.connections import Connections, InstanceProblem, InstanceStatus
from backends.infoblox.ledger import duid_for
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import Pool, parse_pool
from backends.validation import PoolSpecError
from ipam_provider.backend.contract import PoolRef
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from tools.wapi_simulator import WapiSimulator

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)


def pool(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
        "kind": "InfobloxIPPool",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"instanceRef": {"name": "grid"}, **spec},
    }


def parse(body: dict[str, Any]) -> Pool:
    return parse_pool(PoolRef.from_object(body), body)


def test_pool_targets_keep_their_order_and_count_usable_addresses() -> None:
    parsed = parse(
        pool(
            subnets=[{"cidr": "10.0.1.0/24", "gateway": "10.0.1.1"}, {"cidr": "10.0.0.0/30"}],
            ranges=[{"start": "10.0.2.10", "end": "10.0.2.19", "prefix": 24, "gateway": "10.0.2.1"}],
        )
    )
    assert [t.argument for t in parsed.targets] == ["10.0.1.0/24", "10.0.0.0/30", "10.0.2.10-10.0.2.19"]
    assert [t.usable for t in parsed.targets] == [253, 2, 10]
    assert parsed.label == "ns/p" and parsed.version == 4
    assert parsed.target_of("10.0.2.15").gateway == "10.0.2.1"
    v6 = parse(pool(subnets=[{"cidr": "fd00::/120"}]))
    assert v6.targets[0].usable == 255 and v6.version == 6


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "at least one subnet or range"),
        ({"subnets": [{"cidr": "10.0.0.5/24"}]}, "not a network CIDR"),
        ({"subnets": [{"cidr": "10.0.0.0/24", "gateway": "10.0.1.1"}]}, "is not inside"),
        ({"subnets": [{"cidr": "10.0.0.0/24"}, {"cidr": "fd00::/64"}]}, "mixed IP families"),
        ({"ranges": [{"start": "10.0.0.9", "end": "10.0.0.1", "prefix": 24}]}, "is after end"),
        ({"subnets": [{"cidr": "10.0.0.0/24"}], "mode": "hostRecord"}, "hostRecord"),
        ({"subnets": [{"cidr": "10.0.0.0/24"}], "extensibleAttributes": {"CAPI-Pool": "x"}}, "provider owns"),
        ({"subnets": [{"cidr": "10.0.0.0/24"}], "mode": "dhcp"}, "spec.mode"),
    ],
)
def test_invalid_pools_say_what_to_fix(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(PoolSpecError, match=message):
        parse(pool(**spec))


def test_duid_is_a_duid_uuid_of_the_claim_uid() -> None:
    assert duid_for("0c3e1f5a-8d1b-4c55-9f4e-2b8c7d6e5f40") == ("00:04:0c:3e:1f:5a:8d:1b:4c:55:9f:4e:2b:8c:7d:6e:5f:40")
    assert duid_for("not-a-uuid").startswith("00:04:") and len(duid_for("not-a-uuid").split(":")) == 18


def client(sim: WapiSimulator, **options: Any) -> WapiClient:
    base = sim.connector_options()
    base.pop("http_request_timeout")
    return WapiClient({**base, **options}, max_workers=4, request_timeout=2, retry=FAST, label="test")


async def test_client_errors_map_to_problems(wapi_simulator: WapiSimulator) -> None:
    sim = wapi_simulator
    sim.state.add_network("10.0.0.0/30")
    sim.state.add_ea_definition("CAPI-Claim-UID")
    sim.state.add_ea_definition("Net-Only", allowed_object_types=["Network"])
    wapi = client(sim)
    body = {"ipv4addr": "func:nextavailableip:10.0.0.0/30,default", "mac": "00:00:00:00:00:00"}
    created = [await wapi.create("fixedaddress", body, ["ipv4addr"]) for _ in range(2)]
    assert [c["ipv4addr"] for c in created] == ["10.0.0.1", "10.0.0.2"]
    cases: list[tuple[str, dict[str, Any], Failure, str]] = [
        ("fixedaddress", body, Failure.EXHAUSTED, "Cannot find 1 available IP"),
        (
            "fixedaddress",
            {**body, "ipv4addr": "func:nextavailableip:10.9.0.0/24,default"},
            Failure.TARGET_NOT_FOUND,
            "",
        ),
        ("fixedaddress", {**body, "extattrs": {"Nope": {"value": "x"}}}, Failure.UNKNOWN_EA, "Nope"),
        ("fixedaddress", {**body, "extattrs": {"Net-Only": {"value": "x"}}}, Failure.EA_NOT_ALLOWED, "'Net-Only'"),
        ("fixedaddress", {**body, "ipv4addr": "10.0.0.1"}, Failure.CONFLICT, "already used"),
        (
            "record:host",
            {"name": "a.b", "view": "nope", "ipv4addrs": [{"ipv4addr": "10.0.0.3"}]},
            Failure.VIEW_NOT_FOUND,
            "",
        ),
    ]
    for obj_type, payload, problem, text in cases:
        with pytest.raises(WapiError) as caught:
            await wapi.create(obj_type, payload, ["comment"])
        assert caught.value.failure is problem, (payload, caught.value)
        assert text in caught.value.detail
    for view, detail in (("nope", "View nope not found"), (" ", "View  not found")):  # a search: 404, not []
        sim.request_log.reset()
        with pytest.raises(WapiError) as caught:
            await wapi.search("record:host", ["name"], {"name": "a.b", "view": view})
        assert (caught.value.failure, caught.value.detail, caught.value.status) == (Failure.VIEW_NOT_FOUND, detail, 404)
        assert sim.request_log.count("GET") == 1, "a 404 is an answer: not retried"
    assert await wapi.delete(created[0]["_ref"]) is True
    assert await wapi.delete(created[0]["_ref"]) is False, "404 on DELETE is 'already released'"
    assert await wapi.search("fixedaddress", ["ipv4addr"], extattrs={"CAPI-Claim-UID": "none"}) == []
    await wapi.close()


async def test_client_retries_503_and_lost_requests_on_reads_only(wapi_simulator: WapiSimulator) -> None:
    sim = wapi_simulator
    sim.state.add_network("10.0.0.0/24")
    wapi = client(sim)
    sim.faults.fail_next(3, methods="GET")
    assert len(await wapi.search("network", ["network"])) == 1
    sim.faults.fail_next(1, methods="POST")
    body = {"ipv4addr": "func:nextavailableip:10.0.0.0/24,default", "mac": "00:00:00:00:00:00"}
    with pytest.raises(WapiError) as caught:
        await wapi.create("fixedaddress", body, ["ipv4addr"])
    assert caught.value.failure is Failure.UNAVAILABLE and caught.value.status == 503
    sim.faults.drop_next(1, methods="POST")
    with pytest.raises(WapiError) as caught:
        await wapi.create("fixedaddress", body, ["ipv4addr"])
    assert caught.value.failure is Failure.UNKNOWN_OUTCOME, "a lost POST is never re-sent by the client"
    assert sim.request_log.count("POST") == 2
    await wapi.close()


async def test_client_bad_credentials_and_tls(wapi_simulator: WapiSimulator, tmp_path: Any) -> None:
    from tools.wapi_simulator import make_tls_material

    wrong = client(wapi_simulator, password="wrong-secret-value")
    with pytest.raises(WapiError) as caught:
        await wrong.search("network", ["network"])
    assert caught.value.failure is Failure.AUTH and "wrong-secret-value" not in str(caught.value)
    other_ca = make_tls_material(tmp_path).ca_path
    untrusted = client(wapi_simulator, ssl_verify=str(other_ca))
    with pytest.raises(WapiError) as caught:
        await untrusted.search("network", ["network"])
    assert caught.value.failure is Failure.TLS and "could not be verified" in caught.value.detail
    for wapi in (wrong, untrusted):
        await wapi.close()


async def test_client_bounds_concurrency_and_keeps_the_loop_free(wapi_simulator: WapiSimulator) -> None:
    sim = wapi_simulator
    sim.state.add_network("10.0.0.0/24")
    sim.faults.add_latency(0.2, methods="GET")
    wapi = client(sim)
    in_flight, peak, lock = 0, 0, threading.Lock()
    original = wapi._connector._get_object

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        try:
            return original(*args, **kwargs)
        finally:
            with lock:
                in_flight -= 1

    wapi._connector._get_object = counted
    ticks_in_flight = 0  # a request run on the loop's thread would leave none: the loop could not tick meanwhile

    async def ticker() -> None:
        nonlocal ticks_in_flight
        while True:
            await asyncio.sleep(0.01)
            with lock:
                ticks_in_flight += in_flight > 0

    task = asyncio.create_task(ticker())
    started = time.monotonic()
    await asyncio.gather(*(wapi.search("network", ["network"]) for _ in range(12)))
    elapsed = time.monotonic() - started
    task.cancel()
    assert peak == 4, "at most max_workers requests in flight"
    assert elapsed >= 0.6 - 0.05, "12 requests of 0.2 s through 4 threads take 3 rounds"
    assert ticks_in_flight >= 3, "the event loop kept running while threads waited"
    await wapi.close()


class StubKube:
    """Just `get` and `patch`, from a dict: what Connections reads and InstanceStatus writes. The Namespaces "sys"
    (lending its Secrets to cluster-scoped objects) and "ns" (of the pools) exist unless `objects` says otherwise."""

    def __init__(self, objects: dict[tuple[str, str | None, str], dict[str, Any]]) -> None:
        self.objects = {**copy.deepcopy(NAMESPACES), **objects}
        self.patches: list[dict[str, Any]] = []
        self.gets: list[tuple[str, str | None, str]] = []

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        resource.path(namespace, name)  # the real client's name checks
        self.gets.append((resource.plural, namespace, name))
        return self.objects.get((resource.plural, namespace, name))

    async def patch(self, resource: Any, name: str, patch: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self.patches.append(patch)
        return {**self.objects[(resource.plural, None, name)], **patch}


NAMESPACES: dict[tuple[str, str | None, str], dict[str, Any]] = {
    ("namespaces", None, "sys"): {"metadata": {"name": "sys", "labels": {SECRET_REFS_LABEL: "true"}}},
    ("namespaces", None, "ns"): {"metadata": {"name": "ns", "labels": {"team": "a"}}},
}


def secret(name: str, **data: str) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"metadata": {"name": name, "namespace": "sys", "resourceVersion": "7"}, "data": encoded}


def grid_instance(**spec: Any) -> dict[str, Any]:
    body = {
        "host": "gm.example.com",
        "credentialsSecretRef": {"name": "creds", "namespace": "sys"},
        "allowedNamespaces": {"list": ["ns"]},
        **spec,
    }
    return {
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
        "kind": "InfobloxInstance",
        "metadata": {"name": "grid", "uid": "u1", "generation": 1},
        "spec": body,
    }


async def test_client_certificates_go_to_private_files_removed_with_the_connection(wapi_tls_material: Any) -> None:
    ca = wapi_tls_material.ca_path.read_text()
    kube = StubKube(
        {
            ("infobloxinstances", None, "grid"): grid_instance(caBundle=ca),
            ("secrets", "sys", "creds"): secret("creds", clientCert="CERT-PEM", clientKey="KEY-PEM"),
        }
    )
    connections = Connections(cast(Any, kube), InfobloxSettings(), InstanceStatus(cast(Any, kube)))
    connection = await connections.connect("grid", "ns")
    options = connection.client._connector
    assert (options.cert, options.key) != (None, None) and not hasattr(options, "password")
    directory = check_private_files(options.cert, options.key, options.ssl_verify)
    assert contents(options.key) == "KEY-PEM" and contents(options.ssl_verify) == ca
    await connections.close()
    assert not directory.exists()


def contents(path: str) -> str:
    return Path(path).read_text()


def check_private_files(*paths: str) -> Path:
    """Every path is a 0600 file in one 0700 directory, which is answered."""
    (directory,) = {Path(p).parent for p in paths}
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for path in paths:
        assert stat.S_IMODE(Path(path).stat().st_mode) == 0o600
    return directory


@pytest.mark.parametrize(
    ("objects", "reason"),
    [
        ({}, "InstanceNotFound"),
        ({("infobloxinstances", None, "grid"): grid_instance()}, "CredentialsNotFound"),
        (
            {("infobloxinstances", None, "grid"): grid_instance(), ("secrets", "sys", "creds"): secret("creds", a="b")},
            "InvalidCredentials",
        ),
        (
            {
                ("infobloxinstances", None, "grid"): grid_instance(caBundle="-----BEGIN CERTIFICATE-----\nxx"),
                ("secrets", "sys", "creds"): secret("creds", username="u", password="p"),
            },
            "InvalidCABundle",
        ),
        (
            {
                ("infobloxinstances", None, "grid"): grid_instance(
                    caBundleSecretRef={"name": "ca", "namespace": "sys", "key": "ca.crt"}
                ),
                ("secrets", "sys", "creds"): secret("creds", username="u", password="p"),
            },
            "InvalidCABundle",
        ),
    ],
)
async def test_instance_problems_have_reasons_and_reach_the_instance_status(
    objects: dict[Any, Any], reason: str
) -> None:
    kube = StubKube(objects)
    connections = Connections(cast(Any, kube), InfobloxSettings(), InstanceStatus(cast(Any, kube)))
    with pytest.raises(InstanceProblem) as caught:
        await connections.connect("grid", "ns")
    assert caught.value.reason == reason
    if objects:
        (patch,) = kube.patches
        (condition,) = patch["status"]["conditions"]
        assert (condition["status"], condition["reason"]) == ("False", reason)
    await connections.close()
