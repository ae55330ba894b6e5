"""Tenant isolation and hostile input, tried as a tenant would (issue 31), on the provider deployed as config/default
deploys it (tests/support/deployment.py: its own control plane, config/rbac, the webhook registered, the controller
leading and watching every namespace as its ServiceAccount).

Each attack is refused at admission or surfaced on the tenant's own object, and kube-apiserver's audit log
(tests/support/audit.py) shows that no request of the controller reached into the namespace attacked. Namespaces
cannot be deleted on a control plane without kube-controller-manager, so every test has namespaces of its own.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import ssl
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from backends.incluster.backend import IN_CLUSTER_POOL
from backends.infoblox.spec import INFOBLOX_POOL, INSTANCES
from backends.netbox.spec import NETBOX_POOL
from ipam_provider.admission import webhook_path
from ipam_provider.api.capi import CLAIMS, IPAM_GROUP
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import EVENTS, NAMESPACES, SECRETS
from tests.support.audit import AuditedRequest
from tests.support.cluster import wait_for
from tests.support.deployment import Deployment, deployed
from tests.support.objects import POOLS, claim, pool, ready_condition, wait_address
from tools.wapi_simulator import WapiSimulator

pytestmark = pytest.mark.apiserver

NB_POOLS = pool_resource(NETBOX_POOL)
IB_POOLS = pool_resource(INFOBLOX_POOL)
# ipam_provider/backend/tenancy.py's SECRET_REFS_LABEL, written out: the test must also run against 73a4755.
SECRET_REFS_LABEL = "ipam.cluster.x-k8s.io/allow-cluster-scoped-secret-refs"
CLOSED_URL = "http://127.0.0.1:9"  # port 9 (discard): nothing listens
Object = dict[str, Any]


@pytest_asyncio.fixture(scope="module")
async def deployment(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    async with deployed(tmp_path_factory.mktemp("tenancy")) as provider:
        yield provider


@pytest.fixture
def since(deployment: Deployment) -> datetime:
    """When the test began: the start of its audit window."""
    return deployment.audit.now()


async def namespaces(kube: KubeClient, *names: str, labels: dict[str, str] | None = None) -> None:
    for name in names:
        await kube.create(NAMESPACES, {"metadata": {"name": name, "labels": labels or {}}})


async def controller_requests(deployment: Deployment, since: datetime) -> list[AuditedRequest]:
    """The controller's requests since `since`, read once the log holds one the controller made after this call
    (its lease is renewed every 2 s): so the reader and the identity are proved to work, and what the controller
    was doing when the test stopped acting is in."""
    now = deployment.audit.now()

    async def later() -> list[AuditedRequest]:
        return deployment.audit.requests(deployment.user, now)

    await wait_for(later, timeout=30, interval=0.2, message="a request of the controller in the audit log")
    return deployment.audit.requests(deployment.user, since)


def into(requests: list[AuditedRequest], namespace: str) -> list[str]:
    return [str(r) for r in requests if r.in_namespace(namespace)]


async def refused_or_created(write: Any) -> ApiError | None:
    """The API server's refusal of `write`, or None if it stored the object."""
    try:
        await write
    except ApiError as error:
        return error
    return None


async def wait_ready_false(
    kube: KubeClient, resource: Any, name: str, namespace: str | None, *, create: Object | None = None
) -> Object:
    """Create `create` if given, then wait until the object's Ready condition is False; return the object."""
    if create is not None:
        await kube.create(resource, create, namespace)
    return await wait_ready_status(kube, resource, name, namespace, "False")


async def wait_ready(kube: KubeClient, resource: Any, name: str, namespace: str | None) -> Object:
    return await wait_ready_status(kube, resource, name, namespace, "True")


async def wait_ready_status(kube: KubeClient, resource: Any, name: str, namespace: str | None, status: str) -> Object:
    seen: dict[str, Any] = {}

    async def probe() -> Object | None:
        obj = await kube.get(resource, name, namespace)
        condition = seen["condition"] = ready_condition(obj)
        return obj if condition is not None and condition.get("status") == status else None

    what = f"{resource.kind} {namespace}/{name} to be Ready={status}"
    return await wait_for(probe, timeout=60, message=lambda: f"{what} (have {seen})")


