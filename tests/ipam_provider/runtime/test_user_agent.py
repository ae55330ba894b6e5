"""The controller names itself to every server it talks to: its User-Agent on the requests to the API server,
NetBox and the WAPI, and its field manager on every write, so that managedFields say who wrote what."""

from __future__ import annotations

import json
from pathlib import Path

from backends.infoblox.client import RetryPolicy, WapiClient, WapiError
from backends.netbox.client import Endpoint, HTTPError, NetboxClient
from ipam_provider.api.capi import CLAIMS
from ipam_provider.controller import Controller
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from ipam_provider.runtime.user_agent import FIELD_MANAGER, user_agent
from ipam_provider.version import __version__
from tests.support.objects import POOLS, claim, pool, wait_address
from tests.support.recorder import recording_server
from tools.wapi_simulator import WapiSimulator

CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)
PREFIX = f"capi-ipam-provider-py/{__version__} ("


def test_the_user_agent_names_the_controller_its_version_platform_and_library() -> None:
    text = user_agent("pynetbox")
    assert text.startswith(PREFIX) and ") pynetbox/" in text, text
    assert user_agent().startswith(PREFIX) and user_agent().endswith(")")


async def test_netbox_requests_carry_the_user_agent() -> None:
    with recording_server(403, {"detail": "Invalid token"}) as netbox:
        client = NetboxClient(Endpoint(netbox.url, "not-a-token"))
        try:
            try:
                await client.call("GET status", lambda api: api.status())
            except HTTPError as error:
                assert error.status == 403
            else:
                raise AssertionError("the recording server refuses every request")
        finally:
            await client.close()
    assert netbox.requests, "no request reached the server"
    assert netbox.user_agents() == {user_agent("pynetbox")}


async def test_wapi_requests_carry_the_user_agent(wapi_simulator: WapiSimulator) -> None:
    options = wapi_simulator.connector_options(password="Wrong-password-1")
    options.pop("http_request_timeout")
    wapi = WapiClient(options, max_workers=2, request_timeout=5, retry=RetryPolicy(attempts=1), label="ua")
    try:
        await wapi.search("network", ["network"])
    except WapiError:
        pass  # refused: the request was made all the same
    finally:
        await wapi.close()
    entries = wapi_simulator.request_log.entries
    assert entries and {entry.user_agent for entry in entries} == {user_agent("infoblox-client")}


async def test_api_server_requests_carry_the_user_agent(tmp_path: Path) -> None:
    with recording_server(200, {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {}, "items": []}) as server:
        path = tmp_path / "kubeconfig"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": server.url}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        kube = await KubeClient.from_kubeconfig(str(path))
        try:
            await kube.list(CONFIGMAPS, "default")
        finally:
            await kube.close()
    assert server.user_agents() == {user_agent("kubernetes-asyncio")}


async def test_every_write_names_the_controller_as_field_manager(kubeconfig: Path, namespace: str) -> None:
    """The field manager is sent as such, not derived from the User-Agent: a client with another User-Agent still
    writes as the controller, with create, replace, merge patch and a status patch alike."""
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    kube._api.user_agent = "someone-else/1.0"
    try:
        body = {"metadata": {"name": "written"}, "data": {"a": "1"}}
        created = await kube.create(CONFIGMAPS, body, namespace)
        replaced = await kube.replace(CONFIGMAPS, {**created, "data": {"a": "2"}})
        await kube.patch(CONFIGMAPS, "written", {"data": {"b": "3"}}, namespace)
        await kube.create(POOLS, pool("net", ["10.29.0.0/29"], 29), namespace)
        await kube.patch(POOLS, "net", {"status": {"ipAddresses": {"total": 6}}}, namespace, subresource="status")
        written = [await kube.get(CONFIGMAPS, "written", namespace), await kube.get(POOLS, "net", namespace)]
    finally:
        await kube.close()
    assert replaced["data"] == {"a": "2"}
    for obj in written:
        assert obj is not None
        managers = {(entry["manager"], entry.get("subresource", "")) for entry in obj["metadata"]["managedFields"]}
        assert {manager for manager, _ in managers} == {FIELD_MANAGER}, managers
    assert ("capi-ipam-provider-py", "status") in managers


async def test_objects_the_controller_writes_name_it_in_managed_fields(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("net", ["10.29.1.0/29"], 29), namespace)
    await kube.create(CLAIMS, claim("c", "net"), namespace)
    address = await wait_address(kube, namespace, "c")
    assert [entry["manager"] for entry in address["metadata"]["managedFields"]] == [FIELD_MANAGER]
    fulfilled = await kube.get(CLAIMS, "c", namespace)
    assert fulfilled is not None
    status_managers = {e["manager"] for e in fulfilled["metadata"]["managedFields"] if e.get("subresource") == "status"}
    assert status_managers == {FIELD_MANAGER}
