"""One pool's share of a repair pass (docs/repair.md, "What a pass does"). Each Event is recorded once per change;
the `AddressesRecorded` condition is not set under a watch filter (each shard sees only its own claims).

Nothing is released or restored while its claim is queued or being reconciled, nor unless fresh GETs still show
what the pass saw; every request of a release or a restore waits for the pacer. A holding that is not `releasable`
is reported, never released. A deleting IPAddress with our finalizer whose claim is gone loses the finalizer.

A pool the cache no longer shows as the pass listed it (deleted, or replaced by another of its name) gets no more
backend call from the pass (`PoolGone`, checked right before each one), so that nothing the backend forgot of the
pool is brought back; what the pass kept of the pool goes too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import structlog
from pydantic import ValidationError

from ipam_provider import pool_metrics
from ipam_provider.api.capi import (
    ADDRESSES,
    CLAIMS,
    FINALIZER_PROTECT_ADDRESS,
    IPAddress,
    IPAddressClaim,
    cluster_paused,
)
from ipam_provider.backend.contract import BackendError, PoolRef, ReportCondition
from ipam_provider.backend.protocol import Backend
from ipam_provider.backend.repair import Holding, Pacer, Repairable, RestoreOutcome
from ipam_provider.common import Object, listed, normalized_address
from ipam_provider.pool_metrics import PoolLabels
from ipam_provider.reconcile.context import ReconcileContext, claim_context
from ipam_provider.repair.compare import (
    LiveState,
    PoolComparison,
    Scope,
    Sharer,
    Unrecorded,
    address_text,
    claim_of_address,
    compare_pool,
    deleting,
    object_name,
    owner_claim_uid,
)
from ipam_provider.repair.pacer import CountingPacer, Turns
from ipam_provider.runtime.events import NORMAL, WARNING
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.watch import ClaimKey, QueueKey

log = structlog.get_logger(__name__)

ADDRESSES_RECORDED = "AddressesRecorded"
REASON_RECORDED = "Recorded"
REASON_DUPLICATE = "DuplicateAddress"
REASON_SUSPECTED_LEAK = "RepairSuspectedLeak"
REASON_RELEASED_LEAK = "RepairReleasedLeak"
REASON_RESTORED = "RepairRestoredAllocation"
REASON_OUTSIDE = "AddressOutsidePool"
REASON_RESTORE_FAILED = "RepairRestoreFailed"
RECORDED_MESSAGE = (
    "no live IPAddress of the pool was found held in the backend by another claim or record, or sharing its "
    "address with another claim"
)
LISTED_AT_MOST = 5  # addresses named in one message
COMPARED_INLINE = 1000  # holdings and IPAddresses of a pool compared on the event loop; more in a thread


@dataclass(frozen=True)
class RepairSettings:
    """The repair loop's settings (the `--repair-*` flags, docs/repair.md)."""

    interval: float = 60.0  # seconds between passes (0: no repair loop)
    grace_period: float = 60.0  # a suspect is released once first seen this long ago, and seen again since
    report_only: bool = False  # leaks are reported, never released
    requests_per_second: float = 20.0  # the pace of a pass's requests

    @property
    def enabled(self) -> bool:
        return self.interval > 0


@dataclass
class _Suspect:
    holding: Holding
    first_seen: float
    passes: int = 1


class PoolGone(Exception):
    """The cache no longer shows the pool a pass is repairing as the pass listed it."""


