"""The management cluster's identity against the real API server: the kube-system Namespace's uid, unless
`--cluster-identity` gives one; and `ipam-provider run` hands it to the backends."""

from __future__ import annotations

from ipam_provider.cli import IDENTITY_NAMESPACE, cluster_identity
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES


async def test_the_identity_is_the_kube_system_uid_unless_overridden(kube: KubeClient) -> None:
    system = await kube.get(NAMESPACES, IDENTITY_NAMESPACE)
    assert system is not None
    uid = system["metadata"]["uid"]
    assert uid and await cluster_identity(kube) == uid
    assert await cluster_identity(kube) == uid, "the same on every start"
    assert await cluster_identity(kube, "mgmt-eu-1") == "mgmt-eu-1"
