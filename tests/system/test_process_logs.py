"""`ipam-provider run --log-format=json` as a process: every line on stderr is one JSON record, the libraries'
records included, and a failing reconcile logs its traceback once per failure streak.

The controller serves three pools that all go wrong: an in-cluster pool whose IPAddresses the API server refuses
(a ValidatingAdmissionPolicy: the claim's reconcile fails and is retried), a NetBox pool whose NetBox refuses the
token (a recording HTTP server standing in for it), and an Infoblox pool whose grid (the WAPI simulator) refuses
the password.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from backends.infoblox.spec import INFOBLOX_POOL, INSTANCES
from ipam_provider.api.capi import ADDRESSES, CLAIMS, IPAM_GROUP
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS, Resource
from ipam_provider.runtime.user_agent import user_agent
from tests.support.cluster import wait_for
from tests.support.controller import controller_command
from tests.support.netbox_backend import NB_POOLS, nb_claim, netbox_pool, prefix
from tests.support.objects import POOLS, claim, pool, wait_claim_reason
from tests.support.recorder import recording_server
from tools.wapi_simulator import WapiSimulator

ADMISSION = "admissionregistration.k8s.io"
POLICIES = Resource(ADMISSION, "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy", False)
BINDINGS = Resource(ADMISSION, "v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", False)
IB_POOLS = pool_resource(INFOBLOX_POOL)
LIBRARIES = {"urllib3", "requests", "infoblox_client", "pynetbox", "aiohttp", "kubernetes_asyncio", "asyncio"}
NETBOX_TOKEN = f"token-{secrets.token_hex(8)}"
WAPI_PASSWORD = f"Password-{secrets.token_hex(8)}"


def b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


@pytest_asyncio.fixture
async def addresses_refused(kube: KubeClient, namespace: str) -> AsyncIterator[None]:
    """The API server refuses every IPAddress created in `namespace` (from the moment the fixture returns)."""
    name = f"refuse-addresses-{namespace}"
    rules = [{"apiGroups": [IPAM_GROUP], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["ipaddresses"]}]
    await kube.create(
        POLICIES,
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": rules},
                "validations": [{"expression": "false", "message": "IPAddresses are refused in this namespace"}],
            },
        },
    )
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    binding = {"policyName": name, "validationActions": ["Deny"], "matchResources": {"namespaceSelector": selector}}
    await kube.create(BINDINGS, {"metadata": {"name": name}, "spec": binding})
    try:
        await wait_for(lambda: _refused(kube, namespace), timeout=60, message="the admission policy to take effect")
        yield
    finally:
        await kube.delete(BINDINGS, name)
        await kube.delete(POLICIES, name)


async def _refused(kube: KubeClient, namespace: str) -> bool:
    """Whether creating an IPAddress in `namespace` is refused (the policy is compiled and bound)."""
    ref = {"apiGroup": IPAM_GROUP, "kind": "InClusterIPPool", "name": "probe"}
    body = {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {"name": "admission-probe"},
        "spec": {"address": "10.31.0.1", "prefix": 24, "poolRef": ref, "claimRef": {"name": "admission-probe"}},
    }
    try:
        await kube.create(ADDRESSES, body, namespace)
    except ApiError as error:
        return error.status in (403, 422) and "refused in this namespace" in error.message
    await kube.delete(ADDRESSES, "admission-probe", namespace)
    return False


async def infoblox_pool(kube: KubeClient, namespace: str, sim: WapiSimulator) -> str:
    """An InfobloxInstance for `sim` whose Secret holds a password the grid refuses, and pool "ib" on it; returns
    the instance's name (cluster-scoped: the caller deletes it)."""
    assert sim.ca_path is not None
    name = f"grid-{secrets.token_hex(4)}"
    data = {"username": b64(sim.username), "password": b64(WAPI_PASSWORD)}
    await kube.create(
        SECRETS, {"metadata": {"name": name}, "type": "kubernetes.io/basic-auth", "data": data}, namespace
    )
    spec = {
        "host": sim.host,
        "port": sim.port,
        "wapiVersion": sim.wapi_version,
        "caBundle": sim.ca_path.read_text(),
        "credentialsSecretRef": {"name": name, "namespace": namespace},
        "allowedNamespaces": {"list": [namespace]},
    }
    await kube.patch(NAMESPACES, namespace, {"metadata": {"labels": {SECRET_REFS_LABEL: "true"}}})  # lends the Secret
    await kube.create(
        INSTANCES,
        {"apiVersion": INSTANCES.api_version, "kind": INSTANCES.kind, "metadata": {"name": name}, "spec": spec},
    )
    body = {
        "apiVersion": IB_POOLS.api_version,
        "kind": IB_POOLS.kind,
        "metadata": {"name": "ib"},
        "spec": {"instanceRef": {"name": name}, "subnets": [{"cidr": "10.32.0.0/24"}]},
    }
    await kube.create(IB_POOLS, body, namespace)
    return name


