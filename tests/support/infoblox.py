"""Shared wiring of the Infoblox backend tests: a simulated grid, an InfobloxInstance with its Secret, pools, and
the controller running the Infoblox backend (with short timers) against the session's real API server."""

from __future__ import annotations

import base64
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.client import RetryPolicy
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import INFOBLOX_POOL, INSTANCES
from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.backend.contract import BackendContext
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from ipam_provider.controller import Controller
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import claim, ready_condition
from tools.wapi_simulator import WapiSimulator

POOLS = pool_resource(INFOBLOX_POOL)
KIND = INFOBLOX_POOL.kind
FAST = InfobloxSettings(
    instance_cache_seconds=0.5,
    unhealthy_recheck_seconds=0.5,
    not_ready_retry_seconds=1.0,
    retry=RetryPolicy(attempts=4, base_delay=0.05, max_delay=0.4),
)
Object = dict[str, Any]


def fast_backend(context: BackendContext) -> InfobloxBackend:
    return InfobloxBackend(context, FAST)


def b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


@dataclass
class Grid:
    """A simulated grid plus the InfobloxInstance and Secret that point at it."""

    sim: WapiSimulator
    kube: KubeClient
    namespace: str
    instance: str
    secret: str

    async def set_password(self, password: str) -> None:
        await self.kube.patch(SECRETS, self.secret, {"data": {"password": b64(password)}}, self.namespace)

    async def patch_instance(self, spec: Object) -> None:
        await self.kube.patch(INSTANCES, self.instance, {"spec": spec})

    async def create_pool(self, name: str, **spec: Any) -> Object:
        body = {
            "apiVersion": POOLS.api_version,
            "kind": KIND,
            "metadata": {"name": name},
            "spec": {"instanceRef": {"name": self.instance}, **spec},
        }
        return await self.kube.create(POOLS, body, self.namespace)

    async def create_claim(self, name: str, pool: str, **kwargs: Any) -> Object:
        return await self.kube.create(CLAIMS, claim(name, pool, kind=KIND, **kwargs), self.namespace)

    def objects_of(self, claim_uid: str, obj_type: str = "fixedaddress") -> list[Object]:
        return [o for o in self.sim.state.objects(obj_type) if _ea(o, "CAPI-Claim-UID") == claim_uid]


def _ea(obj: Object, name: str) -> Any:
    return ((obj.get("extattrs") or {}).get(name) or {}).get("value")


@pytest_asyncio.fixture
async def grid_factory(
    kube: KubeClient, namespace: str, wapi_simulator_factory: Callable[..., WapiSimulator]
) -> AsyncIterator[Callable[..., Any]]:
    """make(password=..., ca=..., **instance spec) -> Grid; instances are deleted at teardown. The test's namespace
    lends its Secrets to cluster-scoped objects (it holds the instance's Secret), and the instance allows it
    (`allowedNamespaces`, unless `spec` says otherwise)."""
    created: list[str] = []
    await lend_secrets(kube, namespace)

    async def make(password: str | None = None, ca: str | None = "sim", **spec: Any) -> Grid:
        sim = wapi_simulator_factory()
        name = f"grid-{secrets.token_hex(4)}"
        secret = {"metadata": {"name": name}, "type": "kubernetes.io/basic-auth"}
        secret["data"] = {"username": b64(sim.username), "password": b64(password or sim.password)}
        await kube.create(SECRETS, secret, namespace)
        body: Object = {
            "host": sim.host,
            "port": sim.port,
            "wapiVersion": sim.wapi_version,
            "credentialsSecretRef": {"name": name, "namespace": namespace},
            "allowedNamespaces": {"list": [namespace]},
        }
        if ca == "sim":
            assert sim.ca_path is not None
            body["caBundle"] = sim.ca_path.read_text()
        elif ca is not None:
            body["caBundle"] = ca
        body.update(spec)
        manifest = {"apiVersion": INSTANCES.api_version, "kind": INSTANCES.kind, "metadata": {"name": name}}
        await kube.create(INSTANCES, {**manifest, "spec": body})
        created.append(name)
        return Grid(sim, kube, namespace, name, name)

    yield make
    for name in created:
        await kube.delete(INSTANCES, name)


async def lend_secrets(kube: KubeClient, namespace: str) -> None:
    """Label `namespace` so that InfobloxInstances may read its Secrets (tenancy.SECRET_REFS_LABEL)."""
    await kube.patch(NAMESPACES, namespace, {"metadata": {"labels": {SECRET_REFS_LABEL: "true"}}})


@pytest_asyncio.fixture
async def grid(grid_factory: Callable[..., Any]) -> Grid:
    """A TLS simulator (its CA in the instance's caBundle) with network 10.10.0.0/24 in the default view."""
    made: Grid = await grid_factory()
    made.sim.state.add_network("10.10.0.0/24")
    return made


@pytest.fixture
def infoblox_controller(
    controller_factory: ControllerFactory, namespace: str
) -> Callable[..., contextlib.AbstractAsyncContextManager[Controller]]:
    def start(**settings: Any) -> contextlib.AbstractAsyncContextManager[Controller]:
        return controller_factory(
            namespaces=[namespace], extra_backends=[fast_backend], include_in_cluster=False, **settings
        )

    return start


async def wait_pool_reason(kube: KubeClient, namespace: str, name: str, reason: str, timeout: float = 30) -> Object:
    async def probe() -> Object | None:
        pool = await kube.get(POOLS, name, namespace)
        condition = ready_condition(pool)
        return pool if condition is not None and condition.get("reason") == reason else None

    return await wait_for(probe, timeout=timeout, message=f"pool {namespace}/{name} to have Ready reason {reason}")


async def wait_instance_reason(kube: KubeClient, name: str, reason: str, timeout: float = 30) -> Object:
    async def probe() -> Object | None:
        instance = await kube.get(INSTANCES, name)
        condition = ready_condition(instance)
        return instance if condition is not None and condition.get("reason") == reason else None

    return await wait_for(probe, timeout=timeout, message=f"InfobloxInstance {name} to have Ready reason {reason}")


async def wait_gone(kube: KubeClient, namespace: str, name: str, timeout: float = 30) -> None:
    async def gone() -> bool:
        return await kube.get(CLAIMS, name, namespace) is None and await kube.get(ADDRESSES, name, namespace) is None

    await wait_for(gone, timeout=timeout, message=f"claim {namespace}/{name} and its IPAddress to be gone")
