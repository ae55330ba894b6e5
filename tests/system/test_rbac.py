"""config/rbac is enough for the controller, and no more than it needs.

The controller runs in-process as its own service account (the kubeconfig's `controller` user, which has no
permissions but those RBAC gives it). Without the provider's bindings it is refused; with `kubectl apply -k
config/default` it serves and releases claims from both in-cluster pool kinds, records Events, writes pool status
and holds its leader-election Lease, while every permission it should not have is still denied.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Iterable
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client, config

from backends.incluster.naming import LABEL_CLAIM_UID, RESERVATIONS
from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.cli import IDENTITY_NAMESPACE, ClusterIdentityError, cluster_identity
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import EVENTS, LEASES, NAMESPACES, Resource
from ipam_provider.runtime.leader import LeaderElector
from tests.ipam_provider.test_admission import WEBHOOK_CONFIGURATIONS
from tests.support.cluster import wait_for
from tests.support.controller import run_controller
from tests.support.metrics import install_cert_manager_crds
from tests.support.objects import GLOBAL_POOLS, POOLS, claim, global_pool, pool, wait_address
from tests.system.test_examples import CONFIG, SYSTEM_NAMESPACE, WEBHOOK_CONFIGURATION, kubectl_against
from tools.rbac_calls import ANY, OWN_NAMESPACE, Request, derive

CLUSTER_ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False)
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True)
ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", namespaced=False
)
BINDINGS = [
    (CLUSTER_ROLE_BINDINGS, "capi-ipam-manager-rolebinding", None),
    (ROLE_BINDINGS, "capi-ipam-leader-election-rolebinding", SYSTEM_NAMESPACE),
]
STANDARD_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
# (verb, group, resource, namespace, name) to ask a SelfSubjectAccessReview about. A namespace None is "all
# namespaces" (the Deployment watches every namespace), "other" any namespace but the controller's own.
Access = tuple[str, str, str, str | None, str | None]


def needed(requests: Iterable[Request]) -> list[Access]:
    """What the code requests (derived from it by tools/rbac_calls.py), as access reviews."""
    scope = {ANY: None, OWN_NAMESPACE: SYSTEM_NAMESPACE}
    return sorted(
        {
            (r.verb, r.group, r.resource, scope.get(r.namespace, r.namespace), None if r.name == ANY else r.name)
            for r in requests
        },
        key=str,
    )


def not_needed(requests: Iterable[Request]) -> list[Access]:
    """Every standard verb the code never uses on a resource it requests, anywhere; what it requests only in its
    own namespace, anywhere else; and some permissions a controller must never have."""
    requests = list(requests)
    used = {(r.verb, r.group, r.resource) for r in requests}
    unused: set[Access] = {(v, g, r, None, None) for _, g, r in used for v in STANDARD_VERBS if (v, g, r) not in used}
    elsewhere = {
        (v, g, res)
        for v, g, res in used
        if all(r.namespace == OWN_NAMESPACE for r in requests if (r.verb, r.group, r.resource) == (v, g, res))
    }
    unused |= {(v, g, res, namespace, None) for v, g, res in elsewhere for namespace in (None, "other")}
    never = [
        ("list", "", "pods", None, None),
        ("get", "", "configmaps", "other", None),
        ("create", "apiextensions.k8s.io", "customresourcedefinitions", None, None),
        ("escalate", "rbac.authorization.k8s.io", "clusterroles", None, None),
    ]
    return sorted(unused | set(never), key=str)


@pytest.fixture
def controller_kubeconfig(kubeconfig: Path, tmp_path: Path) -> Path:
    """A copy of the session kubeconfig whose current context is the controller's service account."""
    document = yaml.safe_load(kubeconfig.read_text())
    if "controller" not in {c["name"] for c in document.get("contexts", [])}:
        pytest.fail(f"{kubeconfig} has no `controller` context (see tools/controlplane/cluster.py)", pytrace=False)
    path = tmp_path / "controller.kubeconfig"
    path.write_text(json.dumps({**document, "current-context": "controller"}))
    path.chmod(0o600)
    return path


