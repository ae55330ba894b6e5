"""Wire compatibility of the in-cluster CRDs with the Go in-cluster provider's installs and manifests."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from ipam_provider.api.capi import CLAIMS
from ipam_provider.controller import Controller
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import CRDS, Resource
from tests.support.objects import POOLS, claim, pool, wait_address
from tools.controlplane.assets import our_crd_paths
from tools.controlplane.crds import install_crds, load_documents


async def test_an_empty_gateway_means_no_gateway(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    """The Go webhook checks the gateway only when it is not empty, so manifests with `gateway: ""` exist."""
    await kube.create(POOLS, pool("v4", ["10.47.0.0/29"], 29, gateway=""), namespace)
    await kube.create(POOLS, pool("v6", ["fd00:47::/120"], 120, gateway=""), namespace)
    await kube.create(CLAIMS, claim("four", "v4"), namespace)
    await kube.create(CLAIMS, claim("six", "v6"), namespace)
    four = await wait_address(kube, namespace, "four")
    six = await wait_address(kube, namespace, "six")
    assert four["spec"]["address"] == "10.47.0.1" and "gateway" not in four["spec"]
    assert six["spec"]["address"] == "fd00:47::1" and "gateway" not in six["spec"]
    with pytest.raises(ApiError) as refused:
        await kube.create(POOLS, pool("bad", ["10.47.1.0/29"], 29, gateway="not-an-ip"), namespace)
    assert "provided gateway is not a valid IP address" in refused.value.message


def _renamed(document: dict[str, Any], group: str) -> dict[str, Any]:
    """The CRD under another API group, so that the session's real CRDs stay untouched."""
    document["metadata"]["name"] = f"{document['spec']['names']['plural']}.{group}"
    document["spec"]["group"] = group
    return document


async def test_the_crds_apply_over_a_go_provider_install_that_stored_v1alpha1(
    kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    """A Go-provider install lists v1alpha1 in status.storedVersions; the API server refuses a CRD update whose
    versions do not include every stored version. Ours list v1alpha1, neither served nor stored."""
    group = f"compat-{secrets.token_hex(3)}.example.com"
    ours = next(
        _renamed(d, group)
        for d in load_documents(our_crd_paths())
        if d["spec"]["names"]["kind"] == "InClusterIPPool" and d["spec"]["group"] == "ipam.cluster.x-k8s.io"
    )
    legacy_schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    go_install = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": ours["metadata"]["name"]},
        "spec": {
            "group": group,
            "names": ours["spec"]["names"],
            "scope": "Namespaced",
            "versions": [{"name": "v1alpha1", "served": True, "storage": True, "schema": legacy_schema}],
        },
    }
    path = tmp_path / "crd.yaml"
    try:
        path.write_text(yaml.safe_dump(go_install))
        await install_crds(kube, [path])
        stored = await kube.get(CRDS, ours["metadata"]["name"])
        assert stored is not None and stored["status"]["storedVersions"] == ["v1alpha1"]

        path.write_text(yaml.safe_dump(ours))
        await install_crds(kube, [path])  # refused (422) if v1alpha1 were not listed

        v1alpha2 = Resource(group, "v1alpha2", "inclusterippools", "InClusterIPPool", True)
        body = {**pool("after-upgrade", ["10.48.0.0/29"], 29, gateway="10.48.0.1"), "apiVersion": f"{group}/v1alpha2"}
        created = await kube.create(v1alpha2, body, namespace)
        assert created["spec"]["gateway"] == "10.48.0.1"
        with pytest.raises(ApiError) as invalid:
            await kube.create(v1alpha2, {**body, "spec": {**body["spec"], "gateway": "nope"}}, namespace)
        assert invalid.value.status == 422, "v1alpha2 keeps its validation"
        v1alpha1 = Resource(group, "v1alpha1", "inclusterippools", "InClusterIPPool", True)
        with pytest.raises(ApiError) as not_served:
            await kube.list(v1alpha1, namespace)
        assert not_served.value.not_found, "v1alpha1 is listed, not served"
    finally:
        await kube.delete(CRDS, ours["metadata"]["name"])
