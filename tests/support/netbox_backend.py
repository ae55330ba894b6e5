"""Helpers for the NetBox backend's tests: Secrets, pools, claims, the controller with fast timers, and waits.

Every test here talks to the real NetBox of tests/support/netbox.py and, where it needs one, the real API server
of tests/support/cluster.py. Nothing is mocked.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
import requests

from backends.netbox import NetboxBackend, NetboxSettings
from backends.netbox.client import ClientSettings, NetboxClient
from backends.netbox.spec import CLAIM_UID_FIELD, GLOBAL_NETBOX_POOL, NETBOX_POOL, OWNER_TAG
from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.backend.contract import BackendContext, ClaimContext, PoolRef
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from ipam_provider.controller import Controller
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS
from tests.support.cluster import wait_for
from tests.support.objects import claim, ready_condition

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

NB_POOLS = pool_resource(NETBOX_POOL)
GLOBAL_NB_POOLS = pool_resource(GLOBAL_NETBOX_POOL)
Object = dict[str, Any]


def fast_settings(**overrides: Any) -> NetboxSettings:
    """Backend settings with short timers, so that tests see recoveries within seconds."""
    client = ClientSettings(attempts=2, backoff=0.05, max_backoff=0.2, connect_timeout=2.0, read_timeout=15.0)
    values: dict[str, Any] = {
        "client": client,
        "secret_seconds": 1.0,
        "ownership_seconds": 2.0,
        "full_skip_seconds": 30.0,
        "unknown_retry_seconds": 0.5,
    }
    values.update(overrides)
    return NetboxSettings(**values)


def backend_factory(settings: NetboxSettings | None = None) -> Callable[[BackendContext], NetboxBackend]:
    def factory(context: BackendContext) -> NetboxBackend:
        return NetboxBackend(context, settings or fast_settings())

    return factory


async def create_secret(
    kube: KubeClient,
    namespace: str,
    netbox: NetBoxServer,
    name: str = "netbox",
    token: str | None = None,
    url: str | None = None,
) -> Object:
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "stringData": {"url": url or netbox.url, "token": token if token is not None else netbox.token},
    }
    return await kube.create(SECRETS, body, namespace)


async def lend_secrets(kube: KubeClient, namespace: str, lend: bool = True) -> None:
    """Label the Namespace so that cluster-scoped pools may read its Secrets (`lend`), or remove the label: a
    GlobalNetboxIPPool reads its Secret only from a Namespace that carries it (ipam_provider.backend.tenancy)."""
    await kube.patch(NAMESPACES, namespace, {"metadata": {"labels": {SECRET_REFS_LABEL: "true" if lend else None}}})


def global_netbox_pool(name: str, sources: list[Object], secret: str, secret_namespace: str, **spec: Any) -> Object:
    """A GlobalNetboxIPPool whose Secret is `secret_namespace/secret`."""
    body = netbox_pool(name, sources, **spec)
    body.update(apiVersion=GLOBAL_NB_POOLS.api_version, kind=GLOBAL_NB_POOLS.kind)
    body["spec"]["connection"]["secretRef"] = {"name": secret, "namespace": secret_namespace}
    return body


def prefix(cidr: str | None = None, *, id: int | None = None, **source: Any) -> Object:
    ref = {"id": id} if id is not None else {"cidr": cidr}
    vrf = source.pop("vrf", None)
    if vrf is not None:
        ref["vrf"] = vrf
    return {"prefix": ref, **source}


def ip_range(start: str | None = None, end: str | None = None, *, id: int | None = None, **source: Any) -> Object:
    ref: Object = {"id": id} if id is not None else {"start": start, "end": end}
    return {"ipRange": ref, **source}


def netbox_pool(name: str, sources: list[Object], *, secret: str = "netbox", **spec: Any) -> Object:
    return {
        "apiVersion": NB_POOLS.api_version,
        "kind": NB_POOLS.kind,
        "metadata": {"name": name},
        "spec": {"connection": {"secretRef": {"name": secret}}, "sources": sources, **spec},
    }


def nb_claim(name: str, pool_name: str, **kwargs: Any) -> Object:
    return claim(name, pool_name, kind="NetboxIPPool", **kwargs)


async def wait_pool_reason(
    kube: KubeClient, namespace: str | None, name: str, reason: str, *, timeout: float = 60, resource: Any = NB_POOLS
) -> Object:
    """Wait until the pool's Ready condition has `reason`; return the pool."""
    seen: dict[str, Any] = {}

    async def probe() -> Object | None:
        obj = await kube.get(resource, name, namespace)
        condition = ready_condition(obj)
        seen["condition"] = condition
        return obj if condition is not None and condition.get("reason") == reason else None

    return await wait_for(
        probe, timeout=timeout, message=lambda: f"pool {name} to have Ready reason {reason} (have {seen})"
    )


def owned_addresses(netbox: NetBoxServer, **filters: Any) -> list[Any]:
    """The NetBox IP addresses that carry our owner tag."""
    return list(netbox.api().ipam.ip_addresses.filter(tag=OWNER_TAG, **filters))


