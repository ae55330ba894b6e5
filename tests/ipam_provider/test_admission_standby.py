"""Admission in a standby replica, and forged reviews, on the real API server (docs/admission.md).

Every replica runs the IPAddress and pool caches that admission reads (`Controller.start_caches`), so a standby
answers a cluster-scoped pool's review from them, sending no request; and a review's requester is not known, so a
forged review learns no IPAddress, claim or address that its own spec did not hold.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends.incluster import create_backend
from backends.incluster.backend import GLOBAL_IN_CLUSTER_POOL, IN_CLUSTER_POOL
from backends.incluster.prefix_backend import create_backend as create_prefix_backend
from ipam_provider.admission import PoolAdmission
from ipam_provider.api.capi import ADDRESSES
from ipam_provider.backend.contract import BackendContext, PoolKind
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.cache import Caches
from ipam_provider.common import Object
from ipam_provider.controller import Controller, ControllerSettings
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.serving.webhook import Verdict, parse_review
from tests.support.cluster import wait_for
from tests.support.objects import GLOBAL_POOLS, POOLS, global_pool, pool

pytestmark = pytest.mark.apiserver


class CountingKube(KubeClient):
    """A real client that records every request it sends (method, path)."""

    sent: list[tuple[str, str]]

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.sent.append((method, path))
        return await super()._request(method, path, **kwargs)


@contextlib.asynccontextmanager
async def standby(kubeconfig: Path) -> AsyncIterator[tuple[Controller, PoolAdmission, CountingKube]]:
    """A replica as cli.py wires it that has not won the lease: its caches started and synced, `run()` not called."""
    kube = await CountingKube.from_kubeconfig(str(kubeconfig))
    assert isinstance(kube, CountingKube)
    kube.sent = []
    caches = Caches()
    context = BackendContext(kube=kube, cached_addresses=caches.cached_addresses, cached_pools=caches.cached_pools)
    registry = BackendRegistry(factory(context) for factory in (create_backend, create_prefix_backend))
    settings = ControllerSettings(repair=RepairSettings(interval=0))  # no pass queues pools
    controller = Controller(kube, registry, settings, caches)
    controller.start_caches()
    admission = PoolAdmission(kube, registry, caches.cached_addresses, caches.cached_pools, caches.admission_synced)
    try:
        await wait_for(lambda: _true(caches.admission_synced()), message="the standby's caches to sync")
        yield controller, admission, kube
    finally:
        await controller.close_caches()
        await registry.close()
        await kube.close()


async def _true(value: bool) -> bool | None:
    return True if value else None


def ip_address(name: str, address: str, kind: PoolKind, pool_name: str) -> Object:
    spec = {
        "address": address,
        "prefix": 24,
        "poolRef": {"apiGroup": kind.group, "kind": kind.kind, "name": pool_name},
        "claimRef": {"name": f"{name}-claim"},
    }
    return {"apiVersion": ADDRESSES.api_version, "kind": ADDRESSES.kind, "metadata": {"name": name}, "spec": spec}


def review(kind: PoolKind, operation: str, namespace: str | None, new: Object | None, old: Object | None) -> Object:
    request: Object = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "resource": {"group": kind.group, "version": kind.version, "resource": kind.plural},
        "name": (new or old or {})["metadata"]["name"],
        "operation": operation,
        "object": new,
        "oldObject": old,
    }
    if namespace is not None:
        request["namespace"] = namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


async def cached(controller: Controller, namespace: str, name: str) -> bool | None:
    return True if controller.caches.addresses.get(namespace, name) is not None else None


async def test_a_standby_answers_a_global_pools_reviews_from_its_caches(
    kube: KubeClient, kubeconfig: Path, namespace: str
) -> None:
    name = f"g-{namespace}"
    created = await kube.create(GLOBAL_POOLS, global_pool(name, ["10.98.0.10-10.98.0.20"], 24))
    try:
        await kube.create(ADDRESSES, ip_address("m1", "10.98.0.10", GLOBAL_IN_CLUSTER_POOL, name), namespace)
        async with standby(kubeconfig) as (controller, admission, counted):
            await wait_for(lambda: cached(controller, namespace, "m1"), message="the IPAddress to be cached")
            before = len(counted.sent)
            shrunk = {**created, "spec": {**created["spec"], "addresses": ["10.98.0.15-10.98.0.20"]}}
            update = review(GLOBAL_IN_CLUSTER_POOL, "UPDATE", None, shrunk, created)
            verdict: Verdict = await admission.decide(parse_review(update), GLOBAL_IN_CLUSTER_POOL)
            assert (verdict.allowed, verdict.code) == (False, 422), verdict
            assert "leaves out 1 address(es) in use" in verdict.message, verdict.message
            delete = review(GLOBAL_IN_CLUSTER_POOL, "DELETE", None, None, created)
            verdict = await admission.decide(parse_review(delete), GLOBAL_IN_CLUSTER_POOL)
            assert (verdict.allowed, verdict.code) == (False, 403), verdict
            assert "1 IPAddress(es) name the pool" in verdict.message, verdict.message
            assert counted.sent[before:] == [], "a standby answers from its caches, sending no request"

            # Leading, it replays what its caches hold to the handlers: the pool is reported without a new event.
            task = asyncio.create_task(controller.run())
            try:

                async def reported() -> Object | None:
                    found = await kube.get(GLOBAL_POOLS, name)
                    return found if ((found or {}).get("status") or {}).get("conditions") else None

                await wait_for(reported, message="the leader to report the pool it cached as a standby")
            finally:
                controller.stop()
                await asyncio.wait_for(task, 30)
    finally:
        await kube.delete(GLOBAL_POOLS, name)


async def test_a_forged_update_review_learns_no_name_and_no_address(
    kube: KubeClient, kubeconfig: Path, namespace: str
) -> None:
    """Another namespace's pool holds 10.97.0.13 for a claim; a review posted straight to the webhook (old spec: the
    whole /16, new: one address; then the held address pre-allocated) learns nothing of the address in use unless
    its old object has the stored pool's uid and resourceVersion (which only a reader of the pool knows); then it is
    refused without naming the holder or any address in use that the forged spec did not contain."""
    victim = await kube.create(POOLS, pool("private", ["10.97.0.10-10.97.0.20"], 24), namespace)
    await kube.create(ADDRESSES, ip_address("secret-m1", "10.97.0.13", IN_CLUSTER_POOL, "private"), namespace)
    async with standby(kubeconfig) as (controller, admission, _):
        await wait_for(lambda: cached(controller, namespace, "secret-m1"), message="the IPAddress to be cached")
        meta = victim["metadata"]
        wide = {**victim, "metadata": meta, "spec": {"addresses": ["10.97.0.1-10.97.255.254"], "prefix": 16}}
        narrow = {**victim, "metadata": meta, "spec": {"addresses": ["10.97.255.1"], "prefix": 16}}
        probe = {**wide, "spec": {**wide["spec"], "preAllocations": {"probe": "10.97.0.13"}}}
        for guessed in ({"uid": "00000000-0000-0000-0000-000000000000"}, {"resourceVersion": "1"}):
            unknown = {**wide, "metadata": {**meta, **guessed}}
            for new in (narrow, probe):
                forged = review(IN_CLUSTER_POOL, "UPDATE", namespace, new, unknown)
                verdict = await admission.decide(parse_review(forged), IN_CLUSTER_POOL)
                assert verdict.allowed and not verdict.warnings, (guessed, verdict)
        for new, said in ((narrow, "leaves out 1 address(es) in use"), (probe, "10.97.0.13 is already held by")):
            forged = review(IN_CLUSTER_POOL, "UPDATE", namespace, new, wide)
            verdict = await admission.decide(parse_review(forged), IN_CLUSTER_POOL)
            assert not verdict.allowed
            for secret in ("secret-m1", "secret-m1-claim", f"{namespace}/secret"):
                assert secret not in verdict.message, verdict.message
            if new is narrow:
                assert "10.97.0.13" not in verdict.message, verdict.message
            assert said in verdict.message, verdict.message