def netbox_pool(name: str, secret: str, **fields: Any) -> Object:
    spec: Object = {"connection": {"secretRef": {"name": secret}}, "sources": [{"prefix": {"cidr": "10.77.0.0/24"}}]}
    if fields:
        spec["addressFields"] = fields
    return {"apiVersion": NB_POOLS.api_version, "kind": NB_POOLS.kind, "metadata": {"name": name}, "spec": spec}


def netbox_secret(name: str, url: str, token: str) -> Object:
    return {"metadata": {"name": name}, "stringData": {"url": url, "token": token}}


async def everything_in(kube: KubeClient, namespace: str) -> str:
    """Every pool, claim and Event of `namespace`, as text: what its tenant can read."""
    texts = []
    for resource in (NB_POOLS, IB_POOLS, POOLS, CLAIMS, EVENTS):
        items, _ = await kube.list(resource, namespace)
        texts.append(json.dumps(items))
    return "\n".join(texts)


async def test_a_netbox_secret_ref_into_another_namespace(deployment: Deployment, since: datetime) -> None:
    kube = deployment.kube
    await namespaces(kube, "team-a", "team-b")
    await kube.create(SECRETS, netbox_secret("netbox", f"{CLOSED_URL}/team-b-secret-url", "team-b-token"), "team-b")
    body = netbox_pool("pool", "../../team-b/secrets/netbox")
    refusal = await refused_or_created(kube.create(NB_POOLS, body, "team-a"))
    if refusal is None:  # accepted: the pool itself must say what is wrong
        await kube.create(CLAIMS, claim("m1", "pool", kind=NETBOX_POOL.kind), "team-a")
        await wait_ready_false(kube, NB_POOLS, "pool", "team-a")
        await wait_ready_false(kube, CLAIMS, "m1", "team-a")
    else:
        assert refusal.status in (400, 422), refusal
    seen = await everything_in(kube, "team-a")
    assert "team-b-secret-url" not in seen and "127.0.0.1:9" not in seen, seen
    assert not into(await controller_requests(deployment, since), "team-b")


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"n": value}
    return value


async def create_with_kubectl(deployment: Deployment, body: Object, namespace: str) -> tuple[int, str]:
    """`kubectl create -f -` of `body` in `namespace`: (exit code, stderr)."""
    document = json.dumps({**body, "metadata": {**body["metadata"], "namespace": namespace}})
    code, _, err = await deployment.kubectl("create", "-f", "-", stdin=document)
    return code, err


async def test_custom_fields_nested_600_levels_are_refused_at_admission(deployment: Deployment) -> None:
    kube = deployment.kube
    await namespaces(kube, "deep-admission")
    await kube.create(SECRETS, netbox_secret("netbox", CLOSED_URL, "token"), "deep-admission")
    deep = netbox_pool("deep", "netbox", customFields={"f": nested(600)})
    code, _ = await create_with_kubectl(deployment, deep, "deep-admission")
    assert code != 0, "a pool with customFields nested 600 levels was accepted"
    assert await kube.get(NB_POOLS, "deep", "deep-admission") is None
    shallow = netbox_pool("shallow", "netbox", customFields={"f": nested(5)})
    code, err = await create_with_kubectl(deployment, shallow, "deep-admission")
    assert code == 0, f"only the depth is refused: {err}"


async def test_an_infoblox_instance_ref_into_another_namespace(deployment: Deployment, since: datetime) -> None:
    kube = deployment.kube
    await namespaces(kube, "victim", "attacker")
    victim = claim("c", "elsewhere", kind="OtherPool", group="example.com")
    version = (await kube.create(CLAIMS, victim, "victim"))["metadata"]["resourceVersion"]
    body = {
        "apiVersion": IB_POOLS.api_version,
        "kind": IB_POOLS.kind,
        "metadata": {"name": "pool"},
        "spec": {
            "instanceRef": {"name": "../../v1beta2/namespaces/victim/ipaddressclaims/c"},
            "subnets": [{"cidr": "10.79.0.0/24"}],
        },
    }
    refusal = await refused_or_created(kube.create(IB_POOLS, body, "attacker"))
    if refusal is None:
        await wait_ready_false(kube, IB_POOLS, "pool", "attacker")
    after = await kube.get(CLAIMS, "c", "victim")
    assert after is not None and after["metadata"]["resourceVersion"] == version, after
    assert not (after.get("status") or {}).get("conditions"), after
    assert not into(await controller_requests(deployment, since), "victim")