class SuspectedLeaks:
    """The book of suspected leaks, keyed by pool, holding handle and claim uid (a record re-used for another claim
    is another suspect). Only consecutive sightings count; a pool whose pass was skipped keeps its suspects. A
    suspect is reported on its second sighting in a row: a first one may be a claim's release racing the pass."""

    def __init__(self) -> None:
        self._suspects: dict[tuple[PoolRef, str, str], _Suspect] = {}

    def __len__(self) -> int:
        return len(self._suspects)

    def observe(self, pool: PoolRef, suspects: Iterable[Holding], now: float) -> list[Holding]:
        """Record a completed pass of `pool` that found `suspects` unaccounted for (forgetting the pool's suspects
        it did not find again); answer those found now for the second pass in a row (to be reported)."""
        seen = {(pool, holding.handle, holding.claim_uid): holding for holding in suspects}
        for key in [key for key in self._suspects if key[0] == pool and key not in seen]:
            del self._suspects[key]
        confirmed: list[Holding] = []
        for key, holding in seen.items():
            known = self._suspects.get(key)
            if known is None:
                self._suspects[key] = _Suspect(holding, now)
                continue
            known.holding = holding
            known.passes += 1
            if known.passes == 2:
                confirmed.append(holding)
        return confirmed

    def releasable(self, pool: PoolRef, now: float, grace: float) -> list[Holding]:
        """The pool's `releasable` suspects seen in two passes or more in a row, the first `grace` seconds ago."""
        return [
            suspect.holding
            for key, suspect in self._suspects.items()
            if key[0] == pool and suspect.holding.releasable
            if suspect.passes >= 2 and now - suspect.first_seen >= grace
        ]

    def count(self, pool: PoolRef) -> int:
        return sum(1 for key in self._suspects if key[0] == pool)

    def forget(self, pool: PoolRef, holding: Holding) -> None:
        self._suspects.pop((pool, holding.handle, holding.claim_uid), None)

    def pools(self) -> set[PoolRef]:
        return {key[0] for key in self._suspects}

    def forget_pool(self, pool: PoolRef) -> None:
        self._suspects = {key: suspect for key, suspect in self._suspects.items() if key[0] != pool}


@dataclass(frozen=True)
class PoolTarget:
    """A pool to repair, with its cached object, its backend and its metrics labels."""

    ref: PoolRef
    raw: Object
    backend: Backend
    repairer: Repairable  # the backend's `Capabilities.repair`
    labels: PoolLabels


@dataclass
class PoolFindings:
    """What the last completed pass of a pool found."""

    duplicates: dict[str, str] = field(default_factory=dict)  # "IPAddress ns/name" or "claim ns/name" → who else
    outside: dict[str, str] = field(default_factory=dict)  # canonical address → why
    failures: dict[str, str] = field(default_factory=dict)  # IPAddress ns/name → the failed restore's message
    foreign: int = 0  # holdings for claims of other namespaces than the (namespaced) pool's: ignored


