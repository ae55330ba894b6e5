"""Leader election on a coordination.k8s.io Lease, as controller-runtime's --leader-elect does.

The three durations are client-go's: a candidate tries to take the lease every *retry period*; the leader renews
it every retry period, and `keep()` returns (so the caller can stop) once it could not renew for the *renew
deadline*, which is shorter than the *lease duration* other candidates wait before taking an unrenewed lease over.
Updates carry the lease's resourceVersion, so two candidates cannot both win. As in client-go, a lease counts as
expired when its record has not changed for a whole lease duration *by this process's own clock*, so clock skew
between nodes does not matter.

`leader_election_master_status{name=<lease name>}` is 0 from the elector's creation, 1 while it holds the lease,
and 0 again once leadership is lost or given up.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import math
import socket
import uuid

import aiohttp
import structlog

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import LEASES
from ipam_provider.runtime.telemetry.clients import set_leader

log = structlog.get_logger(__name__)


# client-go's leader elector requires renew deadline > JITTER_FACTOR x retry period.
JITTER_FACTOR = 1.2


class LeaderElector:
    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        *,
        lease_seconds: float = 15.0,
        renew_deadline_seconds: float | None = None,
        retry_seconds: float = 2.0,
    ) -> None:
        """controller-runtime's defaults are a 15 s lease, a 10 s renew deadline and a 2 s retry period; without a
        renew deadline, it is two thirds of the lease."""
        renew_deadline = lease_seconds * 2 / 3 if renew_deadline_seconds is None else renew_deadline_seconds
        if not lease_seconds > renew_deadline > JITTER_FACTOR * retry_seconds > 0:
            raise ValueError(
                f"leader election needs lease duration ({lease_seconds:g}s) > renew deadline ({renew_deadline:g}s) "
                f"> {JITTER_FACTOR:g} x retry period ({retry_seconds:g}s) > 0"
            )
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.lease_seconds = lease_seconds
        self.renew_deadline_seconds = renew_deadline
        self.retry_seconds = retry_seconds
        self.identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self._observed: tuple[object, float] | None = None  # (the lease record, local monotonic time first seen)
        set_leader(name, False)

    async def _try(self) -> bool:
        lease = await self.kube.get(LEASES, self.name, self.namespace)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # MicroTime
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self.lease_seconds),  # an int32 of whole seconds
            "renewTime": now,
        }
        if lease is None:
            body = {
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": now, "leaseTransitions": 0},
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
        duration = float(current.get("leaseDurationSeconds") or self.lease_seconds)
        record = (holder, current.get("renewTime"))
        monotonic = asyncio.get_running_loop().time()
        if self._observed is None or self._observed[0] != record:
            self._observed = (record, monotonic)
        expired = not current.get("renewTime") or monotonic - self._observed[1] > duration
        if holder not in (None, "", self.identity) and not expired:
            return False
        if holder != self.identity:
            spec["acquireTime"] = now
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
        log.info(
            "waiting for leadership",
            lease=f"{self.namespace}/{self.name}",
            identity=self.identity,
            lease_duration=self.lease_seconds,
            renew_deadline=self.renew_deadline_seconds,
            retry_period=self.retry_seconds,
        )
        while True:
            try:
                if await self._try():
                    log.info("became leader", identity=self.identity)
                    set_leader(self.name, True)
                    return
            except ApiError as error:
                log.warning("leader election failed", error=error.message)
            except (aiohttp.ClientError, OSError, TimeoutError) as error:  # the API server is away: try again
                log.warning("leader election failed", error=str(error) or type(error).__name__)
            await asyncio.sleep(self.retry_seconds)

    async def keep(self) -> None:
        """Renew every retry period; return (leadership is lost) when another process holds the lease, or when the
        lease could not be renewed for the renew deadline (a renewal still pending then is cut off), before a
        competitor may take over."""
        loop = asyncio.get_running_loop()
        last_renewed = loop.time()

        def time_left() -> float:
            return self.renew_deadline_seconds - (loop.time() - last_renewed)

        while True:
            await asyncio.sleep(min(self.retry_seconds, max(time_left(), 0.0)))
            if time_left() <= 0:
                log.error("leadership lost: lease not renewed in time", renew_deadline=self.renew_deadline_seconds)
                set_leader(self.name, False)
                return
            try:
                renewed = await asyncio.wait_for(self._try(), time_left())
            except Exception as error:  # the next pass gives up if this one took the renew deadline
                log.warning("lease renewal failed", error=str(error) or type(error).__name__)
                continue
            if not renewed:
                log.error("leadership lost to another process")
                set_leader(self.name, False)
                return
            last_renewed = loop.time()

    async def release(self) -> None:
        """Give the lease up at shutdown so that a successor need not wait for it to expire."""
        set_leader(self.name, False)
        lease = await self.kube.get(LEASES, self.name, self.namespace)
        if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
            patch = {
                "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": {"holderIdentity": None, "renewTime": None},
            }
            with contextlib.suppress(ApiError):
                await self.kube.patch(LEASES, self.name, patch, self.namespace)
