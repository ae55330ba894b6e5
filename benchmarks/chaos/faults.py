"""The faults the chaos runner injects, and the seeded schedule that spreads them over a run.

Kubernetes-side kinds (every backend):
- `controller-sigkill`: SIGKILL every controller replica at once; the supervisor starts them again.
- `leader-sigkill`: SIGKILL the replica holding the leader lease; a standby takes over once the lease expires.
- `apiserver-restart`: stop kube-apiserver (SIGTERM, or SIGKILL half the time) and start it again.
- `etcd-restart`: stop etcd (SIGTERM, or SIGKILL half the time) and start it again on the same data.
- `watch-expiry`: compact etcd up to its current revision (its v3 HTTP gateway, `/v3/kv/compaction`), then end
  every controller watch cleanly at the relay (as a watch timeout does); the API server runs without a watch
  cache, so each watch resumed from a resourceVersion older than the compaction is answered 410 Gone. Counted
  only once a controller's resumed watch was seen answered 410 through the relay.
- `force-delete`: a live claim goes without its release (finalizers stripped).
- `delete-behind-back`: the backend deletes one of our allocations directly (`ChaosBackend.delete_behind_back`).
The backend's own kinds (`ChaosBackend.fault_kinds`) go to `ChaosBackend.inject`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from benchmarks.chaos.backends import ChaosBackend
from benchmarks.chaos.controllers import Replicas
from benchmarks.chaos.link import Link
from benchmarks.chaos.workload import Workload, retried
from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource
from tools.controlplane.cluster import LocalControlPlane

log = structlog.get_logger(__name__)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)
HEAVY = ("controller-sigkill", "leader-sigkill", "apiserver-restart", "etcd-restart", "watch-expiry")
LIGHT = ("force-delete", "delete-behind-back")
EXPIRY_WAIT = 60.0  # for a controller's resumed watch to be answered 410 through the relay
RETRY_LATER = 20  # a fault that found nothing to act on goes back in the schedule at most this many times


def fault_plan(backend_kinds: tuple[str, ...], operations: int, rng: random.Random) -> list[str]:
    """Every kind at least once: a Kubernetes-side restart or expiry once per 400 operations, a force-delete, a
    deletion behind our back and a backend fault once per 100; shuffled with the run's seed."""
    heavy, light = max(1, operations // 400), max(1, operations // 100)
    plan = [kind for kind in HEAVY for _ in range(heavy)]
    plan += [kind for kind in (*LIGHT, *backend_kinds) for _ in range(light)]
    rng.shuffle(plan)
    return plan


@dataclass
class Injector:
    plane: LocalControlPlane
    link: Link
    replicas: Replicas
    workload: Workload
    backend: ChaosBackend
    kube: KubeClient  # admin, straight to the API server
    namespace: str
    rng: random.Random
    injected: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    async def run(self, plan: list[str], duration: float) -> None:
        """Inject `plan` in order, at random moments spread over about `duration` seconds."""
        pending = list(plan)
        retries: Counter[str] = Counter()
        gap = duration / (len(pending) + 1)
        while pending:
            await asyncio.sleep(self.rng.uniform(0.5, 1.5) * gap)
            kind = pending.pop(0)
            started = time.monotonic()
            done = await self.inject(kind)
            log.info("fault", kind=kind, injected=done, seconds=round(time.monotonic() - started, 1))
            if done:
                self.injected[kind] += 1
            elif retries[kind] < RETRY_LATER:
                retries[kind] += 1
                pending.append(kind)

    async def inject(self, kind: str) -> bool:
        """Inject one fault of `kind`; False when it found nothing to act on (or did not take effect)."""
        actions: dict[str, Callable[[], Awaitable[bool]]] = {
            "controller-sigkill": self._controller_sigkill,
            "leader-sigkill": self._leader_sigkill,
            "apiserver-restart": self._apiserver_restart,
            "etcd-restart": self._etcd_restart,
            "watch-expiry": self._watch_expiry,
            "force-delete": self._force_delete,
            "delete-behind-back": self._delete_behind_back,
        }
        action = actions.get(kind)
        if action is not None:
            return await action()
        return await self._backend_fault(kind)

    async def _backend_fault(self, kind: str) -> bool:
        """One of the backend's own faults. A backend that tallies the faults that met a request (a `fired`
        counter by kind) is asked whether this one did: a fault no request met is tried again later, not counted."""
        fired = getattr(self.backend, "fired", None)
        before = fired[kind] if isinstance(fired, Counter) else None
        await self.backend.inject(kind, self.rng)
        return before is None or bool(fired[kind] > before)  # type: ignore[index]

    async def _controller_sigkill(self) -> bool:
        self.replicas.kill_all()
        return True

    async def _leader_sigkill(self) -> bool:
        return await self.replicas.kill_leader(self.kube, timeout=60)

    async def _apiserver_restart(self) -> bool:
        await asyncio.to_thread(self.plane.restart_apiserver, kill=self.rng.random() < 0.5)
        return True

    async def _etcd_restart(self) -> bool:
        await asyncio.to_thread(self.plane.restart_etcd, kill=self.rng.random() < 0.5)
        return True

    async def _force_delete(self) -> bool:
        return bool(await self.workload.force_delete())

    async def _delete_behind_back(self) -> bool:
        what = await self.backend.delete_behind_back(self.rng)
        if what:
            self.notes.append(f"deleted behind our back: {what}")
        return bool(what)

    async def _watch_expiry(self) -> bool:
        """Compact etcd past every revision the controllers have seen, then cut their connections."""
        before = await retried(self._claims_version, "list claims")
        for _ in range(2):  # two writes: the compaction then lies strictly past `before` + 1
            await retried(self._upsert_marker, "write the compaction marker")
        status = await asyncio.to_thread(self._etcd, "/v3/maintenance/status", {})
        current = int(status["header"]["revision"])
        await asyncio.to_thread(self._etcd, "/v3/kv/compaction", {"revision": current, "physical": True})
        if not await self._watch_is_gone(before):
            return False
        seen = self.link.expired
        self.link.expiry_seen.clear()
        ended = self.link.end_watches()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.link.expiry_seen.wait(), EXPIRY_WAIT)
        log.info("watch expiry", compacted_to=current, watches_ended=ended, answered_410=self.link.expired - seen)
        return self.link.expired > seen

    async def _claims_version(self) -> str:
        _, version = await self.kube.list(CLAIMS, self.namespace, limit=1)
        return version

    async def _upsert_marker(self) -> None:
        body = {"metadata": {"name": "chaos-compaction-marker"}, "data": {"at": str(time.time())}}
        try:
            await self.kube.create(CONFIGMAPS, body, self.namespace)
        except ApiError as error:
            if not error.already_exists:
                raise
            await self.kube.patch(CONFIGMAPS, "chaos-compaction-marker", {"data": body["data"]}, self.namespace)

    async def _watch_is_gone(self, version: str) -> bool:
        """Whether a watch of the claims from `version` is now refused with 410 Gone."""
        try:
            async for _ in self.kube.watch(CLAIMS, self.namespace, resource_version=version, timeout_seconds=2):
                pass
        except ApiError as error:
            return error.gone
        return False

    def _etcd(self, path: str, body: dict[str, object]) -> dict[str, Any]:
        assert self.plane.state is not None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.plane.state.etcd_port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
