"""pytest plugin: scraping the controller's secure metrics endpoint as Prometheus would.

- `scrape(url, token)` GETs a metrics URL (HTTPS, the server's certificate not verified: the controller's
  development certificate is self-signed) with `Authorization: Bearer <token>` when a token is given, and returns
  (status, body).
- `service_account_token(kube, namespace, name, reader=True)` creates ServiceAccount `name` in `namespace`, binds
  it to the ClusterRole `capi-ipam-metrics-reader` of config/rbac when `reader` (applying that ClusterRole from the
  manifest if the cluster lacks it, and waiting until the API server's authoriser allows the grant), and returns a
  token for it from the TokenRequest API. `bind_metrics_reader(kube, namespace, name)` binds an existing
  ServiceAccount; `remove_reader_binding(kube, namespace, name)` deletes the
  (cluster-scoped) binding again.
- `install_cert_manager_crds(kube)` installs cert-manager's own cert-manager.io CRDs (of CERT_MANAGER_VERSION in
  hack/versions.env, from its Go module) before the provider's components (config/default) are applied to a test
  control plane.
- The fixture `metrics_reader_token` does both for the test's `namespace` and cleans up: the token of a
  ServiceAccount allowed to get /metrics.

Run the controller with `--diagnostics-address=127.0.0.1:<free port>` (tests/support/controller.controller_command)
and scrape `https://127.0.0.1:<port>/metrics` with that token.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource
from tests.support.cluster import wait_for
from tools.controlplane.assets import AssetError, cert_manager_crd_paths
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import load_versions

REPO = Path(__file__).resolve().parents[2]
METRICS_READER_ROLE = REPO / "config" / "rbac" / "metrics_reader_role.yaml"
METRICS_READER = "capi-ipam-metrics-reader"
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTER_ROLE_BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)
ACCESS_REVIEWS = Resource("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False)


async def scrape(
    url: str, token: str | None = None, *, ssl_context: ssl.SSLContext | None = None, accept: str | None = None
) -> tuple[int, str]:
    """GET `url` with the token as a bearer token; (status, body). The server's certificate is verified only
    against `ssl_context` when one is given."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if accept is not None:
        headers["Accept"] = accept
    verify: ssl.SSLContext | bool = ssl_context if ssl_context is not None else False
    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url, headers=headers, ssl=verify) as response,
    ):
        return response.status, await response.text()


def binding_name(namespace: str, name: str) -> str:
    return f"{METRICS_READER}-{namespace}-{name}"


async def service_account_token(kube: KubeClient, namespace: str, name: str, *, reader: bool = True) -> str:
    """A token for a new ServiceAccount `namespace/name`, bound to the metrics-reader ClusterRole if `reader`."""
    await kube.create(SERVICE_ACCOUNTS, {"metadata": {"name": name}}, namespace)
    if reader:
        await bind_metrics_reader(kube, namespace, name)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    answer = await kube.create_subresource(SERVICE_ACCOUNTS, name, "token", request, namespace)
    return str(answer["status"]["token"])


async def bind_metrics_reader(kube: KubeClient, namespace: str, name: str) -> None:
    """Bind ServiceAccount `namespace/name` to the metrics-reader ClusterRole (applied from config/rbac if absent)
    and wait until the API server's authoriser allows it to get /metrics."""
    await _ensure_reader_role(kube)
    binding = {
        "metadata": {"name": binding_name(namespace, name)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": METRICS_READER},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }
    await kube.create(CLUSTER_ROLE_BINDINGS, binding)
    user = f"system:serviceaccount:{namespace}:{name}"

    async def granted() -> bool:
        return await may_get_metrics(kube, user)

    await wait_for(granted, message=f"the API server to authorise {user} for /metrics")


async def may_get_metrics(kube: KubeClient, user: str) -> bool:
    """The API server's own answer: may `user` (a ServiceAccount's, with its groups) get /metrics?"""
    spec: dict[str, Any] = {
        "user": user,
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{user.split(':')[2]}", "system:authenticated"],
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
    answer = await kube.create(ACCESS_REVIEWS, review)
    return bool(answer["status"].get("allowed"))


async def remove_reader_binding(kube: KubeClient, namespace: str, name: str) -> None:
    await kube.delete(CLUSTER_ROLE_BINDINGS, binding_name(namespace, name))


async def _ensure_reader_role(kube: KubeClient) -> None:
    role = yaml.safe_load(METRICS_READER_ROLE.read_text())
    assert role["metadata"]["name"] == METRICS_READER, METRICS_READER_ROLE
    try:
        await kube.create(CLUSTER_ROLES, role)
    except ApiError as error:
        if not error.already_exists:
            raise


@pytest_asyncio.fixture
async def metrics_reader_token(kube: KubeClient, namespace: str) -> AsyncIterator[str]:
    """The token of ServiceAccount `metrics-reader` in the test's namespace, allowed to get /metrics."""
    token = await service_account_token(kube, namespace, "metrics-reader")
    try:
        yield token
    finally:
        await remove_reader_binding(kube, namespace, "metrics-reader")


async def install_cert_manager_crds(kube: KubeClient) -> None:
    """cert-manager's cert-manager.io CRDs (Certificate, Issuer, ClusterIssuer, CertificateRequest) of the pinned
    release, so that the provider's components, which include config/certmanager, apply to a test control plane (no
    cert-manager controller runs there: the Certificate's Secret never appears, and the controller serves its
    self-signed certificate). CRDs the cluster already has are left alone. Fails the test if the module cannot be
    fetched."""
    try:
        paths = cert_manager_crd_paths(load_versions())
    except AssetError as error:
        pytest.fail(f"cannot fetch cert-manager's CRDs: {error}", pytrace=False)
    await install_crds(kube, paths, only_missing=True)
