"""Helpers for the NetBox backend's tests: Secrets, pools, claims, the controller with fast timers, and waits.

Every test here talks to the real NetBox of tests/support/netbox.py and, where it needs one, the real API server
of tests/support/cluster.py. Nothing is mocked.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import pytest

from backends.netbox import NetboxBackend, Settings
from backends.netbox.client import ClientSettings
from backends.netbox.spec import CLAIM_UID_FIELD, GLOBAL_NETBOX_POOL, NETBOX_POOL, OWNER_TAG
from backends.protocol import BackendContext
from ipam_provider.controller import Controller
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.resources import ADDRESSES, CLAIMS, SECRETS
from ipam_provider.reconcile import pools
from ipam_provider.reconcile.context import pool_resource
from tests.support.cluster import wait_for
from tests.support.objects import claim, ready_condition

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

NB_POOLS = pool_resource(NETBOX_POOL)
GLOBAL_NB_POOLS = pool_resource(GLOBAL_NETBOX_POOL)
Object = dict[str, Any]


def fast_settings(**overrides: Any) -> Settings:
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
    return Settings(**values)


def backend_factory(settings: Settings | None = None) -> Callable[[BackendContext], NetboxBackend]:
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
    monkeypatch.setattr(pools, "RESYNC", 1.0)


@pytest.fixture
def netbox_controller(controller_factory: Any, namespace: str) -> Callable[..., Any]:
    """`async with netbox_controller() as controller:` runs the controller with only the NetBox backend."""

    @contextlib.asynccontextmanager
    async def run(settings: Settings | None = None, **kwargs: Any) -> AsyncIterator[Controller]:
        async with controller_factory(
            namespaces=[namespace],
            extra_backends=[backend_factory(settings)],
            include_in_cluster=False,
            **kwargs,
        ) as controller:
            yield controller

    return run