def claim_uid_of(record: Any) -> str | None:
    return (record.custom_fields or {}).get(CLAIM_UID_FIELD)


async def delete_claim(kube: KubeClient, namespace: str, name: str) -> None:
    await kube.delete(CLAIMS, name, namespace)

    async def gone() -> bool:
        return await kube.get(CLAIMS, name, namespace) is None and await kube.get(ADDRESSES, name, namespace) is None

    await wait_for(gone, timeout=60, message=f"claim {namespace}/{name} and its IPAddress to be gone")


@pytest.fixture
def fast_pool_resync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools are reported every 1 s instead of every minute, so that pool conditions follow NetBox quickly."""
    monkeypatch.setattr(NetboxBackend, "report_interval", 1.0)


@pytest.fixture
def netbox_controller(controller_factory: Any, namespace: str) -> Callable[..., Any]:
    """`async with netbox_controller() as controller:` runs the controller with only the NetBox backend."""

    @contextlib.asynccontextmanager
    async def run(settings: NetboxSettings | None = None, **kwargs: Any) -> AsyncIterator[Controller]:
        async with controller_factory(
            namespaces=[namespace],
            extra_backends=[backend_factory(settings)],
            include_in_cluster=False,
            **kwargs,
        ) as controller:
            yield controller

    return run


# --- the backend called directly, as the reconciler calls it --------------------------------------------------


@pytest_asyncio.fixture
async def backend(kube: KubeClient) -> AsyncIterator[NetboxBackend]:
    instance = NetboxBackend(BackendContext(kube=kube), fast_settings())
    yield instance
    await instance.close()


def pool_of(namespace: str, name: str, sources: list[Object], secret: str = "netbox", **spec: Any) -> Object:
    """A pool object as the reconciler hands it to the backend (never created in the API server)."""
    body = netbox_pool(name, sources, secret=secret, **spec)
    body["metadata"].update(namespace=namespace, generation=1, uid=str(uuid.uuid4()))
    return body


def new_claim(namespace: str, name: str) -> ClaimContext:
    return ClaimContext(namespace=namespace, name=name, uid=str(uuid.uuid4()))


def recheck_ownership(backend: NetboxBackend) -> None:
    """Make each current client check NetBox's ownership marks again at its next use."""
    for client in backend.resolver.connections._clients.values():
        client.ownership = None


async def client_of(backend: NetboxBackend, pool: Object) -> NetboxClient:
    return await backend.resolver.connections.client(backend.resolver.parse(PoolRef.from_object(pool), pool))


def marked(netbox: NetBoxServer, uid: str) -> list[Any]:
    """Our NetBox addresses for the claim UID `uid`."""
    return list(netbox.api().ipam.ip_addresses.filter(tag=OWNER_TAG, **{f"cf_{CLAIM_UID_FIELD}": uid}))


def record_gateway(netbox: NetBoxServer, address: str, vrf: Any = None) -> Any:
    """Records a gateway (`"10.0.0.1/24"`) as a NetBox IP address, so that NetBox never hands it out."""
    return netbox.api().ipam.ip_addresses.create(address=address, vrf=getattr(vrf, "id", vrf), description="gateway")


def get_or_create_tag(netbox: NetBoxServer, slug: str) -> Any:
    return netbox.api().extras.tags.get(slug=slug) or netbox.create_tag(slug, slug=slug)


def get_or_create_field(netbox: NetBoxServer, name: str, **fields: Any) -> Any:
    return netbox.api().extras.custom_fields.get(name=name) or netbox.create_custom_field(name, **fields)


def unique_name(prefix: str) -> str:
    """A name no other module or run uses (objects outlive a module when NetBox is shared)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def user_token(
    netbox: NetBoxServer,
    username: str,
    *,
    view: Sequence[str] = (),
    write: Sequence[str] = (),
    version: int = 2,
) -> str:
    """A new user with view permission on `view` and add/change/delete on `write` (object types), and a token
    of `version` (2: `nbt_<key>.<secret>`, sent as Bearer; 1: 40 characters, sent as `Token`)."""
    api = netbox.api()
    user = api.users.users.create(username=username, password="A-long-test-password-1")
    if view:
        api.users.permissions.create(
            name=f"{username}-view", object_types=list(view), actions=["view"], users=[user.id]
        )
    if write:
        api.users.permissions.create(
            name=f"{username}-write", object_types=list(write), actions=["add", "change", "delete"], users=[user.id]
        )
    return create_token(netbox, user.id, version=version)


def create_token(netbox: NetBoxServer, user_id: int, *, version: int = 2) -> str:
    answer = requests.post(
        f"{netbox.url}/api/users/tokens/",
        headers={"Authorization": f"Bearer {netbox.token}"},
        json={"user": user_id, "write_enabled": True, "version": version},
        timeout=30,
    )
    answer.raise_for_status()
    body = answer.json()
    return f"nbt_{body['key']}.{body['token']}" if version == 2 else str(body["token"])


READ_TYPES = ("ipam.ipaddress", "ipam.prefix", "ipam.iprange", "ipam.vrf", "extras.tag", "extras.customfield")