@pytest_asyncio.fixture
async def as_controller(kube: KubeClient, controller_kubeconfig: Path) -> AsyncIterator[KubeClient]:
    """A client authenticated as the controller's service account (`kube` first: the CRDs must exist)."""
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(controller_kubeconfig), context="controller", client_configuration=configuration
    )
    controller_client = KubeClient(client.ApiClient(configuration))
    yield controller_client
    await controller_client.close()


async def status_of(call: Awaitable[object]) -> int:
    """The HTTP status a request ends with (200 for any success)."""
    try:
        await call
    except ApiError as error:
        return error.status
    return 200


async def allowed(
    kube: KubeClient, verb: str, group: str, resource: str, namespace: str | None, name: str | None = None
) -> bool:
    plural, _, subresource = resource.partition("/")
    attributes = {"verb": verb, "group": group, "resource": plural, "subresource": subresource}
    if namespace is not None:
        attributes["namespace"] = namespace
    if name is not None:
        attributes["name"] = name
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview"}
    answer = await kube.create(ACCESS_REVIEWS, {**review, "spec": {"resourceAttributes": attributes}})
    return bool(answer["status"].get("allowed"))


def in_namespace(access: Access, other: str) -> Access:
    """`access` with its namespace "other" made `other`."""
    verb, group, resource, namespace, name = access
    return verb, group, resource, other if namespace == "other" else namespace, name


async def remove_bindings(kube: KubeClient) -> None:
    for resource, name, namespace in BINDINGS:
        await kube.delete(resource, name, namespace)


async def remove_webhook_configuration(kube: KubeClient) -> None:
    """config/default's ValidatingWebhookConfiguration sends pool changes to the webhook Service, which no Pod backs
    on this API server (shared with the other tests): with its failurePolicy Fail every pool change would be refused.
    The webhook itself is proved with the real API server calling the controller in tests/webhook."""
    await kube.delete(WEBHOOK_CONFIGURATIONS, WEBHOOK_CONFIGURATION)


async def test_the_controller_needs_and_is_served_by_config_rbac(
    kube: KubeClient, kubeconfig: Path, controller_kubeconfig: Path, as_controller: KubeClient, namespace: str
) -> None:
    # Without the provider's bindings (removed, should an earlier run have left them) the identity can do nothing.
    await remove_bindings(kube)

    async def refused() -> bool:
        return await status_of(as_controller.list(CLAIMS)) == 403

    await wait_for(refused, message="the controller's service account to be refused without config/rbac")
    assert await status_of(as_controller.list(ADDRESSES, namespace)) == 403
    assert await status_of(as_controller.get(LEASES, "any", SYSTEM_NAMESPACE)) == 403
    assert not await allowed(as_controller, "create", "", "events", namespace)
    with pytest.raises(ClusterIdentityError, match="--cluster-identity"):
        await cluster_identity(as_controller)
    try:
        # As config/README.md says (server-side: config/default holds the CRDs, which the session installed already).
        apply = ("apply", "--server-side", "--validate=strict", "-k", str(CONFIG / "default"))
        await install_cert_manager_crds(kube)  # config/default holds the metrics endpoint's Certificate
        code, _, err = await kubectl_against(kubeconfig, *apply)
        await remove_webhook_configuration(kube)
        assert code == 0, f"kubectl apply --server-side -k config/default failed:\n{err}"
        assert "PodSecurity" not in err, f"the Deployment breaks its namespace's Pod Security level:\n{err}"

        async def served() -> bool:
            return await status_of(as_controller.list(CLAIMS)) == 200

        await wait_for(served, message="config/rbac to let the controller list claims")
        requests = derive().requests
        missing = [a for a in needed(requests) if not await allowed(as_controller, *in_namespace(a, namespace))]
        assert not missing, f"config/rbac lacks permissions the controller uses: {missing}"
        excess = [a for a in not_needed(requests) if await allowed(as_controller, *in_namespace(a, namespace))]
        assert not excess, f"config/rbac grants more than the controller needs: {excess}"
        # The management cluster's identity, from the kube-system Namespace (tenancy.py reads any Namespace too).
        system = await kube.get(NAMESPACES, IDENTITY_NAMESPACE)
        assert system is not None and await cluster_identity(as_controller) == system["metadata"]["uid"]

        await serve_and_release_as_controller(kube, controller_kubeconfig, namespace)
        await hold_the_lease_as_controller(kube, as_controller, namespace)
    finally:
        await remove_webhook_configuration(kube)
        await remove_bindings(kube)  # leave the identity as powerless as the other tests expect it