def records_of(path: Path) -> list[dict[str, Any]]:
    """Every non-empty stderr line, parsed (a line that is not a JSON object fails the test)."""
    records = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            assert isinstance(record, dict), line
            records.append(record)
    return records


def retries_of(path: Path, key: str) -> list[dict[str, Any]]:
    return [r for r in records_of(path) if r.get("event") == "reconcile failed; retrying" and r.get("key") == key]


async def test_every_line_is_json_with_library_records_and_one_traceback_per_streak(
    kube: KubeClient,
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
    addresses_refused: None,
    wapi_simulator_factory: Any,
) -> None:
    sim: WapiSimulator = wapi_simulator_factory()
    sim.state.add_network("10.32.0.0/24")
    await kube.create(POOLS, pool("net", ["10.31.0.0/29"], 29), namespace)
    await kube.create(CLAIMS, claim("refused", "net"), namespace)
    stderr = tmp_path / "stderr.jsonl"
    with recording_server(403, {"detail": "Invalid token."}) as netbox:
        secret = {"metadata": {"name": "netbox"}, "stringData": {"url": netbox.url, "token": NETBOX_TOKEN}}
        await kube.create(SECRETS, secret, namespace)
        await kube.create(NB_POOLS, netbox_pool("nb", [prefix("10.33.0.0/24")]), namespace)
        await kube.create(CLAIMS, nb_claim("nbc", "nb"), namespace)
        instance = await infoblox_pool(kube, namespace, sim)
        await kube.create(CLAIMS, claim("ibc", "ib", kind=INFOBLOX_POOL.kind), namespace)
        try:
            with stderr.open("w") as sink:
                process = await asyncio.create_subprocess_exec(
                    *controller_command(kubeconfig, namespace, "--log-format=json", "--v=6"),
                    "--metrics-bind-address=0",
                    "--health-probe-bind-address=0",
                    stderr=sink,
                    env={**os.environ},
                )
            try:
                await wait_claim_reason(kube, namespace, "nbc", "PoolNotReady", timeout=60)
                await wait_claim_reason(kube, namespace, "ibc", "PoolNotReady", timeout=60)
                key = f"claim/{namespace}/refused"
                await wait_for(
                    lambda: asyncio.to_thread(lambda: len(retries_of(stderr, key)) >= 3),
                    timeout=60,
                    message="three failed reconciles of the refused claim",
                )
            finally:
                process.terminate()
                assert await asyncio.wait_for(process.wait(), 30) == 0
        finally:
            await kube.delete(INSTANCES, instance)

    records = records_of(stderr)
    for record in records:
        assert {"event", "level", "timestamp"} <= record.keys(), record
    libraries = {r["logger"] for r in records if r.get("logger", "").split(".")[0] in LIBRARIES}
    assert libraries, "no record of a library (stdlib logging) among the controller's"

    streak = retries_of(stderr, key)
    first, *retries = streak
    assert first["level"] == "warning" and first["failures"] == 1 and first["error_type"] == "ApiError"
    (raised,) = [e for e in first["exception"] if e["exc_type"] == "ApiError"]
    assert "refused in this namespace" in raised["exc_value"] and raised["frames"], raised
    assert [r["failures"] for r in retries] == list(range(2, len(streak) + 1))
    assert not [r for r in retries if "exception" in r], "a retry of the same streak repeated the traceback"

    text = stderr.read_text()
    assert NETBOX_TOKEN not in text and WAPI_PASSWORD not in text
    assert netbox.user_agents() == {user_agent("pynetbox")}
    assert {e.user_agent for e in sim.request_log.entries} == {user_agent("infoblox-client")}
