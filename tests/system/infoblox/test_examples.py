"""examples/infoblox/ as written (only names, namespaces, the grid's address and CA swapped for the simulator's)
is accepted by the real CRDs and served by the controller."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import yaml

from backends.infoblox.spec import INSTANCES
from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import SECRETS
from tests.support.infoblox import POOLS, lend_secrets, wait_instance_reason, wait_pool_reason
from tests.support.objects import wait_address
from tools.wapi_simulator import WapiSimulator

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "infoblox"
Object = dict[str, Any]


def documents() -> list[Object]:
    return [d for p in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def test_examples_cover_an_instance_secrets_and_pools() -> None:
    kinds = [d["kind"] for d in documents()]
    assert kinds.count("Secret") == 2 and kinds.count("InfobloxInstance") == 1 and kinds.count("InfobloxIPPool") == 2
    for path in EXAMPLES.glob("*.yaml"):
        assert path.read_text().startswith("#"), f"{path.name} lacks its explanatory comment"


async def test_examples_are_served(
    kube: KubeClient, namespace: str, wapi_simulator: WapiSimulator, infoblox_controller: Any
) -> None:
    sim = wapi_simulator
    for cidr in ("10.40.0.0/24", "10.40.1.0/24", "10.41.0.0/24", "10.42.0.0/24"):
        sim.state.add_network(cidr)
    sim.state.add_range("10.42.0.100", "10.42.0.199")
    sim.state.add_zone("nodes.example.com")
    instance_name = f"corp-grid-{secrets.token_hex(3)}"
    assert sim.ca_path is not None
    created: list[tuple[Any, str, str | None]] = []
    await lend_secrets(kube, namespace)
    try:
        for doc in documents():
            kind, meta = doc["kind"], doc["metadata"]
            if kind == "Namespace":
                continue
            if "namespace" in meta:
                meta["namespace"] = namespace
            if kind == "Secret" and meta["name"] == "infoblox-credentials":
                doc["stringData"] = {"username": sim.username, "password": sim.password}
            elif kind == "Secret":
                doc["stringData"] = {"ca.crt": sim.ca_path.read_text()}
            elif kind == "InfobloxInstance":
                meta["name"] = instance_name
                doc["spec"].update(host=sim.host, port=sim.port)
                for ref in ("credentialsSecretRef", "caBundleSecretRef"):
                    doc["spec"][ref]["namespace"] = namespace
                doc["spec"]["allowedNamespaces"]["list"] = [namespace]
            elif kind == "InfobloxIPPool":
                doc["spec"]["instanceRef"]["name"] = instance_name
            resource = {
                "Secret": SECRETS,
                "InfobloxInstance": INSTANCES,
                "InfobloxIPPool": POOLS,
                "IPAddressClaim": CLAIMS,
            }
            await kube.create(resource[kind], doc, meta.get("namespace"))
            created.append((resource[kind], meta["name"], meta.get("namespace")))
        async with infoblox_controller():
            await wait_instance_reason(kube, instance_name, "Connected")
            for pool in ("nodes-v4", "nodes-dns"):
                await wait_pool_reason(kube, namespace, pool, "PoolReady")
            address = await wait_address(kube, namespace, "demo-node-0")
            assert (address["spec"]["address"], address["spec"]["gateway"]) == ("10.40.0.2", "10.40.0.1")
    finally:
        for resource, name, ns in created:
            if resource is INSTANCES:
                await kube.delete(resource, name, ns)