async def serve_and_release_as_controller(kube: KubeClient, controller_kubeconfig: Path, namespace: str) -> None:
    global_name = f"rbac-{namespace}"
    async with run_controller(controller_kubeconfig, namespaces=[namespace]) as controller:
        assert controller.kube.host == kube.host
        await kube.create(POOLS, pool("net", ["10.30.0.0/24"], 24, gateway="10.30.0.1"), namespace)
        await kube.create(GLOBAL_POOLS, global_pool(global_name, ["fd00:30::/120"], 64))
        await kube.create(CLAIMS, claim("m1", "net"), namespace)
        await kube.create(CLAIMS, claim("m1-v6", global_name, kind="GlobalInClusterIPPool"), namespace)
        try:
            assert (await wait_address(kube, namespace, "m1"))["spec"]["address"] == "10.30.0.2"
            assert (await wait_address(kube, namespace, "m1-v6"))["spec"]["address"] == "fd00:30::1"

            async def pool_status_written() -> bool:
                stored = await kube.get(POOLS, "net", namespace)
                counts = ((stored or {}).get("status") or {}).get("ipAddresses") or {}
                return bool(counts.get("used") == 1)

            await wait_for(pool_status_written, message="the controller to write the pool's status")
            await controller.context.recorder.flush()
            events, _ = await kube.list(EVENTS, namespace)
            assert any(e["reason"] == "AddressAllocated" and e["involvedObject"]["name"] == "m1" for e in events)

            uid = (await kube.get(CLAIMS, "m1", namespace) or {})["metadata"]["uid"]
            held, _ = await kube.list(RESERVATIONS, label_selector=f"{LABEL_CLAIM_UID}={uid}")
            assert [r["spec"]["address"] for r in held] == ["10.30.0.2"]
            for name in ("m1", "m1-v6"):
                await kube.delete(CLAIMS, name, namespace)

            async def released() -> bool:
                for name in ("m1", "m1-v6"):
                    if await kube.get(CLAIMS, name, namespace) or await kube.get(ADDRESSES, name, namespace):
                        return False
                left, _ = await kube.list(RESERVATIONS, label_selector=f"{LABEL_CLAIM_UID}={uid}")
                return not left

            await wait_for(released, message="the claims, their IPAddresses and reservations to be released")
        finally:
            await kube.delete(POOLS, "net", namespace)
            await kube.delete(GLOBAL_POOLS, global_name)

            async def pools_gone() -> bool:
                return (
                    await kube.get(POOLS, "net", namespace) is None
                    and await kube.get(GLOBAL_POOLS, global_name) is None
                )

            await wait_for(pools_gone, message="the controller to let the pools go")


async def hold_the_lease_as_controller(kube: KubeClient, as_controller: KubeClient, namespace: str) -> None:
    name = f"rbac-test-{secrets.token_hex(4)}"
    elector = LeaderElector(as_controller, SYSTEM_NAMESPACE, name, retry_seconds=0.2)
    try:
        await asyncio.wait_for(elector.acquire(), 10)
        assert await elector._try(), "the holder could not renew its lease"
        await elector.release()
        lease = await kube.get(LEASES, name, SYSTEM_NAMESPACE)
        assert lease is not None and not lease["spec"].get("holderIdentity")
    finally:
        await kube.delete(LEASES, name, SYSTEM_NAMESPACE)
    with pytest.raises(ApiError) as elsewhere:
        await LeaderElector(as_controller, namespace, name)._try()
    assert elsewhere.value.status == 403, "leases outside the controller's namespace must stay out of reach"
