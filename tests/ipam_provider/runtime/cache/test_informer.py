"""One hostile object never stops an informer: over the real client and HTTP, a list page and watch events holding
objects orjson cannot decode (5,000 levels deep), that the old projection could not project (600 levels), that
cannot be keyed (no name), or whose event is longer than aiohttp's default line (200 KB of annotations) leave every
other object served, and the hostile ones that have a name are cached with their deep parts cut."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from ipam_provider.api.capi import CLAIMS
from ipam_provider.cache import project_claim
from ipam_provider.runtime.cache.informer import Informer
from ipam_provider.runtime.cache.store import Store
from ipam_provider.runtime.kube.bounds import DEEP_MARKER
from ipam_provider.runtime.kube.client import KubeClient

Object = dict[str, Any]
CLAIMS_PATH = "/apis/ipam.cluster.x-k8s.io/v1beta2/ipaddressclaims"


def claim(name: str, version: int, spec: bytes = b'{"poolRef": {"kind": "K", "name": "p"}}', **meta: Any) -> bytes:
    """A claim as JSON text (the deep ones cannot be written by orjson)."""
    metadata = orjson.dumps({"name": name, "namespace": "ns", "resourceVersion": str(version), **meta})
    return b'{"metadata": ' + metadata + b', "spec": ' + spec + b"}"


def deep(depth: int) -> bytes:
    return b'{"poolRef": {"kind": "K", "name": "p"}, "x": ' + b"[" * depth + b"]" * depth + b"}"


LISTED = [
    claim("good-1", 1),
    claim("deep-5000", 2, deep(5_000)),
    claim("deep-600", 3, deep(600)),
    b'{"metadata": {"namespace": "ns", "resourceVersion": "4"}, "spec": {}}',  # no name: cannot be keyed
    claim("good-2", 5),
]
WATCHED = [
    claim("deep-5000-watched", 6, deep(5_000)),
    claim("large", 7, annotations={"note": "x" * 200_000}),
    claim("good-3", 8),
]


@pytest.fixture
async def hostile_server() -> AsyncIterator[str]:
    """An API server that lists LISTED and then watches WATCHED, holding the watch open until the test ends."""
    done = asyncio.Event()

    async def claims(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            page = b'{"kind": "IPAddressClaimList", "metadata": {"resourceVersion": "5"}, "items": ['
            return web.Response(body=page + b",".join(LISTED) + b"]}", content_type="application/json")
        response = web.StreamResponse()
        await response.prepare(request)
        for obj in WATCHED:
            await response.write(b'{"type": "ADDED", "object": ' + obj + b"}\n")
        await done.wait()
        return response

    app = web.Application()
    app.router.add_get(CLAIMS_PATH, claims)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        done.set()
        await runner.cleanup()


async def test_hostile_objects_in_a_list_and_a_watch_leave_the_others_served(hostile_server: str) -> None:
    configuration = client.Configuration(host=hostile_server)
    kube = KubeClient(client.ApiClient(configuration))
    seen: list[str] = []
    store = Store(project_claim)
    informer = Informer(kube, CLAIMS, store, lambda kind, old, new: seen.append((new or old or {})["metadata"]["name"]))
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.wait_synced(), 10)
        for _ in range(200):
            if "good-3" in seen:
                break
            await asyncio.sleep(0.02)
        alive = not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.close()
    assert seen == ["good-1", "deep-5000", "deep-600", "good-2", "deep-5000-watched", "large", "good-3"]
    assert alive, "the informer ran until it was stopped"
    for name in ("deep-5000", "deep-600", "deep-5000-watched"):
        cached = store.get("ns", name)
        assert cached is not None and DEEP_MARKER in orjson.dumps(cached).decode(), name
    large = store.get("ns", "large")
    assert large is not None and len(large["metadata"]["annotations"]["note"]) == 200_000
