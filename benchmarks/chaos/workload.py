"""The claims the chaos runner creates and deletes, and the owner-reference garbage collection it stands in for.

`Workload.run()` performs `operations` operations at a steady pace: it creates IPAddressClaims spread over the
pools and deletes some of them (an ordinary delete: the controller's finalizer makes it release first), keeping
the population of live claims near `population`. Each operation is retried until the API server takes it (it may
be restarting). `force_delete()` takes a live claim away without its release: the finalizers are stripped before
or after the delete, as `kubectl patch` + `kubectl delete` would.

The runner's control plane has no kube-controller-manager, so no garbage collector deletes an IPAddress whose
owning claim is gone. `collect_garbage()` does that one job as the garbage collector would (owner absent, checked
by a fresh GET, then a delete with a uid precondition), since a force-deleted claim's IPAddress would otherwise
live on and count as a use of the address forever.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import structlog

from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError

log = structlog.get_logger(__name__)
T = TypeVar("T")
LABEL = "chaos.ipam.example/run"
RETRY_FOR = 300.0
TRANSIENT = (aiohttp.ClientError, OSError, TimeoutError)


@dataclass(frozen=True)
class PoolTarget:
    """A pool claims may name: its reference's fields and its `Kind/namespace/name` (or `Kind/name`) form."""

    api_group: str
    kind: str
    name: str
    ref: str


async def retried(call: Callable[[], Awaitable[T]], what: str, timeout: float = RETRY_FOR) -> T:
    """`call()`, retried on connection errors and 5xx/429 answers (the API server or etcd restarting) for up to
    `timeout` seconds; any other ApiError is raised at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except ApiError as error:
            if error.status < 500 and error.status != 429:
                raise
            failure: Exception = error
        except TRANSIENT as error:
            failure = error
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: still failing after {timeout:.0f} s: {failure}") from failure
        await asyncio.sleep(0.5)


class Workload:
    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        pools: Sequence[PoolTarget],
        rng: random.Random,
        *,
        operations: int,
        rate: float,
        population: int,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pools = list(pools)
        self.rng = rng
        self.operations = operations
        self.rate = rate
        self.population = population
        self.live: dict[str, str] = {}  # claim name -> uid, for claims created and not deleted by the runner
        self.created = 0
        self.deleted = 0
        self.force_deleted = 0
        self.collected = 0
        self._serial = 0

    @property
    def done(self) -> int:
        return self.created + self.deleted

    async def run(self) -> None:
        period = 1.0 / self.rate
        while self.done < self.operations:
            started = time.monotonic()
            low, high = self.population * 0.8, self.population * 1.2
            if not self.live or len(self.live) < low or (len(self.live) <= high and self.rng.random() < 0.5):
                await self._create()
            else:
                await self._delete(self.rng.choice(sorted(self.live)))
            await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))

    async def _create(self) -> None:
        self._serial += 1
        name = f"c-{self._serial:05d}"
        pool = self.pools[self._serial % len(self.pools)]
        body = {
            "apiVersion": CLAIMS.api_version,
            "kind": CLAIMS.kind,
            "metadata": {"name": name, "labels": {LABEL: "1"}},
            "spec": {"poolRef": {"apiGroup": pool.api_group, "kind": pool.kind, "name": pool.name}},
        }

        async def create() -> dict[str, Any]:
            try:
                return await self.kube.create(CLAIMS, body, self.namespace)
            except ApiError as error:
                if not error.already_exists:  # a retry of a create the server did take
                    raise
                found = await self.kube.get(CLAIMS, name, self.namespace)
                if found is None:
                    raise
                return found

        created = await retried(create, f"create claim {name}")
        self.live[name] = created["metadata"]["uid"]
        self.created += 1

    async def _delete(self, name: str) -> None:
        uid = self.live.pop(name)
        await retried(lambda: self.kube.delete(CLAIMS, name, self.namespace, uid=uid), f"delete claim {name}")
        self.deleted += 1

    async def force_delete(self) -> str:
        """Take one live claim away without its release; answers its name ("" if there is none)."""
        if not self.live:
            return ""
        name = self.rng.choice(sorted(self.live))
        uid = self.live.pop(name)
        strip: dict[str, Any] = {"metadata": {"finalizers": None}}
        strip_first = self.rng.random() < 0.5
        for _ in range(5):
            if strip_first:
                await self._patch_if_present(name, strip)
            await retried(lambda: self.kube.delete(CLAIMS, name, self.namespace, uid=uid), f"delete {name}")
            await self._patch_if_present(name, strip)
            current = await retried(lambda: self.kube.get(CLAIMS, name, self.namespace), f"get {name}")
            if current is None or current["metadata"]["uid"] != uid:
                break
        self.force_deleted += 1
        return name

    async def _patch_if_present(self, name: str, patch: dict[str, Any]) -> None:
        async def call() -> None:
            try:
                await self.kube.patch(CLAIMS, name, patch, self.namespace)
            except ApiError as error:
                if not error.not_found:
                    raise

        await retried(call, f"strip the finalizers of {name}")

    async def collect_garbage(self) -> int:
        """Delete the IPAddresses whose owning claim is gone; answers how many were deleted."""
        addresses, _ = await self.kube.list(ADDRESSES, self.namespace)
        claims, _ = await self.kube.list(CLAIMS, self.namespace)
        live = {claim["metadata"]["uid"] for claim in claims}
        deleted = 0
        for address in addresses:
            owners = [o for o in address["metadata"].get("ownerReferences") or [] if o.get("kind") == CLAIMS.kind]
            if not owners or any(owner["uid"] in live for owner in owners):
                continue
            owner = owners[0]
            current = await self.kube.get(CLAIMS, owner["name"], self.namespace)
            if current is not None and current["metadata"]["uid"] == owner["uid"]:
                continue
            meta = address["metadata"]
            try:
                if await self.kube.delete(ADDRESSES, meta["name"], self.namespace, uid=meta["uid"]):
                    deleted += 1
            except ApiError as error:
                if not error.conflict:
                    raise
        self.collected += deleted
        return deleted

    async def garbage_collector(self, period: float = 2.0) -> None:
        """`collect_garbage()` every `period` seconds until cancelled; failures (a restarting API server) are
        retried on the next round."""
        while True:
            try:
                await self.collect_garbage()
            except (ApiError, *TRANSIENT) as error:
                log.debug("garbage collection round failed", error=str(error))
            await asyncio.sleep(period)
