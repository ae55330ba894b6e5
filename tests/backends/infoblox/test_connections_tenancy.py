"""Who may use an InfobloxInstance and what it may read, on the real Connections and backend with a dict for the
API server: names are checked before any request, `spec.allowedNamespaces` decides which namespaces' pools are
served (before any Secret is read), every Secret comes through tenancy.read_secret, the CA bundle is bounded PEM,
turning TLS off is a condition and a Warning Event, and idle connections go with their files."""

from __future__ import annotations

import asyncio
import gc
from typing import Any, cast

import pytest

from backends.infoblox import connections as connections_module
from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.connections import CA_BUNDLE_LIMIT, Connection, Connections, InstanceProblem, InstanceStatus
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import INFOBLOX_POOL, parse_pool
from backends.validation import PoolSpecError
from ipam_provider.backend.contract import BackendContext, ClaimContext, PoolNotReadyError, PoolRef
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from tests.backends.infoblox.test_backend import StubKube, grid_instance, pool, secret
from tests.backends.infoblox.test_client import exists
from tools.wapi_simulator import WapiSimulator

ATTACK = "../../v1beta2/namespaces/victim/ipaddressclaims/c"
INSTANCE = ("infobloxinstances", None, "grid")
CREDENTIALS = ("secrets", "sys", "creds")
Object = dict[str, Any]


def connections_of(kube: StubKube, **settings: Any) -> Connections:
    return Connections(cast(Any, kube), InfobloxSettings(**settings), InstanceStatus(cast(Any, kube)))


def usable(**spec: Any) -> StubKube:
    """A StubKube with the instance "grid" (allowing namespace "ns" unless `spec` says otherwise) and its Secret."""
    return StubKube({INSTANCE: grid_instance(**spec), CREDENTIALS: secret("creds", username="u", password="Pa55")})


async def test_a_pool_naming_a_path_as_its_instance_is_invalid_and_nothing_is_read_or_written() -> None:
    kube = usable()
    backend = InfobloxBackend(BackendContext(kube=cast(Any, kube)))
    body = pool(subnets=[{"cidr": "10.0.0.0/24"}])
    body["spec"]["instanceRef"]["name"] = ATTACK
    ref = PoolRef.from_object(body)
    with pytest.raises(PoolSpecError, match=r"spec\.instanceRef\.name: '\.\./\.\./v1beta2/.*' is not a DNS subdomain"):
        parse_pool(ref, body)
    report = await backend.report(ref, body, [])
    assert (report.ready, report.reason) == (False, "InvalidConfiguration")
    assert "spec.instanceRef.name" in report.message and "not a DNS subdomain" in report.message
    with pytest.raises(PoolNotReadyError, match=r"spec\.instanceRef\.name"):
        await backend.allocate(ref, body, ClaimContext("attacker", "c", "claim-uid"))
    with pytest.raises(InstanceProblem) as caught:
        await backend.ledger.connections.connect(ATTACK, "attacker")
    assert caught.value.reason == "InvalidConfiguration"
    assert kube.gets == [] and kube.patches == [], "no request for the named path, no status written anywhere"
    await backend.close()