@dataclass
class PoolRepairs:
    ctx: ReconcileContext
    scope: Scope
    settings: RepairSettings
    busy: Callable[[QueueKey], bool]
    clock: Callable[[], float] = time.monotonic
    book: SuspectedLeaks = field(default_factory=SuspectedLeaks)
    findings: dict[PoolRef, PoolFindings] = field(default_factory=dict)
    labels: dict[PoolRef, PoolLabels] = field(default_factory=dict)  # of the pools a pass has recorded series of
    pacer: Pacer = field(default_factory=CountingPacer)  # the loop's, set before each pass
    changed: dict[PoolRef, ReportCondition] = field(default_factory=dict)  # for the loop to hand over, in order
    turns: Turns = field(default_factory=Turns)
    _settled: dict[PoolRef, tuple[LiveState, PoolComparison]] = field(default_factory=dict)

    @property
    def releasing(self) -> bool:
        return not self.settings.report_only

    def forget_others(self, pools: set[PoolRef]) -> None:
        """Forget what is kept of every pool not in `pools` (gone, paused, or not served)."""
        for ref in (self.book.pools() | set(self.findings) | set(self.labels)) - pools:
            self._forget(ref)

    def _forget(self, ref: PoolRef) -> None:
        self.book.forget_pool(ref)
        self.findings.pop(ref, None)
        self.ctx.repair_conditions.pop(ref, None)
        self.changed.pop(ref, None)
        self._settled.pop(ref, None)
        labels = self.labels.pop(ref, None)
        if labels is not None:
            pool_metrics.forget_repair_series(labels)

    def live(self, target: PoolTarget) -> bool:
        """Whether the cache still shows the pool as the pass listed it (the same uid)."""
        cached = self.ctx.caches.pool(target.ref)
        return cached is not None and cached["metadata"].get("uid") == target.raw["metadata"].get("uid")

    def _still_live(self, target: PoolTarget) -> None:
        if not self.live(target):
            raise PoolGone(str(target.ref))

    async def settled(self, listed: Sequence[tuple[PoolTarget, Sequence[Holding]]], live: LiveState) -> bool:
        """Whether `live` gives the pools nothing to act on or report: every holding accounted for, every live
        IPAddress recorded, no address shared, no deleting IPAddress, and no finding left from the last pass."""
        self._settled.clear()
        for target, holdings in listed:
            await self.turns.take()
            if self.findings.get(target.ref, PoolFindings()) != PoolFindings():
                return False
            if any(deleting(address) for address in live.addresses_of(target.ref)):
                return False
            comparison = await self._compared(target.ref, holdings, live)
            self._settled[target.ref] = (live, comparison)
            if comparison.suspected or comparison.unrecorded or comparison.shared:
                return False
        return True

    async def _compared(self, ref: PoolRef, holdings: Sequence[Holding], live: LiveState) -> PoolComparison:
        if len(holdings) + len(live.addresses_of(ref)) < COMPARED_INLINE:
            return compare_pool(ref, holdings, live, self.scope)
        return await asyncio.to_thread(compare_pool, ref, holdings, live, self.scope)

    async def repair(self, target: PoolTarget, holdings: list[Holding], live: LiveState) -> None:
        """The pool's share of the pass. BackendError propagates: the findings stay as they were."""
        try:
            await self._repair(target, holdings, live)
        except PoolGone:
            log.debug("pool gone during the repair pass; forgotten", pool=str(target.ref))
            self._forget(target.ref)

    async def _repair(self, target: PoolTarget, holdings: list[Holding], live: LiveState) -> None:
        self._still_live(target)
        settled = self._settled.pop(target.ref, None)
        if settled is not None and settled[0] is live:
            comparison = settled[1]  # and `settled` saw no deleting IPAddress of the pool
        else:
            comparison = await self._compared(target.ref, holdings, live)
            if self.releasing:
                await self._let_go_orphaned_addresses(target, live)
        self._still_live(target)  # before its Events too
        suspects = [h for h in comparison.suspected if not self.busy(_claim_key(h))]
        for holding in self.book.observe(target.ref, suspects, self.clock()):
            self._suspected(target, holding)
        if self.releasing:
            for holding in self.book.releasable(target.ref, self.clock(), self.settings.grace_period):
                await self._release(target, holding)
        previous = self.findings.get(target.ref, PoolFindings())
        self._still_live(target)
        outside = await target.repairer.outside_pool(target.ref, target.raw, comparison.in_use)
        found = PoolFindings(outside=dict(outside), foreign=comparison.foreign)
        if found.foreign != previous.foreign and found.foreign:
            log.warning(
                "backend records name claims of other namespaces than the pool's; ignored",
                pool=str(target.ref),
                count=found.foreign,
            )
        for text, sharers in sorted(comparison.shared.items()):
            self._shared(target, text, sharers, previous, found)
        for item in comparison.unrecorded:
            await self._restore(target, item, previous, found)
        self._still_live(target)
        self._report(target, previous, found)
        self.findings[target.ref] = found
        self.labels[target.ref] = target.labels
        suspected = self.book.count(target.ref)
        pool_metrics.record_repair_findings(
            target.labels, suspected=suspected, duplicates=len(found.duplicates), outside=len(found.outside)
        )

    def _suspected(self, target: PoolTarget, holding: Holding) -> None:
        held = (
            f"{holding.address} is held in the backend ({holding.handle}) for claim {holding.claim or '?'} "
            f"(uid {holding.claim_uid}), which no live IPAddress or claim accounts for; suspected leak"
        )
        if not holding.releasable:
            why = holding.why_kept or "its record does not show that this management cluster made it"
            message = f"{held}, never released by the repair loop: {why}; release it by hand if it is a leak"
        else:
            action = "reported only" if not self.releasing else f"released after {self.settings.grace_period:g}s"
            message = f"{held}, {action} if it stays unaccounted for"
        log.info(
            "suspected leak",
            pool=str(target.ref),
            address=holding.address,
            handle=holding.handle,
            releasable=holding.releasable,
        )
        self.ctx.recorder.record(target.raw, NORMAL, REASON_SUSPECTED_LEAK, message)

    async def _release(self, target: PoolTarget, holding: Holding) -> None:
        if not holding.releasable or self.busy(_claim_key(holding)):
            return
        if not await self._still_unaccounted(target.ref, holding):
            log.info("suspected leak accounted for by a fresh read", pool=str(target.ref), handle=holding.handle)
            self.book.forget(target.ref, holding)
            return
        await self.pacer.wait()
        self._still_live(target)
        async with self.ctx.backend_turn(target.backend, target.ref):
            self._still_live(target)
            released = await target.repairer.release_holding(target.ref, target.raw, holding)
        self.book.forget(target.ref, holding)
        if not released:
            log.info("suspected leak had changed; not released", pool=str(target.ref), handle=holding.handle)
            return
        pool_metrics.LEAKS_RELEASED.labels(*target.labels).inc()
        log.info("leak released", pool=str(target.ref), address=holding.address, handle=holding.handle)
        message = (
            f"{holding.address} released from the backend ({holding.handle}): it was held for claim "
            f"{holding.claim} (uid {holding.claim_uid}), which no live IPAddress or claim accounted for"
        )
        self.ctx.recorder.record(target.raw, NORMAL, REASON_RELEASED_LEAK, message)

    async def _still_unaccounted(self, ref: PoolRef, holding: Holding) -> bool:
        """Whether fresh GETs still show the holding unaccounted for: its claim gone, or its claim's IPAddress (of
        any pool, whatever the uid, as in `compare.py`) at another address."""
        namespace, _, name = holding.claim.partition("/")
        await self.pacer.wait()
        claim = await self.ctx.kube.get(CLAIMS, name, namespace)
        await self.pacer.wait()
        address = await self.ctx.kube.get(ADDRESSES, name, namespace)
        claim_lives = claim is not None and claim["metadata"].get("uid") == holding.claim_uid
        if address is None:
            return not claim_lives  # a live claim without an IPAddress is being allocated
        return address_text(address) != normalized_address(holding.address)

    async def _let_go_orphaned_addresses(self, target: PoolTarget, live: LiveState) -> None:
        """Remove our finalizer from the pool's deleting IPAddresses whose claim is gone: nothing else would."""
        for address in live.addresses_of(target.ref):
            meta = address["metadata"]
            finalizers = list(meta.get("finalizers") or [])
            if not deleting(address) or FINALIZER_PROTECT_ADDRESS not in finalizers:
                continue
            claim = live.claims.get(claim_of_address(address))
            owner = owner_claim_uid(address)
            if claim is not None and (not owner or claim["metadata"].get("uid") == owner):
                continue
            if not self.scope.watches(meta.get("namespace") or ""):
                continue
            remaining = [f for f in finalizers if f != FINALIZER_PROTECT_ADDRESS]
            patch = {"metadata": {"finalizers": remaining, "resourceVersion": meta["resourceVersion"]}}
            await self.pacer.wait()
            try:
                await self.ctx.kube.patch(ADDRESSES, meta["name"], patch, meta["namespace"])
            except ApiError as error:
                if not (error.conflict or error.not_found):
                    raise
                continue
            log.info("finalizer removed from a deleted IPAddress whose claim is gone", address=object_name(address))

    async def _restore(self, target: PoolTarget, item: Unrecorded, previous: PoolFindings, found: PoolFindings) -> None:
        claim_meta = item.claim["metadata"]
        if self.busy(ClaimKey(claim_meta["namespace"], claim_meta["name"])) or not await self._unchanged(item):
            _keep_previous(item, previous, found)  # looked at again on the next pass
            return
        try:
            claim = IPAddressClaim.model_validate(item.claim)
            allocation = IPAddress.model_validate(item.address).allocation()
        except ValidationError as error:
            log.warning("IPAddress or claim does not parse; not restored", address=item.name, error=str(error))
            return
        name = claim.cluster_name
        if name and cluster_paused(self.ctx.caches.clusters.get(claim.metadata.namespace or "", name)):
            _keep_previous(item, previous, found)
            return
        await self.pacer.wait()
        self._still_live(target)
        try:
            async with self.ctx.backend_turn(target.backend, target.ref):
                self._still_live(target)
                answer = await target.repairer.restore(target.ref, target.raw, claim_context(claim), allocation)
        except BackendError as error:
            self._restore_failed(target, item, error, previous, found)
            return
        text = f"{allocation.address} of IPAddress {item.name} (claim {claim_meta['namespace']}/{claim_meta['name']})"
        if answer.outcome == RestoreOutcome.RECORDED:
            pool_metrics.RESTORED.labels(*target.labels).inc()
            log.info("allocation restored", pool=str(target.ref), address=item.name, ip=allocation.address)
            message = f"{text} recorded again in {target.ref}: the backend no longer held it"
            self.ctx.recorder.record(item.claim, NORMAL, REASON_RESTORED, message, related=target.raw)
            self.ctx.recorder.record(target.raw, NORMAL, REASON_RESTORED, message)
        elif answer.outcome == RestoreOutcome.TAKEN:
            holder = answer.detail or "another holder"
            subject = f"IPAddress {item.name}"
            found.duplicates[subject] = f"{allocation.address} held by {holder}"
            if previous.duplicates.get(subject) != found.duplicates[subject]:
                log.warning("duplicate address", pool=str(target.ref), address=item.name, holder=holder)
                message = (
                    f"{text} is held in {target.ref} by {{}}: the address is in use twice; it is not handed out "
                    "again. Free it where it is held wrongly, or delete the claim to get another address"
                )
                # A cluster-scoped pool's holder may be of any namespace: the claim's Event does not name it.
                told = holder if target.ref.namespace else "a holder of the shared pool (its Events name it)"
                self.ctx.recorder.record(
                    item.claim, WARNING, REASON_DUPLICATE, message.format(told), related=target.raw
                )
                self.ctx.recorder.record(target.raw, WARNING, REASON_DUPLICATE, message.format(holder))
        elif answer.outcome == RestoreOutcome.OUTSIDE:
            found.outside[address_text(item.address)] = answer.detail or "not an address of the pool"

    def _restore_failed(
        self, target: PoolTarget, item: Unrecorded, error: BackendError, previous: PoolFindings, found: PoolFindings
    ) -> None:
        """One restore could not be made now: keep what was found of the IPAddress, say so once per change."""
        _keep_previous(item, previous, found)
        ip = address_text(item.address)
        message = (
            f"{ip} of IPAddress {item.name} is not held in {target.ref} and could not be recorded again: "
            f"{error.message}; the repair loop tries again on its next pass"
        )
        found.failures[item.name] = message
        log.warning("restore failed", pool=str(target.ref), address=item.name, reason=error.reason, error=error.message)
        if previous.failures.get(item.name) != message:
            self.ctx.recorder.record(item.claim, WARNING, REASON_RESTORE_FAILED, message, related=target.raw)

    def _shared(
        self, target: PoolTarget, text: str, sharers: list[Sharer], previous: PoolFindings, found: PoolFindings
    ) -> None:
        """An address named by two live claims or more: a duplicate of each, Warnings when new."""
        subjects: list[str] = []
        changed: list[Sharer] = []
        for sharer in sharers:
            subject = f"IPAddress {object_name(sharer.address)}" if sharer.address else f"claim {sharer.claim_name}"
            others = ", ".join(f"claim {other.claim_name}" for other in sharers if other is not sharer)
            found.duplicates[subject] = f"{text} also named by {others}"
            subjects.append(subject)
            if previous.duplicates.get(subject) != found.duplicates[subject]:
                changed.append(sharer)
        if not changed:
            return
        named = ", ".join(subjects)
        log.warning("address named by several claims", pool=str(target.ref), ip=text, named_by=named)
        message = (
            f"{text} in {target.ref} is named by {len(sharers)} claims ({{}}): the address is in use twice; it is "
            "not handed out again. Delete the claims that must get another address"
        )
        for sharer in changed:
            told = _seen_from(sharer_namespace(sharer), sharers, subjects)
            self.ctx.recorder.record(sharer.claim, WARNING, REASON_DUPLICATE, message.format(told), related=target.raw)
        self.ctx.recorder.record(target.raw, WARNING, REASON_DUPLICATE, message.format(named))

    async def _unchanged(self, item: Unrecorded) -> bool:
        """Fresh GETs: the IPAddress and its claim are still as listed (neither gone, replaced nor deleting)."""
        meta, claim_meta = item.address["metadata"], item.claim["metadata"]
        await self.pacer.wait()
        address = await self.ctx.kube.get(ADDRESSES, meta["name"], meta["namespace"])
        await self.pacer.wait()
        claim = await self.ctx.kube.get(CLAIMS, claim_meta["name"], claim_meta["namespace"])
        if address is None or claim is None or deleting(address) or deleting(claim):
            return False
        same_address = address["metadata"].get("uid") == meta.get("uid")
        return same_address and bool(claim["metadata"].get("uid") == claim_meta.get("uid"))

    def _report(self, target: PoolTarget, previous: PoolFindings, found: PoolFindings) -> None:
        if found.outside and found.outside != previous.outside:
            outside = listed([f"{a} ({why})" for a, why in sorted(found.outside.items())], LISTED_AT_MOST)
            message = f"{len(found.outside)} live IPAddress(es) name addresses outside {target.ref}: {outside}"
            self.ctx.recorder.record(target.raw, WARNING, REASON_OUTSIDE, message)
        if found.duplicates:
            twice = listed([f"{n}: {d}" for n, d in sorted(found.duplicates.items())], LISTED_AT_MOST, "; ")
            message = f"addresses in use twice: {twice}"
            condition = ReportCondition(ADDRESSES_RECORDED, False, REASON_DUPLICATE, message)
        else:
            condition = ReportCondition(ADDRESSES_RECORDED, True, REASON_RECORDED, RECORDED_MESSAGE)
        if self.scope.watch_filter is not None:
            return  # each shard sees only its own claims: the condition is left as it is (see the module's contract)
        if self.ctx.repair_conditions.get(target.ref) != condition:
            self.ctx.repair_conditions[target.ref] = condition
            self.changed[target.ref] = condition


def _keep_previous(item: Unrecorded, previous: PoolFindings, found: PoolFindings) -> None:
    """Carry what the previous pass found of an unrecorded IPAddress not looked at this pass into this one's."""
    subject = f"IPAddress {item.name}"
    if subject in previous.duplicates:
        found.duplicates[subject] = previous.duplicates[subject]
    if item.name in previous.failures:
        found.failures[item.name] = previous.failures[item.name]
    ip = address_text(item.address)
    if ip in previous.outside:
        found.outside.setdefault(ip, previous.outside[ip])


def _claim_key(holding: Holding) -> ClaimKey:
    namespace, _, name = holding.claim.partition("/")
    return ClaimKey(namespace, name)


def sharer_namespace(sharer: Sharer) -> str:
    return str(sharer.claim["metadata"].get("namespace") or "")


def _seen_from(namespace: str, sharers: list[Sharer], subjects: list[str]) -> str:
    """The sharers' `subjects` as a claim of `namespace` is told them: those of other namespaces counted only."""
    own = [subject for sharer, subject in zip(sharers, subjects, strict=True) if sharer_namespace(sharer) == namespace]
    others = len(subjects) - len(own)
    return ", ".join(own + ([f"{others} of another namespace"] if others else []))