async def grid(
    kube: KubeClient, simulator: WapiSimulator, name: str, allowed: list[str], **spec: Any
) -> tuple[str, str]:
    """An InfobloxInstance `name` pointing at `simulator`, its credentials in Namespace `name` (which lends them to
    cluster-scoped objects), usable from the namespaces `allowed`; returns the Secret's (namespace, name)."""
    await namespaces(kube, name, labels={SECRET_REFS_LABEL: "true"})
    data = {"username": simulator.username, "password": simulator.password}
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    await kube.create(SECRETS, {"metadata": {"name": "credentials"}, "data": encoded}, name)
    body: Object = {
        "host": simulator.host,
        "port": simulator.port,
        "wapiVersion": simulator.wapi_version,
        "credentialsSecretRef": {"name": "credentials", "namespace": name},
        "allowedNamespaces": {"list": allowed},
        **spec,
    }
    if simulator.ca_path is not None and not spec.get("insecureSkipVerify"):
        body["caBundle"] = simulator.ca_path.read_text()
    manifest = {"apiVersion": INSTANCES.api_version, "kind": INSTANCES.kind, "metadata": {"name": name}}
    await kube.create(INSTANCES, {**manifest, "spec": body})
    return name, "credentials"


def infoblox_pool(name: str, instance: str, cidr: str, **spec: Any) -> Object:
    return {
        "apiVersion": IB_POOLS.api_version,
        "kind": IB_POOLS.kind,
        "metadata": {"name": name},
        "spec": {"instanceRef": {"name": instance}, "subnets": [{"cidr": cidr}], **spec},
    }


def owner(api_version: str, kind: str, name: str, index: int) -> Object:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": f"00000000-0000-0000-0000-{index:012d}"}


MAX_OWNER_GETS = 10


async def test_a_claim_owned_by_a_secret_a_dotted_name_and_50_owners(
    deployment: Deployment, since: datetime, wapi_simulator_factory: Callable[..., WapiSimulator]
) -> None:
    kube, simulator = deployment.kube, wapi_simulator_factory()
    simulator.state.add_network("10.80.0.0/24")
    simulator.state.add_zone("nodes.example.com")
    await grid(kube, simulator, "grid-owners", ["owners"])
    await namespaces(kube, "owners", "owners-neighbour")
    await kube.create(SECRETS, netbox_secret("kept", CLOSED_URL, "owners-token"), "owners")
    await kube.create(SECRETS, netbox_secret("neighbour", CLOSED_URL, "neighbour-token"), "owners-neighbour")
    host = {"dnsZone": "nodes.example.com", "hostnameSource": "machineName"}
    body = infoblox_pool("pool", "grid-owners", "10.80.0.0/24", mode="hostRecord", hostRecord=host)
    await kube.create(IB_POOLS, body, "owners")
    await wait_ready(kube, IB_POOLS, "pool", "owners")
    stored = await wait_ready_false(kube, CLAIMS, "m1", "owners", create=owned_claim())
    message = str((ready_condition(stored) or {}).get("message", ""))
    assert "owner" in message.lower(), ready_condition(stored)
    requests = await controller_requests(deployment, since)
    secrets_read = [str(r) for r in requests if r.resource == "secrets" and r.namespace != "grid-owners"]
    assert not secrets_read, secrets_read
    assert not [str(r) for r in requests if r.api_group == "example.com" or "/../" in r.uri]
    assert not into(requests, "owners-neighbour")
    owner_gets = [str(r) for r in requests if r.verb == "get" and r.namespace == "owners" and r.resource != "events"]
    assert len(owner_gets) <= MAX_OWNER_GETS, owner_gets
    assert not simulator.state.objects("record:host"), "no host name is guessed"


