"""The Infoblox backend: InfobloxIPPool (v1alpha1) served from an Infoblox NIOS grid through infoblox-client.

A pool is Ready only when its instance answers, accepts the credentials, verifies under TLS, and holds the pool's
views, networks and ranges (and, for host records, the DNS view and zone); a hostRecord pool whose DNS side is
missing gets no POST. Releases on an instance whose credentials were refused wait for its next re-check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping, Sequence

import structlog

from backends.infoblox.allocator import Allocator
from backends.infoblox.checks import DNS_REASONS, PoolChecks, usage
from backends.infoblox.connections import (
    TLS_CONDITION,
    Connections,
    GridHealth,
    InstanceProblem,
    InstanceStatus,
    tls_condition,
)
from backends.infoblox.ledger import ClusterStamp, Ledger
from backends.infoblox.repair import GridRepair
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import ANNOTATION_INSTANCE, HOST_RECORD, INFOBLOX_POOL, parse_pool
from backends.validation import PoolSpecError
from ipam_provider.backend.contract import (
    Allocation,
    BackendContext,
    ClaimContext,
    PoolKind,
    PoolNotReadyError,
    PoolRef,
    PoolReport,
    ReleaseImpossibleError,
    ReportCondition,
)
from ipam_provider.backend.live_pools import LivePools
from ipam_provider.backend.protocol import Capabilities
from ipam_provider.backend.repair import Holding, Pacer, Restore
from ipam_provider.common import Object, cap_int64
from ipam_provider.runtime.events.recorder import EventRecorder
from ipam_provider.runtime.kube.resources import subdomain_problem

log = structlog.get_logger(__name__)


class InfobloxBackend:
    kinds: Sequence[PoolKind] = (INFOBLOX_POOL,)
    report_interval = 60.0  # a pool's report reads the grid, whose changes no watch shows

    def __init__(self, context: BackendContext, settings: InfobloxSettings | None = None) -> None:
        self.settings = settings or InfobloxSettings()
        self.recorder = EventRecorder(context.kube, context.controller_name)  # Events about InfobloxInstances
        self.status = InstanceStatus(context.kube, self.recorder)
        self.grid = GridHealth(self.settings, self.status)
        stamp = ClusterStamp(context.cluster_identity)
        self.ledger = Ledger(Connections(context.kube, self.settings, self.status), self.grid, self.settings, stamp)
        self.allocator = Allocator(context.kube, self.ledger, self.settings)
        self.checks = PoolChecks(self.grid, self.settings)
        self.repair = GridRepair(self.ledger, self.allocator, self.settings)
        self.pools = LivePools(self._forget)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            observe_pool=self.observe_pool,
            accept_reporter=self.accept_reporter,
            report_interval=self.report_interval,
            repair=self,
        )

    def accept_reporter(self, report_soon: Callable[[PoolRef], None]) -> None:
        """When an instance's Ready condition changes (a call found the grid refusing, or answering again), the
        pools known to use it are reported again soon, so that their Ready follows at once."""

        def instance_changed(name: str) -> None:
            for ref in [ref for ref, pool in self.ledger.known.items() if pool.instance == name]:
                report_soon(ref)

        self.status.ready_changed = instance_changed

    def observe_pool(self, kind: PoolKind, old: Object | None, new: Object | None) -> Collection[PoolRef]:
        """A deleted pool's spec, index and check results are forgotten, also when an operation of it ends later
        (`LivePools`); no other pool's report depends on a pool's change."""
        meta = (new or old or {}).get("metadata") or {}
        self.pools.observe(kind.ref(meta.get("namespace"), str(meta.get("name", ""))), new is not None)
        return ()

    def _forget(self, ref: PoolRef) -> None:
        self.ledger.forget(ref)
        self.checks.forget(ref)

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        with self.pools.operation(pool_ref):
            try:
                parsed = self.ledger.parse(pool_ref, pool)
                connection = await self.ledger.connect(parsed.instance, pool_ref)
                quick = self.allocator.quick(parsed, connection, claim, existing) if existing is not None else None
                if quick is not None:
                    return quick
                health = await self.grid.health(connection)
                if not health.ready:
                    raise PoolNotReadyError(
                        f"InfobloxInstance {connection.name} is not ready ({health.reason}): {health.message}"
                    )
                if parsed.spec.mode == HOST_RECORD:
                    check = await self.checks.check(parsed, connection, health)
                    if not check.ready and check.reason in DNS_REASONS:
                        raise PoolNotReadyError(f"{parsed.ref} is not ready ({check.reason}): {check.message}")
                try:
                    return await self.allocator.allocate(parsed, connection, claim, existing)
                except PoolNotReadyError:
                    self.checks.forget(parsed.ref)  # the pool's status should say what is wrong, at its next report
                    raise
            except PoolNotReadyError as error:
                if error.retry_after is None:
                    error.retry_after = self.settings.not_ready_retry_seconds
                raise

    async def release(
        self, pool_ref: PoolRef, pool: Object | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        with self.pools.operation(pool_ref):
            # The grid that holds the address is the one recorded when it was allocated; the pool may have been
            # re-pointed at another instance since.
            instance = allocation.annotations.get(ANNOTATION_INSTANCE) if allocation is not None else None
            if instance is not None and subdomain_problem(instance):
                instance = None  # an edited annotation: the pool's instance decides
            if instance is None and pool is not None:
                with contextlib.suppress(PoolNotReadyError):
                    instance = self.ledger.parse(pool_ref, pool).instance
            known = self.ledger.known.get(pool_ref)
            instance = instance if instance is not None or known is None else known.instance
            if instance is None:
                raise ReleaseImpossibleError(
                    f"{pool_ref} is gone and the IPAddress of claim {claim} named no InfobloxInstance, so its grid is "
                    f"unknown; its grid objects carry the extensible attribute CAPI-Claim-UID={claim.uid}"
                )
            try:
                connection = await self.ledger.connect(instance, pool_ref, unrefused=True)
            except PoolNotReadyError as error:
                problem = error.__cause__
                if isinstance(problem, InstanceProblem) and problem.reason == "InstanceNotFound":
                    raise ReleaseImpossibleError(
                        f"InfobloxInstance {instance} is gone, so claim {claim}'s address cannot be released now; its "
                        f"grid objects carry the extensible attribute CAPI-Claim-UID={claim.uid}"
                    ) from problem
                raise
            await self.ledger.release(connection, pool_ref, claim, allocation)

    async def report(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[Allocation]) -> PoolReport:
        with self.pools.operation(pool_ref):
            try:
                parsed = self.ledger.known[pool_ref] = parse_pool(pool_ref, pool)
            except PoolSpecError as error:
                message = f"{error}; fix the pool's spec"
                return PoolReport(False, "InvalidConfiguration", message, counts=usage(None, addresses))
            counts = usage(parsed, addresses)
            try:
                connection = await self.ledger.connections.connect(parsed.instance, pool_ref.namespace or "")
            except InstanceProblem as problem:
                message = f"InfobloxInstance {parsed.instance}: {problem.message}"
                return PoolReport(False, problem.reason, message, counts=counts)
            status = {"networkView": connection.network_view(parsed)}
            verified, reason, tls_message = tls_condition(connection.spec)
            conditions = [ReportCondition(TLS_CONDITION, verified, reason, tls_message, warning=not verified)]
            health = await self.grid.health(connection)
            if not health.ready:
                message = f"InfobloxInstance {parsed.instance}: {health.message}"
                return PoolReport(False, health.reason, message, status, counts, conditions)
            check = await self.checks.check(parsed, connection, health)
            if not check.ready:
                return PoolReport(False, check.reason, check.message, status, counts, conditions)
            try:
                await self.ledger.index(parsed, connection)
            except Exception as error:  # the index is rebuilt on the next allocation anyway
                log.info("pool index not built", pool=str(parsed.ref), error=type(error).__name__)
            message = f"{cap_int64(counts.free)} of {cap_int64(counts.total)} addresses free; {check.message}"
            stamped = self.ledger.stamp.condition(connection)
            conditions += [stamped] if stamped else []
            return PoolReport(True, "PoolReady", message, status, counts, conditions)

    # The repair capability (ipam_provider.backend.repair.Repairable) is the GridRepair's.

    async def list_holdings(self, pool_ref: PoolRef, pool: Object, pacer: Pacer) -> Sequence[Holding]:
        with self.pools.operation(pool_ref):
            return await self.repair.list_holdings(pool_ref, pool, pacer)

    async def release_holding(self, pool_ref: PoolRef, pool: Object, holding: Holding) -> bool:
        with self.pools.operation(pool_ref):
            return await self.repair.release_holding(pool_ref, pool, holding)

    async def restore(self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, allocation: Allocation) -> Restore:
        with self.pools.operation(pool_ref):
            return await self.repair.restore(pool_ref, pool, claim, allocation)

    async def outside_pool(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> Mapping[str, str]:
        try:
            parsed = parse_pool(pool_ref, pool)
        except PoolSpecError:
            return {}  # the pool's status says what is wrong; nothing can be told now
        return {address: why for address in addresses if (why := parsed.why_outside(address)) is not None}

    async def close(self) -> None:
        await self.allocator.close()
        await self.ledger.connections.close()
        await self.recorder.close()
