"""pytest plugin: the controller, run in-process against the session's real API server.

`run_controller(**settings)` (an async context manager, from the `controller_factory` fixture) starts a
controller with the in-cluster backends (address and prefix pools) plus any extra backends, waits until its caches
are synced, and stops it cleanly afterwards; `**settings` are `ControllerSettings` fields (for example
`repair=RepairSettings(interval=1.0, grace_period=2.0)` runs the repair loop at a test's pace, `interval=0` turns
it off); `cluster_identity` is the management cluster identity handed to the backends (as `--cluster-identity`;
"" by default). `in_process_controller` is the common case: one controller for one test's namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest_asyncio

from backends.incluster import create_backend
from backends.incluster.prefix_backend import create_backend as create_prefix_backend
from ipam_provider.backend.contract import BackendContext
from ipam_provider.backend.protocol import Backend
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.cache import Caches
from ipam_provider.controller import Controller, ControllerSettings
from ipam_provider.runtime.kube.client import KubeClient
from tools.controller_command import controller_command as controller_command  # re-exported for the tests

ControllerFactory = Callable[..., contextlib.AbstractAsyncContextManager[Controller]]


@contextlib.asynccontextmanager
async def run_controller(
    kubeconfig: Path,
    *,
    namespaces: Sequence[str] = (),
    extra_backends: Sequence[Callable[[BackendContext], Backend]] = (),
    include_in_cluster: bool = True,
    cluster_identity: str = "",
    **settings: Any,
) -> AsyncIterator[Controller]:
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    caches = Caches()
    context = BackendContext(
        kube=kube,
        cached_addresses=caches.cached_addresses,
        cached_pools=caches.cached_pools,
        cluster_identity=cluster_identity,
    )
    factories = ([create_backend, create_prefix_backend] if include_in_cluster else []) + list(extra_backends)
    registry = BackendRegistry(factory(context) for factory in factories)
    controller = Controller(kube, registry, ControllerSettings(namespaces=list(namespaces), **settings), caches)
    ready = asyncio.Event()
    task = asyncio.create_task(controller.run(ready))
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({task, waiter}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        await task  # raises what went wrong
    if waiter not in done:
        task.cancel()
        raise TimeoutError("controller caches did not sync within 30 s")
    try:
        yield controller
    finally:
        controller.stop()
        await asyncio.wait_for(task, 30)
        await registry.close()
        await kube.close()


@pytest_asyncio.fixture
async def controller_factory(kubeconfig: Path) -> ControllerFactory:
    def factory(**kwargs: Any) -> contextlib.AbstractAsyncContextManager[Controller]:
        return run_controller(kubeconfig, **kwargs)

    return factory


@pytest_asyncio.fixture
async def in_process_controller(kubeconfig: Path, namespace: str) -> AsyncIterator[Controller]:
    async with run_controller(kubeconfig, namespaces=[namespace]) as controller:
        yield controller
