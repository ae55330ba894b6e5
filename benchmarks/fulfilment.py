"""Waiting, as a benchmark does, until claims are fulfilled: one LIST, then a watch, never a poll loop."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.errors import ApiError
from ipam_provider.kube.resources import Resource


async def wait_fulfilled(
    kube: KubeClient,
    claims: Resource,
    namespace: str,
    expected: set[str],
    timeout: float,
    alive: Callable[[], bool] = lambda: True,
) -> int:
    """Wait until every claim of `namespace` in `expected` has status.addressRef, from one LIST and a watch from
    there (a LIST again only when the watch's version is gone); return how many LISTs that took. Raises
    RuntimeError once `alive()` is false (the controller exited) and TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    fulfilled: set[str] = set()
    lists = 0

    def note(obj: dict[str, Any]) -> None:
        if ((obj.get("status") or {}).get("addressRef") or {}).get("name"):
            fulfilled.add(obj["metadata"]["name"])

    version = ""
    while True:
        if not version:
            items, version = await kube.list(claims, namespace, limit=100_000)
            lists += 1
            for item in items:
                note(item)
        while not expected <= fulfilled:
            if not alive():
                raise RuntimeError("the controller exited")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(expected - fulfilled)} of {len(expected)} claims unfulfilled after {timeout} s"
                )
            events = cast(  # an async generator: closed on break, which releases the connection
                AsyncGenerator[tuple[str, dict[str, Any]], None],
                kube.watch(claims, namespace, resource_version=version, timeout_seconds=2),
            )
            try:
                async with contextlib.aclosing(events):
                    async for kind, obj in events:
                        version = obj.get("metadata", {}).get("resourceVersion") or version
                        if kind in ("ADDED", "MODIFIED"):
                            note(obj)
                        if expected <= fulfilled:
                            break
            except ApiError as error:
                if not error.gone:
                    raise
                version = ""
                break
        else:
            return lists
