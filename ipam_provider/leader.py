"""Leader election on a coordination.k8s.io Lease, as controller-runtime's --leader-elect does.

`acquire()` returns once this process holds the lease; `keep()` renews it and returns (so the caller can stop)
when it could not renew within the renew deadline (two thirds of the lease), before anyone else may take over.
Updates carry the lease's resourceVersion, so two candidates cannot both win. As in client-go, a lease counts as
expired when its record has not changed for a whole lease duration *by this process's own clock*, so clock skew
between nodes does not matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import uuid

import structlog

from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.errors import ApiError
from ipam_provider.kube.resources import LEASES

log = structlog.get_logger(__name__)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _format(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        *,
        lease_seconds: int = 15,
        retry_seconds: float = 2.0,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.lease_seconds = lease_seconds
        self.retry_seconds = retry_seconds
        self.identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self._observed: tuple[object, float] | None = None  # (the lease record, local monotonic time first seen)

    async def _try(self) -> bool:
        lease = await self.kube.get(LEASES, self.name, self.namespace)
        now = _now()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_seconds,
            "renewTime": _format(now),
        }
        if lease is None:
            body = {
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": _format(now), "leaseTransitions": 0},
            }
            try:
                await self.kube.create(LEASES, body, self.namespace)
                return True
            except ApiError as error:
                if error.already_exists:
                    return False
                raise
        current = lease.get("spec") or {}
        holder = current.get("holderIdentity")
        duration = int(current.get("leaseDurationSeconds") or self.lease_seconds)
        record = (holder, current.get("renewTime"))
        monotonic = asyncio.get_running_loop().time()
        if self._observed is None or self._observed[0] != record:
            self._observed = (record, monotonic)
        expired = not current.get("renewTime") or monotonic - self._observed[1] > duration
        if holder not in (None, "", self.identity) and not expired:
            return False
        if holder != self.identity:
            spec["acquireTime"] = _format(now)
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        patch = {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]}, "spec": spec}
        try:
            await self.kube.patch(LEASES, self.name, patch, self.namespace)
        except ApiError as error:
            if error.conflict:
                return False
            raise
        return True

    async def acquire(self) -> None:
        log.info("waiting for leadership", lease=f"{self.namespace}/{self.name}", identity=self.identity)
        while True:
            try:
                if await self._try():
                    log.info("became leader", identity=self.identity)
                    return
            except ApiError as error:
                log.warning("leader election failed", error=error.message)
            await asyncio.sleep(self.retry_seconds)

    async def keep(self) -> None:
        """Renew every third of the lease; return (leadership is lost) when another process holds the lease or
        renewal has failed for the renew deadline, two thirds of the lease, before a competitor may take over."""
        last_renewed = asyncio.get_running_loop().time()
        renew_deadline = self.lease_seconds * 2 / 3
        while True:
            await asyncio.sleep(self.lease_seconds / 6)
            try:
                if await self._try():
                    last_renewed = asyncio.get_running_loop().time()
                    continue
                log.error("leadership lost to another process")
                return
            except Exception as error:
                log.warning("lease renewal failed", error=str(error))
            if asyncio.get_running_loop().time() - last_renewed > renew_deadline:
                log.error("leadership lost: lease not renewed in time")
                return

    async def release(self) -> None:
        """Give the lease up at shutdown so that a successor need not wait for it to expire."""
        lease = await self.kube.get(LEASES, self.name, self.namespace)
        if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
            patch = {
                "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": {"holderIdentity": None, "renewTime": None},
            }
            with contextlib.suppress(ApiError):
                await self.kube.patch(LEASES, self.name, patch, self.namespace)
