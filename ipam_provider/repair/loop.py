"""The repair loop (docs/repair.md, "What a pass does"): in the leader, a first pass soon after the caches synced,
then one every `settings.interval` seconds until cancelled.

Every listing request waits for the shared pacer. A failure skips the pool (or the backend) until the next pass and
never stops the loop. A pass hands the pools whose `AddressesRecorded` condition changed to the pool reconciler
`HAND_OVER_AT_ONCE` at a time, each slice once the cache shows the one before written (`HAND_OVER_WAIT` at most;
once a slice is not seen in time, the rest go without waiting), so that new work waits behind a few pools at most.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from ipam_provider import pool_metrics
from ipam_provider.api.capi import ANNOTATION_DELETE_FOR_MOVE, ANNOTATION_PAUSED
from ipam_provider.backend.contract import BackendError, PoolRef, ReportCondition
from ipam_provider.backend.protocol import Capabilities
from ipam_provider.backend.repair import Holding, Pacer
from ipam_provider.pool_metrics import PASS_BACKEND_ERROR, PASS_ERROR, PASS_OK, PoolLabels
from ipam_provider.reconcile.context import ReconcileContext
from ipam_provider.repair.compare import LiveState, Scope, cached_live, read_live
from ipam_provider.repair.pacer import RatePacer
from ipam_provider.repair.pool import PoolRepairs, PoolTarget, RepairSettings
from ipam_provider.runtime.kube.bounds import CONDITION_MESSAGE_LENGTH, cut_message
from ipam_provider.watch import QueueKey

log = structlog.get_logger(__name__)

FIRST_PASS_DELAY = 5.0  # the first pass comes this long after the start (or after one interval, if shorter)
HAND_OVER_AT_ONCE = 8  # pools whose condition a pass changed, handed to the pool reconciler at a time
HAND_OVER_WAIT = 2.0  # seconds the last ones handed over are waited for at most (a refused write never shows)
HAND_OVER_POLL = 0.05  # seconds between two looks at the cache for them
Listed = list[tuple[PoolTarget, list[Holding]]]  # pools with their holdings, as a pass listed them


@dataclass(frozen=True)
class BackendPass:
    """One backend's share of a pass: its name (the metrics' `backend` label) and its pools."""

    name: str
    capabilities: Capabilities
    targets: list[PoolTarget]


class RepairLoop:
    def __init__(
        self,
        ctx: ReconcileContext,
        scope: Scope,
        settings: RepairSettings,
        busy: Callable[[QueueKey], bool],
        *,
        clock: Callable[[], float] = time.monotonic,
        pacer: Pacer | None = None,
    ) -> None:
        self.ctx = ctx
        self.scope = scope
        self.settings = settings
        self.clock = clock
        self._pacer = pacer
        self.pools = PoolRepairs(ctx, scope, settings, busy, clock)
        self.passes = 0

    @property
    def pacer(self) -> Pacer:
        if self._pacer is None:  # made on the loop that uses it
            self._pacer = RatePacer(self.settings.requests_per_second)
        return self._pacer

    async def run(self) -> None:
        log.info(
            "repair loop started",
            interval=self.settings.interval,
            grace_period=self.settings.grace_period,
            report_only=self.settings.report_only,
        )
        await asyncio.sleep(min(self.settings.interval, FIRST_PASS_DELAY))
        while True:
            try:
                await self.run_pass()
            except Exception:  # run_pass catches per backend; this is the last line of defence
                log.exception("repair pass failed; trying again on the next")
            await asyncio.sleep(self.settings.interval)

    async def run_pass(self) -> None:
        """One pass: every backend's holdings, then the live state for all of them (the caches', or one fresh read),
        then each backend's pools and sweep, then the changed conditions handed over. Never raises but for
        cancellation."""
        self.passes += 1
        self.pools.pacer = self.pacer
        backends = self._backend_passes()
        self.pools.forget_others({target.ref for one in backends for target in one.targets})
        listed: list[tuple[BackendPass, str, Listed, float]] = []
        for one in backends:
            started = time.perf_counter()
            try:
                result, holdings = await self._list(one)
            except Exception:
                log.exception("repair pass failed; trying again on the next", backend=one.name)
                result, holdings = PASS_ERROR, []
            listed.append((one, result, holdings, time.perf_counter() - started))
        pools = [pool for _, _, holdings, _ in listed for pool in holdings]
        live = await self._live(pools) if pools else None
        for one, result, holdings, spent in listed:
            started = time.perf_counter()
            try:
                result = await self._backend_pass(one, result, holdings, live)
            except Exception:
                result = PASS_ERROR
                log.exception("repair pass failed; trying again on the next", backend=one.name)
            finally:
                pool_metrics.REPAIR_PASSES.labels(one.name, result).inc()
                pool_metrics.REPAIR_PASS_SECONDS.labels(one.name).observe(spent + time.perf_counter() - started)
        await self._hand_over()

    async def _hand_over(self) -> None:
        changed = list(self.pools.changed.items())
        handed: Sequence[tuple[PoolRef, ReportCondition]] = ()
        waiting = True  # until a slice is not seen written in time: then the rest go without waiting
        for start in range(0, len(changed), HAND_OVER_AT_ONCE):
            if waiting:
                waiting = await self._written(handed)
            handed = changed[start : start + HAND_OVER_AT_ONCE]
            for ref, _ in handed:
                self.pools.changed.pop(ref, None)  # a pass cancelled here leaves the rest for the next one
                self.ctx.pool_changed(ref)

    async def _written(self, handed: Sequence[tuple[PoolRef, ReportCondition]]) -> bool:
        """Whether the cache showed every `handed` condition on its pool (or the pool gone) within `HAND_OVER_WAIT`."""
        for _ in range(round(HAND_OVER_WAIT / HAND_OVER_POLL)):
            if all(self._shows(ref, condition) for ref, condition in handed):
                return True
            await asyncio.sleep(HAND_OVER_POLL)
        return False

    def _shows(self, ref: PoolRef, condition: ReportCondition) -> bool:
        """Whether the cached pool carries `condition`, or is gone or being deleted."""
        raw = self.ctx.caches.pool(ref)
        if raw is None or raw["metadata"].get("deletionTimestamp"):
            return True
        message = cut_message(condition.message, CONDITION_MESSAGE_LENGTH)  # as the pool reconciler writes it
        wanted = ("True" if condition.status else "False", condition.reason, message)
        for found in (raw.get("status") or {}).get("conditions") or []:
            if found.get("type") == condition.type:
                return (found.get("status"), found.get("reason"), found.get("message")) == wanted
        return False

    async def _live(self, listed: Listed) -> LiveState | None:
        """The live state as the watch caches show it, when it gives the listed pools nothing to do (the usual
        case: the pass reads nothing more); else read fresh from the API server; None when that read failed."""
        caches = self.ctx.caches
        cached = cached_live(caches.claims.items(), caches.addresses.items(), self.ctx.registry.kind_of)
        if await self.pools.settled(listed, cached):
            return cached
        try:
            return await read_live(self.ctx.kube, self.scope, self.ctx.registry.kind_of, self.pacer)
        except Exception:
            log.exception("repair pass could not read the API server; trying again on the next")
            return None

    def _backend_passes(self) -> list[BackendPass]:
        """The backends that offer the repair capability, each with its pools that are neither paused nor moving."""
        registry = self.ctx.registry
        passes = []
        for backend in registry.backends:
            capabilities = registry.capabilities(backend)
            repairer = capabilities.repair
            if repairer is None or not backend.kinds:
                continue
            name = registry.name_of(backend.kinds[0].group, backend.kinds[0].kind)
            targets = []
            for kind in backend.kinds:
                for raw in self.ctx.caches.pools[(kind.group, kind.kind)].items():
                    annotations = raw["metadata"].get("annotations") or {}
                    if ANNOTATION_PAUSED in annotations or ANNOTATION_DELETE_FOR_MOVE in annotations:
                        continue
                    ref = kind.ref(raw["metadata"].get("namespace"), raw["metadata"]["name"])
                    targets.append(PoolTarget(ref, raw, backend, repairer, PoolLabels.of(name, ref)))
            passes.append(BackendPass(name, capabilities, targets))
        return passes

    async def _backend_pass(self, one: BackendPass, result: str, listed: Listed, live: LiveState | None) -> str:
        """Each listed pool repaired on `live` (None: skipped), then the backend's sweep; the pass's result label."""
        if listed and live is None:
            result, listed = PASS_ERROR, []
        for target, holdings in listed:
            assert live is not None
            await self.pools.turns.take()
            try:
                await self.pools.repair(target, holdings, live)
            except BackendError as error:
                result = PASS_BACKEND_ERROR if result == PASS_OK else result
                _skipped(target, "repair", error)
            except Exception:
                result = PASS_ERROR
                log.exception("pool repair failed; trying again on the next pass", pool=str(target.ref))
        sweep = one.capabilities.sweep_orphaned
        if sweep is not None and not self.settings.report_only:
            try:
                swept = await sweep(self.settings.grace_period)
            except BackendError as error:
                result = PASS_BACKEND_ERROR
                log.warning("orphan sweep skipped", backend=one.name, error=error.message)
            else:
                if swept:
                    log.info("holdings of deleted pools released", backend=one.name, released=swept)
        return result

    async def _list(self, one: BackendPass) -> tuple[str, Listed]:
        """The result label so far, and every live pool's holdings: in one listing when the backend offers
        `list_pools_holdings`, else pool by pool."""
        lister = one.capabilities.list_pools_holdings
        targets = [target for target in one.targets if self.pools.live(target)]
        if lister is not None and targets:
            try:
                found = await lister([(target.ref, target.raw) for target in targets], self.pacer)
            except BackendError as error:
                log.warning("repair pass skipped its pools", backend=one.name, reason=error.reason, error=error.message)
                return PASS_BACKEND_ERROR, []
            return PASS_OK, [(target, list(found.get(target.ref, ()))) for target in targets]
        result = PASS_OK
        listed: Listed = []
        for target in one.targets:
            if not self.pools.live(target):
                continue
            try:
                listed.append((target, list(await target.repairer.list_holdings(target.ref, target.raw, self.pacer))))
            except BackendError as error:
                result = PASS_BACKEND_ERROR if result == PASS_OK else result
                _skipped(target, "listing", error)
            except Exception:  # e.g. the pool's Secret could not be read: the backend's other pools go on
                result = PASS_ERROR
                log.exception("pool listing failed; trying again on the next pass", pool=str(target.ref))
        return result, listed


def _skipped(target: PoolTarget, step: str, error: BackendError) -> None:
    log.warning(
        "pool skipped by this repair pass; trying again on the next",
        pool=str(target.ref),
        step=step,
        reason=error.reason,
        error=error.message,
    )
