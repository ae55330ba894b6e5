"""Waiting, as a benchmark does, until claims are fulfilled (or any objects reach a state): one LIST, then a
watch, never a poll loop."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource

Object = dict[str, Any]


def has_address(claim: Object | None) -> bool:
    """The claim exists and has status.addressRef."""
    status = (claim or {}).get("status") or {}
    return bool((status.get("addressRef") or {}).get("name"))


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
    return await wait_until(kube, claims, namespace, expected, has_address, timeout, alive, "claims unfulfilled")


async def wait_until(
    kube: KubeClient,
    resource: Resource,
    namespace: str,
    expected: set[str],
    done: Callable[[Object | None], bool],
    timeout: float,
    alive: Callable[[], bool] = lambda: True,
    what: str = "objects not there yet",
    resource_version: str = "",
) -> int:
    """Wait until `done(obj)` holds for every object of `resource` in `namespace` named in `expected` (`done(None)`
    for one that does not exist, or was deleted), from one LIST and a watch from there (a LIST again only when the
    watch's version is gone); return how many LISTs that took. With `resource_version`, the watch starts there and
    no LIST comes first: only the changes from that version on count. Raises RuntimeError once `alive()` is false
    and TimeoutError after `timeout` seconds (its message: how many of `expected` are `what`)."""
    deadline = time.monotonic() + timeout
    met: set[str] = set()
    lists = 0

    def note(name: str, obj: Object | None) -> None:
        if name in expected:
            (met.add if done(obj) else met.discard)(name)

    version = resource_version
    while True:
        if not version:
            items, version = await kube.list(resource, namespace, limit=100_000)
            lists += 1
            present = {item["metadata"]["name"]: item for item in items}
            for name in expected:
                note(name, present.get(name))
        while not expected <= met:
            if not alive():
                raise RuntimeError("the controller exited")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(expected - met)} of {len(expected)} {what} after {timeout:.0f} s")
            try:
                version = await _watch_once(kube, resource, namespace, version, note, lambda: expected <= met)
            except ApiError as error:
                if not error.gone:
                    raise
                version = ""
                break
        else:
            return lists


async def _watch_once(
    kube: KubeClient,
    resource: Resource,
    namespace: str,
    version: str,
    note: Callable[[str, Object | None], None],
    finished: Callable[[], bool],
) -> str:
    """One watch request from `version` (at most 2 s), each event passed to `note` (None for a deletion), until
    `finished()`; returns the last resourceVersion seen."""
    events = cast(  # an async generator: closed on break, which releases the connection
        AsyncGenerator[tuple[str, Object], None],
        kube.watch(resource, namespace, resource_version=version, timeout_seconds=2),
    )
    async with contextlib.aclosing(events):
        async for kind, obj in events:
            version = obj.get("metadata", {}).get("resourceVersion") or version
            name = obj.get("metadata", {}).get("name")
            if kind in ("ADDED", "MODIFIED", "DELETED") and name:
                note(name, None if kind == "DELETED" else obj)
            if finished():
                break
    return version


async def current_version(kube: KubeClient, resource: Resource, namespace: str) -> str:
    """The resourceVersion to watch `resource` from, from a LIST that selects nothing."""
    _, version = await kube.list(resource, namespace, label_selector="benchmark.ipam.example/none=none")
    return version
