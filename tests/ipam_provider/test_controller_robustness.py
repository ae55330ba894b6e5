"""Failures that must not take the controller's machinery down: a raising event handler, and a CancelledError
escaping a reconcile."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from ipam_provider.api.capi import CLAIMS
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.common import Object
from ipam_provider.controller import Controller, ControllerSettings
from ipam_provider.runtime.cache.informer import Informer, in_initial_list
from ipam_provider.runtime.cache.store import Store
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.watch import ClaimKey, QueueKey


def claim_object(name: str, version: str) -> Object:
    return {
        "apiVersion": CLAIMS.api_version,
        "kind": CLAIMS.kind,
        "metadata": {"namespace": "ns", "name": name, "resourceVersion": version},
        "spec": {"poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"}},
    }


class FakeKube:
    """Lists two claims, then a watch that delivers one change and stays open."""

    def __init__(self) -> None:
        self.lists = 0

    async def list_pages(self, resource: Any, namespace: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
        self.lists += 1
        yield [claim_object("bad", "1"), claim_object("good", "2")], "2"

    async def watch(self, resource: Any, namespace: Any = None, **kwargs: Any) -> AsyncIterator[tuple[str, Any]]:
        yield "MODIFIED", claim_object("good", "3")
        await asyncio.Event().wait()


async def test_a_raising_handler_is_skipped_and_never_taken_for_a_connection_failure() -> None:
    kube = FakeKube()
    seen: list[tuple[str, str]] = []
    initial: list[bool] = []

    def handler(kind: str, old: Object | None, new: Object | None) -> None:
        name = (new or old or {})["metadata"]["name"]
        initial.append(in_initial_list())
        if name == "bad":
            raise ValueError("a pydantic ValidationError is a ValueError too")
        seen.append((kind, name))

    store = Store()
    informer = Informer(cast(KubeClient, kube), CLAIMS, store, handler)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.wait_synced(), 2)
        for _ in range(50):
            if ("MODIFIED", "good") in seen:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)  # long enough for a re-list after backoff, had the failure been taken as one
    finally:
        task.cancel()
    assert seen == [("ADDED", "good"), ("MODIFIED", "good")]
    assert initial == [True, True, False], "the first list's objects, then a live change"
    assert not in_initial_list()
    assert kube.lists == 1, "a handler's exception must not make the informer list again"
    assert store.get("ns", "bad") is not None and store.get("ns", "good") is not None


def controller() -> Controller:
    return Controller(cast(KubeClient, object()), BackendRegistry([]), ControllerSettings(workers=1))


async def test_a_worker_survives_a_cancelled_error_from_a_reconcile() -> None:
    ctl = controller()
    handled: list[str] = []

    async def dispatch(key: QueueKey) -> float | None:
        assert isinstance(key, ClaimKey)
        if key.name == "cancelled" and key.name not in handled:
            handled.append(key.name)
            raise asyncio.CancelledError  # e.g. a future cancelled by a thread pool's shutdown
        handled.append(key.name)
        return None

    ctl._dispatch = dispatch  # type: ignore[method-assign]
    ctl.queue.add(ClaimKey("ns", "cancelled"), "shard-a")
    ctl.queue.add(ClaimKey("ns", "next"), "shard-b")
    worker = asyncio.create_task(ctl._worker())
    for _ in range(100):
        if handled.count("cancelled") == 2 and "next" in handled:
            break
        await asyncio.sleep(0.02)
    assert not worker.done(), "the worker must survive a CancelledError it did not ask for"
    assert "next" in handled and handled.count("cancelled") == 2, "the failed key is retried"
    ctl.queue.shutdown()
    await asyncio.wait_for(worker, 2)


async def test_a_worker_still_stops_when_it_is_cancelled_itself() -> None:
    ctl = controller()
    started = asyncio.Event()

    async def dispatch(key: QueueKey) -> float | None:
        started.set()
        await asyncio.Event().wait()
        return None

    ctl._dispatch = dispatch  # type: ignore[method-assign]
    ctl.queue.add(ClaimKey("ns", "slow"), "shard-a")
    worker = asyncio.create_task(ctl._worker())
    await asyncio.wait_for(started.wait(), 2)
    worker.cancel()
    done, _ = await asyncio.wait({worker}, timeout=2)
    assert worker in done and worker.cancelled()


async def test_a_relist_keeps_what_this_controller_wrote_after_the_lists_snapshot() -> None:
    """A list at resourceVersion 5 cannot show an object written at 9 (our own write, cached): it is not gone.
    One cached at 4 that the list lacks was deleted."""
    kube = FakeKube()
    store = Store()
    store.upsert(claim_object("ours", "9"))
    store.upsert(claim_object("deleted", "4"))
    deleted: list[str] = []

    def handler(kind: str, old: Object | None, new: Object | None) -> None:
        if kind == "DELETED":
            deleted.append((old or {})["metadata"]["name"])

    async def list_at_5(resource: Any, namespace: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
        yield [claim_object("good", "2")], "5"

    kube.list_pages = list_at_5  # type: ignore[method-assign]
    informer = Informer(cast(KubeClient, kube), CLAIMS, store, handler)
    await informer._relist("ns")
    assert deleted == ["deleted"]
    assert store.get("ns", "ours") is not None and store.get("ns", "deleted") is None