@pytest.mark.parametrize(
    ("allowed", "namespace", "ok"),
    [
        (None, "ns", False),
        ({}, "ns", False),
        ({"list": ["other"]}, "ns", False),
        ({"list": ["ns"]}, "ns", True),
        ({"selector": {}}, "ns", True),
        ({"selector": {"matchLabels": {"team": "a"}}}, "ns", True),
        ({"selector": {"matchLabels": {"team": "b"}}}, "ns", False),
        ({"selector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}}, "ns", True),
        ({"selector": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}}, "ns", False),
        ({"selector": {}}, "gone", False),  # a namespace that does not exist has no labels to match
    ],
)
async def test_allowed_namespaces_decide_before_any_secret_is_read(allowed: Any, namespace: str, ok: bool) -> None:
    instance = grid_instance()
    instance["spec"].pop("allowedNamespaces")
    if allowed is not None:
        instance["spec"]["allowedNamespaces"] = allowed
    kube = StubKube({INSTANCE: instance, CREDENTIALS: secret("creds", username="u", password="Pa55")})
    connections = connections_of(kube)
    if ok:
        assert (await connections.connect("grid", namespace)).name == "grid"
    else:
        with pytest.raises(InstanceProblem) as caught:
            await connections.connect("grid", namespace)
        assert caught.value.reason == "InstanceNotAllowed"
        message = caught.value.message
        assert "spec.allowedNamespaces" in message and f"namespace {namespace} may not use it" in message
        assert "Pa55" not in message and "sys" not in message and "creds" not in message
        assert not [g for g in kube.gets if g[0] == "secrets"], "no Secret is read for a namespace not allowed"
        assert kube.patches == [], "the refusal is the asking pool's: nothing is written on the instance"
    await connections.close()


@pytest.mark.parametrize(
    "problem",
    [
        {"host": None},  # a spec that does not validate
        {"credentialsSecretRef": {"name": "../x", "namespace": "sys"}},  # a malformed Secret name
        {"credentialsSecretRef": {"name": "absent", "namespace": "sys"}},  # a Secret that does not exist
        {"allowedNamespaces": {"list": "ns"}},  # allowedNamespaces itself malformed: it admits nobody
    ],
)
async def test_a_pool_of_a_namespace_not_allowed_learns_nothing_of_the_instance_and_writes_nothing(
    problem: Object,
) -> None:
    kube = usable(**problem)
    if "host" in problem:
        kube.objects[INSTANCE]["spec"].pop("host")
    kube.objects[("namespaces", None, "other")] = {"metadata": {"name": "other", "labels": {}}}
    backend = InfobloxBackend(BackendContext(kube=cast(Any, kube)))
    body = pool(subnets=[{"cidr": "10.0.0.0/24"}])
    namespace = "ns" if "allowedNamespaces" in problem else "other"
    body["metadata"]["namespace"] = namespace
    report = await backend.report(PoolRef.from_object(body), body, [])
    assert (report.ready, report.reason) == (False, "InstanceNotAllowed"), report.message
    assert report.message.startswith(f"InfobloxInstance grid: namespace {namespace} may not use it")
    for leak in ("host", "credentialsSecretRef", "absent", "sys", "Field required", "not found"):
        assert leak not in report.message
    assert kube.patches == [], "nothing is written on the instance for a pool it does not allow"
    assert not [g for g in kube.gets if g[0] == "secrets"]
    assert backend.ledger.connections._status.instances == {}
    await backend.close()


async def test_pools_and_instances_that_are_gone_leave_nothing_behind() -> None:
    kube = usable(host=None)  # "grid" exists but is unusable; the other instances named do not exist
    kube.objects[INSTANCE]["spec"].pop("host")
    backend = InfobloxBackend(BackendContext(kube=cast(Any, kube)))
    connections, ledger = backend.ledger.connections, backend.ledger
    for turn in range(2):
        for index in range(50):
            body = pool(subnets=[{"cidr": "10.0.0.0/24"}])
            body["metadata"]["name"] = f"p{index}"
            body["spec"]["instanceRef"]["name"] = "grid" if index % 5 == 0 else f"absent-{turn}-{index}"
            ref = PoolRef.from_object(body)
            report = await backend.report(ref, body, [])
            assert report.reason in ("InstanceNotFound", "InvalidConfiguration"), report.message
            with pytest.raises(PoolNotReadyError):
                await backend.allocate(ref, body, ClaimContext("ns", f"c{index}", f"uid-{index}"))
            backend.observe_pool(INFOBLOX_POOL, body, None)
    gc.collect()  # the locks of exceptions' frames, as the collector frees them in a running process
    kept = {
        "locks": len(connections._locks),
        "connections": len(connections._connections),
        "instances": len(connections._status.instances),
        "known pools": len(ledger.known),
        "indexes": len(ledger.indexes),
        "pool checks": len(backend.checks._results),
    }
    assert kept == dict.fromkeys(kept, 0)
    await backend.close()


async def test_a_deleted_pool_leaves_no_index_spec_or_check_behind(wapi_simulator: WapiSimulator) -> None:
    wapi_simulator.state.add_network("10.0.0.0/24")
    kube = simulated(wapi_simulator, insecureSkipVerify=True)
    backend = InfobloxBackend(BackendContext(kube=cast(Any, kube)))
    for index in range(10):
        body = pool(subnets=[{"cidr": "10.0.0.0/24"}])
        body["metadata"]["name"] = f"p{index}"
        report = await backend.report(PoolRef.from_object(body), body, [])
        assert report.ready, report.message
        assert len(backend.ledger.indexes) == len(backend.checks._results) == len(backend.ledger.known) == 1
        backend.observe_pool(INFOBLOX_POOL, body, None)
    assert (backend.ledger.indexes, backend.checks._results, backend.ledger.known) == ({}, {}, {})
    await backend.close()


async def test_namespace_labels_are_read_once_per_cache_period() -> None:
    kube = usable(allowedNamespaces={"selector": {"matchLabels": {"team": "a"}}})
    connections = connections_of(kube, instance_cache_seconds=60)
    for _ in range(5):
        await connections.connect("grid", "ns")
    assert kube.gets.count(("namespaces", None, "ns")) == 1
    await connections.close()


@pytest.mark.parametrize("ca_in_secret", [False, True])
async def test_secrets_of_a_namespace_that_does_not_lend_them_are_not_read(ca_in_secret: bool) -> None:
    kube = usable()
    if ca_in_secret:
        kube.objects[INSTANCE]["spec"]["caBundleSecretRef"] = {"name": "ca", "namespace": "other", "key": "ca.crt"}
        kube.objects[("namespaces", None, "other")] = {"metadata": {"name": "other", "labels": {}}}
        kube.objects[("secrets", "other", "ca")] = secret("ca", **{"ca.crt": "x"})
    else:
        kube.objects[("namespaces", None, "sys")]["metadata"]["labels"] = {}
    connections = connections_of(kube)
    with pytest.raises(InstanceProblem) as caught:
        await connections.connect("grid", "ns")
    assert caught.value.reason == "SecretNotAllowed" and SECRET_REFS_LABEL in caught.value.message
    refused = ("secrets", "other", "ca") if ca_in_secret else CREDENTIALS
    assert refused not in kube.gets
    (patch,) = kube.patches
    assert [(c["type"], c["reason"]) for c in patch["status"]["conditions"]] == [("Ready", "SecretNotAllowed")]
    await connections.close()


@pytest.mark.parametrize(
    ("field", "ref"),
    [
        ("credentialsSecretRef", {"name": "../../../api/v1/namespaces/x/secrets/y", "namespace": "sys"}),
        ("credentialsSecretRef", {"name": "creds", "namespace": "sys/secrets/other"}),
        ("caBundleSecretRef", {"name": "..", "namespace": "sys", "key": "ca.crt"}),
    ],
)
async def test_malformed_secret_names_are_the_instances_invalid_configuration(field: str, ref: Object) -> None:
    kube = usable(**{field: ref})
    connections = connections_of(kube)
    with pytest.raises(InstanceProblem) as caught:
        await connections.connect("grid", "ns")
    assert caught.value.reason == "InvalidConfiguration" and f"spec.{field}" in caught.value.message
    assert not [g for g in kube.gets if g[0] == "secrets"]
    await connections.close()


@pytest.mark.parametrize("in_secret", [False, True])
@pytest.mark.parametrize(
    ("bundle", "message"),
    [
        ("-----BEGIN CERTIFICATE-----\n" + "A" * CA_BUNDLE_LIMIT + "\n-----END CERTIFICATE-----\n", "over the 65536"),
        ("not a certificate at all", "no readable PEM certificate"),
        ("-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n", "no readable PEM certificate"),
    ],
)
async def test_ca_bundles_are_bounded_pem(bundle: str, message: str, in_secret: bool) -> None:
    if in_secret:
        kube = usable(caBundleSecretRef={"name": "ca", "namespace": "sys", "key": "ca.crt"})
        kube.objects[("secrets", "sys", "ca")] = secret("ca", **{"ca.crt": bundle})
    else:
        kube = usable(caBundle=bundle)
    connections = connections_of(kube)
    with pytest.raises(InstanceProblem) as caught:
        await connections.connect("grid", "ns")
    assert caught.value.reason == "InvalidCABundle" and message in caught.value.message
    assert "AAAA" not in caught.value.message and "base64" not in caught.value.message
    await connections.close()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def start(self) -> None:
        pass

    def record(self, obj: Object, type: str, reason: str, message: str) -> None:
        self.events.append((obj["metadata"]["name"], type, reason, message))


def simulated(sim: WapiSimulator, **spec: Any) -> StubKube:
    instance = grid_instance(host=sim.host, port=sim.port, **spec)
    return StubKube({INSTANCE: instance, CREDENTIALS: secret("creds", username=sim.username, password=sim.password)})


async def test_turning_tls_off_is_a_condition_and_a_warning_on_the_instance_and_its_pools(
    wapi_simulator: WapiSimulator,
) -> None:
    wapi_simulator.state.add_network("10.0.0.0/24")
    kube = simulated(wapi_simulator, insecureSkipVerify=True)
    backend = InfobloxBackend(BackendContext(kube=cast(Any, kube)))
    recorder = Recorder()
    backend.ledger.connections._status._recorder = cast(Any, recorder)
    body = pool(subnets=[{"cidr": "10.0.0.0/24"}])
    for _ in range(2):
        report = await backend.report(PoolRef.from_object(body), body, [])
    assert report.ready, report.message
    (tls,) = [c for c in report.conditions if c.type == "TLSVerified"]
    assert (tls.status, tls.reason, tls.warning) == (False, "InsecureSkipVerify", True)
    assert "insecureSkipVerify" in tls.message and wapi_simulator.password not in tls.message
    instance_tls = [c for p in kube.patches for c in p["status"]["conditions"] if c["type"] == "TLSVerified"]
    assert {(c["status"], c["reason"]) for c in instance_tls} == {("False", "InsecureSkipVerify")}
    assert [(name, type, reason) for name, type, reason, _ in recorder.events] == [
        ("grid", "Warning", "InsecureSkipVerify")
    ], "one Warning Event when the condition is entered"
    await backend.close()


async def test_verified_tls_is_reported_true(wapi_simulator: WapiSimulator) -> None:
    wapi_simulator.state.add_network("10.0.0.0/24")
    assert wapi_simulator.ca_path is not None
    kube = simulated(wapi_simulator, caBundle=wapi_simulator.ca_path.read_text())
    backend = InfobloxBackend(BackendContext(kube=cast(Any, kube)))
    body = pool(subnets=[{"cidr": "10.0.0.0/24"}])
    report = await backend.report(PoolRef.from_object(body), body, [])
    (tls,) = [c for c in report.conditions if c.type == "TLSVerified"]
    assert (tls.status, tls.reason, tls.warning) == (True, "Verified", False) and "spec.caBundle" in tls.message
    await backend.close()


async def test_connections_no_pool_asks_for_are_closed_and_their_files_removed(
    wapi_tls_material: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def close_now(connection: Connection) -> None:
        await connection.close()

    monkeypatch.setattr(connections_module, "_close_later", close_now)
    ca = wapi_tls_material.ca_path.read_text()
    kube = usable(caBundle=ca)
    other = grid_instance(caBundle=ca)
    other["metadata"] = {**other["metadata"], "name": "other", "uid": "u2"}
    kube.objects[("infobloxinstances", None, "other")] = other
    connections = connections_of(kube, idle_connection_seconds=0.0)
    first = await connections.connect("grid", "ns")
    ca_file = first.client._connector.ssl_verify
    assert exists(ca_file)
    await connections.connect("other", "ns")  # "grid" was asked for by no pool since
    await asyncio.sleep(0.05)
    assert not exists(ca_file), "the idle connection was closed and its files removed"
    assert await connections.connect("grid", "ns") is not first
    await connections.close()