def owned_claim() -> Object:
    """Claim m1, owned by a Secret, by a name climbing to another namespace's Secret, and by 50 unknown kinds."""
    body = claim("m1", "pool", kind=INFOBLOX_POOL.kind)
    climb = "../../../../../../api/v1/namespaces/owners-neighbour/secrets/neighbour"
    body["metadata"]["ownerReferences"] = [
        owner("v1", "Secret", "kept", 0),
        owner("infrastructure.cluster.x-k8s.io/v1beta1", "VSphereMachine", climb, 1),
        *(owner("example.com/v1", "Widget", f"w{i}", 2 + i) for i in range(50)),
    ]
    return body


def review(operation: str, name: str, namespace: str, old: Object | None, new: Object | None) -> Object:
    resource = {"group": IPAM_GROUP, "version": "v1alpha2", "resource": IN_CLUSTER_POOL.plural}
    request = {
        "uid": "00000000-0000-0000-0000-000000000031",
        "kind": {"group": IPAM_GROUP, "version": "v1alpha2", "kind": IN_CLUSTER_POOL.kind},
        "resource": resource,
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:forger:default"},
        "oldObject": old,
        "object": new,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


async def post_to_webhook(
    deployment: Deployment, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """POST `body` straight to the controller's webhook port, as another pod could: (status, text)."""
    context = ssl.create_default_context(cadata=deployment.ca.decode())
    url = f"{deployment.webhook_url}{webhook_path(IN_CLUSTER_POOL)}"
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        sent = {"Content-Type": "application/json", **(headers or {})}
        async with session.post(url, data=body, headers=sent, ssl=context, compress=None) as response:
            return response.status, await response.text()


LARGE = 12 * 1024 * 1024  # over controller-runtime's 7 MiB, under the 16 MiB 73a4755 read
HUGE = 16 * 1024 * 1024  # the largest body 73a4755 took


async def test_large_bodies_and_a_gzip_bomb_are_refused_and_the_webhook_keeps_serving(
    deployment: Deployment,
) -> None:
    small = json.dumps(review("CREATE", "p", "nowhere", None, pool("p", ["10.81.0.0/24"], 24))).encode()
    padded = {size: small + b" " * (size - len(small)) for size in (LARGE, HUGE)}
    answers = await asyncio.gather(*(post_to_webhook(deployment, padded[size]) for size in (LARGE, HUGE) * 2))
    assert [status for status, _ in answers] == [413] * 4, answers
    bomb = gzip.compress(padded[LARGE], compresslevel=9)
    assert len(bomb) < 64 * 1024
    answers = await asyncio.gather(*(post_to_webhook(deployment, bomb, {"Content-Encoding": "gzip"}) for _ in range(4)))
    assert [status for status, _ in answers] == [413] * 4, answers
    status, text = await post_to_webhook(deployment, small)
    assert status == 200 and json.loads(text)["response"]["allowed"], text
    assert deployment.controller.alive
    await deployment.wait_leading()


async def test_a_forged_delete_review_names_no_address_of_another_namespace(deployment: Deployment) -> None:
    kube = deployment.kube
    await namespaces(kube, "holder")
    stored = await kube.create(POOLS, pool("net", ["10.82.0.0/24"], 24), "holder")
    await kube.create(CLAIMS, claim("secret-machine-7f3a", "net"), "holder")
    address = (await wait_address(kube, "holder", "secret-machine-7f3a"))["spec"]["address"]
    body = json.dumps(review("DELETE", "net", "holder", stored, None)).encode()
    status, text = await post_to_webhook(deployment, body)
    assert "secret-machine-7f3a" not in text and str(address) not in text, (status, text)


async def test_an_infoblox_pool_in_a_namespace_its_instance_does_not_allow(
    deployment: Deployment, since: datetime, wapi_simulator_factory: Callable[..., WapiSimulator]
) -> None:
    kube, simulator = deployment.kube, wapi_simulator_factory()
    simulator.state.add_network("10.83.0.0/24")
    secret_namespace, _ = await grid(kube, simulator, "grid-private", ["insider"])
    await namespaces(kube, "outsider", "insider")
    await kube.create(IB_POOLS, infoblox_pool("pool", "grid-private", "10.83.0.0/24"), "outsider")
    stored = await wait_ready_false(kube, IB_POOLS, "pool", "outsider")
    assert (ready_condition(stored) or {}).get("reason") == "InstanceNotAllowed", ready_condition(stored)
    requests = await controller_requests(deployment, since)
    assert not [str(r) for r in requests if r.resource == "secrets" and r.namespace == secret_namespace]
    assert not simulator.request_log.counts(), "the grid was asked on the outsider's behalf"


async def tls_condition(kube: KubeClient, resource: Any, name: str, namespace: str | None) -> Object:
    async def probe() -> Object | None:
        obj = await kube.get(resource, name, namespace)
        conditions = ((obj or {}).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == "TLSVerified"), None)

    return await wait_for(probe, timeout=60, message=f"condition TLSVerified on {resource.kind} {name}")


async def wait_warning(kube: KubeClient, kind: str, name: str, namespace: str) -> list[Object]:
    """Wait for a Warning Event about `kind` `name` in `namespace`; return the Warnings."""

    async def warnings() -> list[Object]:
        events, _ = await kube.list(EVENTS, namespace)
        about = [
            e for e in events if (e["involvedObject"].get("kind"), e["involvedObject"].get("name")) == (kind, name)
        ]
        return [e for e in about if e.get("type") == "Warning"]

    return await wait_for(warnings, timeout=60, message=f"a Warning Event about {kind} {name}")


async def test_infoblox_insecure_skip_verify_is_loud(
    deployment: Deployment, wapi_simulator_factory: Callable[..., WapiSimulator]
) -> None:
    kube, simulator = deployment.kube, wapi_simulator_factory()
    simulator.state.add_network("10.84.0.0/24")
    await grid(kube, simulator, "grid-insecure", ["tls-off"], insecureSkipVerify=True)
    await namespaces(kube, "tls-off")
    await kube.create(IB_POOLS, infoblox_pool("pool", "grid-insecure", "10.84.0.0/24"), "tls-off")
    for resource, name, namespace in ((IB_POOLS, "pool", "tls-off"), (INSTANCES, "grid-insecure", None)):
        condition = await tls_condition(kube, resource, name, namespace)
        assert (condition["status"], condition["reason"]) == ("False", "InsecureSkipVerify"), condition
        await wait_warning(kube, resource.kind, name, namespace or "default")  # cluster-scoped: Events in default


async def test_netbox_over_plain_http_is_loud(deployment: Deployment) -> None:
    kube = deployment.kube
    await namespaces(kube, "plain-http")
    await kube.create(SECRETS, netbox_secret("netbox", CLOSED_URL, "token"), "plain-http")
    await kube.create(NB_POOLS, netbox_pool("pool", "netbox"), "plain-http")
    condition = await tls_condition(kube, NB_POOLS, "pool", "plain-http")
    assert (condition["status"], condition["reason"]) == ("False", "PlainHTTP"), condition
    await wait_warning(kube, NB_POOLS.kind, "pool", "plain-http")


async def test_a_deep_pool_stored_without_the_webhook_stops_no_restart(deployment: Deployment) -> None:
    """Last of the module: at 73a4755 the restarted controller never syncs its caches, and would fail every test
    after it for that reason."""
    kube = deployment.kube
    await namespaces(kube, "deep-stored", "bystander")
    await kube.create(SECRETS, netbox_secret("netbox", CLOSED_URL, "token"), "deep-stored")
    await kube.create(POOLS, pool("net", ["10.78.0.0/24"], 24), "bystander")
    await deployment.unregister_webhook()
    try:
        deep = netbox_pool("deep", "netbox", customFields={"f": nested(600)})
        code, err = await create_with_kubectl(deployment, deep, "deep-stored")
        assert code == 0, f"without the webhook the deep pool cannot be stored, so no restart can meet it: {err}"
        await deployment.restart_controller()  # caches synced: a claim of the probe namespace was served
    finally:
        await deployment.register_webhook()
    await kube.create(CLAIMS, claim("m1", "net"), "bystander")
    await wait_address(kube, "bystander", "m1", timeout=60)
    condition = ready_condition(await wait_ready_false(kube, NB_POOLS, "deep", "deep-stored")) or {}
    assert condition.get("reason") == "InvalidConfiguration", condition
    assert deployment.controller.alive
