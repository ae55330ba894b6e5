"""The Infoblox CRDs as the real API server applies them: defaults, CEL validation messages, printer columns (that
crds/ matches its generator: tests/hack/test_gen_crds.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backends.infoblox.spec import INFOBLOX_POOL, INSTANCES
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from tests.system.test_examples import kubectl_against

POOLS = pool_resource(INFOBLOX_POOL)
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
SECRET = {"name": "infoblox", "namespace": "capi-ipam-system"}
Object = dict[str, Any]


def instance(name: str, **spec: Any) -> Object:
    body = {"host": "gm.example.com", "credentialsSecretRef": SECRET, **spec}
    return {"apiVersion": INSTANCES.api_version, "kind": INSTANCES.kind, "metadata": {"name": name}, "spec": body}


def pool(name: str, **spec: Any) -> Object:
    body = {"instanceRef": {"name": "grid"}, **spec}
    return {"apiVersion": POOLS.api_version, "kind": POOLS.kind, "metadata": {"name": name}, "spec": body}


async def test_defaults_are_applied(kube: KubeClient, namespace: str) -> None:
    name = f"defaults-{namespace}"
    try:
        stored = await kube.create(INSTANCES, instance(name))
        assert stored["spec"] | {} == {
            "host": "gm.example.com",
            "credentialsSecretRef": SECRET,
            "port": 443,
            "wapiVersion": "2.12",
            "insecureSkipVerify": False,
            "defaultNetworkView": "default",
            "defaultDNSView": "default",
            "manageExtensibleAttributeDefinitions": True,
            "requestTimeoutSeconds": 10,
            "maxConcurrentRequests": 8,
        }
    finally:
        await kube.delete(INSTANCES, name)
    stored = await kube.create(
        POOLS,
        pool("p", subnets=[{"cidr": "10.0.0.0/24"}], mode="hostRecord", hostRecord={"dnsZone": "x.org"}),
        namespace,
    )
    assert stored["spec"]["hostRecord"] == {
        "dnsZone": "x.org",
        "hostnameSource": "machineName",
        "configureForDNS": True,
    }
    assert (await kube.create(POOLS, pool("q", subnets=[{"cidr": "fd00::/64"}]), namespace))["spec"]["mode"] == (
        "fixedAddress"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"host": "https://gm.example.com"}, "host is a name or an address, nothing more"),
        ({"host": "gm.example.com:8443"}, "put the port in spec.port"),
        ({"caBundle": "not a certificate"}, "caBundle must hold PEM certificates"),
        ({"caBundle": PEM, "insecureSkipVerify": True}, "insecureSkipVerify with a CA bundle is contradictory"),
        ({"caBundle": PEM, "caBundleSecretRef": SECRET}, "set caBundle or caBundleSecretRef, not both"),
        ({"wapiVersion": "1.0"}, "spec.wapiVersion"),
        ({"port": 0}, "spec.port"),
        ({"credentialsSecretRef": {"name": "../../x", "namespace": "ns"}}, "spec.credentialsSecretRef.name"),
        ({"credentialsSecretRef": {"name": "x", "namespace": "ns/secrets"}}, "spec.credentialsSecretRef.namespace"),
        (
            {"caBundleSecretRef": {"name": "..", "namespace": "ns", "key": "ca.crt"}},
            "spec.caBundleSecretRef.name",
        ),
        ({"allowedNamespaces": {"list": ["Team A"]}}, "spec.allowedNamespaces.list[0]"),
        (
            {"allowedNamespaces": {"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}},
            "spec.allowedNamespaces.selector.matchExpressions[0].operator",
        ),
    ],
)
async def test_invalid_instances_are_refused(kube: KubeClient, namespace: str, spec: Object, message: str) -> None:
    with pytest.raises(ApiError) as refused:
        await kube.create(INSTANCES, instance(f"bad-{namespace}", **spec))
    assert refused.value.status == 422 and message in refused.value.message, refused.value.message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "set at least one subnet or range"),
        ({"subnets": [{"cidr": "10.0.0.5/24"}]}, "cidr must name the network address"),
        ({"subnets": [{"cidr": "10.0.0.0/33"}]}, "cidr must be a CIDR"),
        ({"subnets": [{"cidr": "10.0.0.0/24", "gateway": "10.0.1.1"}]}, "gateway must lie inside cidr"),
        ({"subnets": [{"cidr": "10.0.0.0/24"}, {"cidr": "fd00::/64"}]}, "subnets are of mixed IP families"),
        (
            {"subnets": [{"cidr": "fd00::/64"}], "ranges": [{"start": "10.0.0.1", "end": "10.0.0.9", "prefix": 24}]},
            "ranges are IPv4",
        ),
        ({"ranges": [{"start": "fd00::1", "end": "fd00::9", "prefix": 64}]}, "must be an IPv4 address"),
        ({"subnets": [{"cidr": "10.0.0.0/24"}], "mode": "hostRecord"}, "mode hostRecord needs hostRecord.dnsZone"),
        ({"subnets": [{"cidr": "10.0.0.0/24"}], "mode": "dhcp"}, "spec.mode"),
        (
            {"subnets": [{"cidr": "10.0.0.0/24"}], "extensibleAttributes": {"CAPI-Claim-UID": "x"}},
            "the CAPI-* ownership attributes are the provider's own",
        ),
        (
            {"subnets": [{"cidr": "10.0.0.0/24"}], "instanceRef": {"name": "../../v1beta2/namespaces/v/secrets/s"}},
            "spec.instanceRef.name",
        ),
    ],
)
async def test_invalid_pools_are_refused(kube: KubeClient, namespace: str, spec: Object, message: str) -> None:
    with pytest.raises(ApiError) as refused:
        await kube.create(POOLS, pool("bad", **spec), namespace)
    assert refused.value.status == 422 and message in refused.value.message, refused.value.message


async def test_printer_columns(kube: KubeClient, kubeconfig: Path, namespace: str) -> None:
    await kube.create(POOLS, pool("cols", subnets=[{"cidr": "10.0.0.0/24"}]), namespace)
    code, out, err = await kubectl_against(kubeconfig, "get", "infobloxippools", "-n", namespace)
    assert code == 0, err
    assert out.split()[:10] == ["NAME", "INSTANCE", "VIEW", "MODE", "TOTAL", "FREE", "USED", "READY", "REASON", "AGE"]
    assert out.splitlines()[1].split()[:3] == ["cols", "grid", "fixedAddress"]
    name = f"cols-{namespace}"
    await kube.create(INSTANCES, instance(name))
    try:
        code, out, err = await kubectl_against(kubeconfig, "get", "infobloxinstances", name)
    finally:
        await kube.delete(INSTANCES, name)
    assert code == 0, err
    assert out.split()[:6] == ["NAME", "HOST", "WAPI", "READY", "REASON", "AGE"]
    assert out.splitlines()[1].split()[:3] == [name, "gm.example.com", "2.12"]
