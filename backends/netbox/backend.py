"""The NetBox backend: NetboxIPPool (namespaced) and GlobalNetboxIPPool (cluster-scoped), v1alpha1.

`spec` parses a pool; `connections` turns its Secret into a cached `NetboxClient`; `resolver` turns the pool's
names into NetBox ids; `ledger` reads and writes our NetBox IP addresses; `allocator` allocates and releases;
`repair` offers the repair capability. Request costs are in docs/netbox.md.

Nothing but a BackendError leaves allocate and release; messages never contain the token. A pool-level failure of
an allocation that the report's GETs cannot see (a token that may read but not add IP addresses: 401/403 on the
POST) is remembered per pool and client: the report shows it until an allocation succeeds or the token changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import structlog

from backends.infoblox.hostname import MACHINE, HostnameError, OwnerBounds
from backends.infoblox.hostname import machine_name as owning_machine
from backends.netbox import reasons
from backends.netbox.allocator import Allocator
from backends.netbox.client import ClientSettings, NetboxClient
from backends.netbox.connections import Connections
from backends.netbox.ledger import Ledger
from backends.netbox.reasons import PoolUnusableError, for_claims, shown_to_claims
from backends.netbox.repair import NetboxRepair
from backends.netbox.resolver import Resolver, usage
from backends.netbox.spec import CLAIM_UID_FIELD, GLOBAL_NETBOX_POOL, NETBOX_POOL, Pool, parse_pool
from backends.validation import PoolSpecError
from ipam_provider.backend.contract import (
    AddressCounts,
    AddressInUse,
    Allocation,
    AllocationFailedError,
    BackendContext,
    BackendError,
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

log = structlog.get_logger(__name__)

TLS_VERIFIED = "TLSVerified"
MACHINE_PLACEHOLDER = "{machine}"


@dataclass(frozen=True)
class NetboxSettings:
    """Tunables of the NetBox backend. The defaults suit production; tests shorten the timers."""

    client: ClientSettings = field(default_factory=ClientSettings)
    secret_seconds: float = 30.0  # how long a Secret, once read, is trusted
    ownership_seconds: float = 300.0  # how long the owner tag and UID field, once checked, are trusted
    full_skip_seconds: float = 30.0  # a source that answered 409 is asked last for this long
    unknown_retry_seconds: float = 2.0  # a claim whose POST had an unknown outcome is looked at again this soon
    uncertain_seconds: float = 120.0  # without a Unique UID field: no second POST this soon after an unknown outcome
    repair_page_size: int = 1000  # IP addresses per page of a repair listing (NetBox caps it at MAX_PAGE_SIZE)


class NetboxBackend:
    """Serves NetboxIPPool and GlobalNetboxIPPool."""

    kinds: Sequence[PoolKind] = (NETBOX_POOL, GLOBAL_NETBOX_POOL)
    report_interval = 60.0  # a pool's report reads NetBox, whose changes no watch shows

    def __init__(self, context: BackendContext, settings: NetboxSettings | None = None) -> None:
        settings = settings or NetboxSettings()
        connections = Connections(context.kube, settings.client, settings.secret_seconds)
        self.resolver = Resolver(connections, settings.ownership_seconds)
        self.ledger = Ledger(context.cluster_identity)
        self.allocator = Allocator(
            self.ledger, settings.full_skip_seconds, settings.unknown_retry_seconds, settings.uncertain_seconds
        )
        self.repair = NetboxRepair(self.resolver, self.ledger, self.allocator, settings.repair_page_size)
        self._failures: dict[PoolRef, tuple[NetboxClient, PoolUnusableError]] = {}  # those the report can't see
        self._kube = context.kube
        self.owner_bounds = OwnerBounds()
        self.pools = LivePools(self._forget)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            review_pool_change=self.review_pool_change,
            observe_pool=self.observe_pool,
            report_interval=self.report_interval,
            repair=self,
        )

    def observe_pool(self, kind: PoolKind, old: Object | None, new: Object | None) -> Collection[PoolRef]:
        """A deleted pool's state and connection are forgotten (`_forget`), also when an operation of it ends later
        (`LivePools`); no other pool's report depends on a pool's change."""
        meta = (new or old or {}).get("metadata") or {}
        ref = kind.ref(meta.get("namespace"), str(meta.get("name", "")))
        if new is not None:
            self.resolver.connections.seen(ref)
        self.pools.observe(ref, new is not None)
        return ()

    def _forget(self, ref: PoolRef) -> None:
        self._failures.pop(ref, None)
        self.resolver.forget(ref)
        self.ledger.forget(ref)
        self.repair.forget(ref)

    async def review_pool_change(
        self, pool_ref: PoolRef, old: Object | None, new: Object | None, in_use: Sequence[AddressInUse]
    ) -> list[str]:
        """The admission webhook's check: a created or changed pool is refused with what `parse_pool` refuses."""
        if new is None:
            return []
        try:
            parse_pool(pool_ref, new)
        except PoolSpecError as error:
            return list(error.messages)
        return []

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        with self.pools.operation(pool_ref):
            try:
                parsed = self.resolver.parse(pool_ref, pool)
            except PoolUnusableError as problem:
                raise PoolNotReadyError(problem.message) from problem
            if existing is not None and self.ledger.trusted(parsed.ref, claim, existing):
                return existing  # the steady state of a fulfilled claim: no request at all
            claim = await self._machine_read(parsed, claim)
            asked = claim.requested_address if existing is None else None  # AllocationFailedError if not an IP
            bound = log.bind(claim=str(claim), pool=str(parsed.ref))
            client: NetboxClient | None = None
            try:
                async with self.resolver.session(parsed, f"allocating for claim {claim} from") as client:
                    resolved = await self.resolver.resolve(client, parsed)
                    if existing is not None:
                        allocation = await self.allocator.hold_existing(client, parsed, resolved, claim, existing)
                    elif asked is not None:
                        allocation = await self.allocator.allocate_requested(client, parsed, resolved, claim, asked)
                    else:
                        allocation = await self.allocator.allocate(client, parsed, resolved, claim)
            except BackendError as error:  # from the allocator
                shown_to_claims(error, client)
                raise
            except PoolUnusableError as problem:
                if problem.reason == reasons.AUTH_FAILED and client is not None:
                    self._failures[parsed.ref] = (client, problem)
                bound.info("allocation failed", reason=problem.reason, message=problem.message)
                message = for_claims(problem.message, client)
                if problem.reason != reasons.NETBOX_ERROR:  # the pool cannot serve anyone: PoolNotReady
                    raise PoolNotReadyError(message, retry_after=problem.retry_after) from problem
                raise AllocationFailedError(message, retry_after=problem.retry_after) from problem
            self._failures.pop(parsed.ref, None)
            bound.info("netbox address held", address=f"{allocation.address}/{allocation.prefix}")
            return allocation

    async def _machine_read(self, pool: Pool, claim: ClaimContext) -> ClaimContext:
        """`claim` as the pool's templates see it. When one names {machine} and the claim has owners, the Machine is
        read first (the owner walk of backends.infoblox.hostname: known kinds, the claim's namespace, bounded, each
        uid checked), and the claim keeps that Machine as its only owner; AllocationFailedError when it cannot be
        found, so that a claim never stamps a name it merely supplies."""
        templates = (pool.fields.dns_name or "", pool.fields.description or "")
        if not claim.owner_references or not any(MACHINE_PLACEHOLDER in t for t in templates):
            return claim
        try:
            name = await owning_machine(self._kube, claim, self.owner_bounds)
        except HostnameError as error:
            why = str(error).partition("; set spec.hostRecord")[0]  # the walk's advice is Infoblox's
            raise AllocationFailedError(
                f"{pool.ref}: {MACHINE_PLACEHOLDER} in spec.addressFields cannot be filled in: {why}; let the "
                f"claim's owner chain reach its Machine, or remove {MACHINE_PLACEHOLDER} from the templates"
            ) from error
        machine = {"apiVersion": f"{MACHINE[0]}/v1beta2", "kind": MACHINE[1], "name": name}
        return dataclasses.replace(claim, owner_references=(machine,))

    async def release(
        self, pool_ref: PoolRef, pool: Object | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        with self.pools.operation(pool_ref):
            if pool is not None:
                with contextlib.suppress(PoolUnusableError):  # invalid now: the last good spec serves
                    self.resolver.parse(pool_ref, pool)
            parsed = self.resolver.known.get(pool_ref)  # None: the pool is gone and was never seen valid
            if parsed is None:
                raise ReleaseImpossibleError(  # nothing is touched: the address, if any, is left to the repair loop
                    f"{pool_ref} is gone and its NetBox connection is unknown to this controller; the NetBox IP "
                    f"address whose custom field {CLAIM_UID_FIELD} is {claim.uid}, if it exists, stays in NetBox, "
                    "where the repair loop finds it through any pool whose sources cover it (if none does, delete it "
                    "by hand)"
                )
            client: NetboxClient | None = None
            try:
                async with self.resolver.session(parsed, f"releasing claim {claim} from") as client:
                    sweep = not (await self.resolver.ownership(client, any_age=True)).uid_unique
                    await self.allocator.release(client, parsed.ref, claim, allocation, sweep=sweep)
            except BackendError as error:  # from the allocator
                shown_to_claims(error, client)
                raise
            except PoolUnusableError as problem:
                message = for_claims(problem.message, client)
                raise AllocationFailedError(message, retry_after=problem.retry_after) from problem

    async def report(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[Allocation]) -> PoolReport:
        with self.pools.operation(pool_ref):
            conditions: tuple[ReportCondition, ...] = ()
            try:
                parsed = self.resolver.parse(pool_ref, pool)
                conditions = tls_conditions(parsed, None)
                async with self.resolver.session(parsed, "checking") as client:
                    conditions = tls_conditions(parsed, client.endpoint.url)
                    resolved = await self.resolver.resolve(client, parsed, fresh=True)
                    used = await usage(client, resolved.sources)
            except PoolUnusableError as problem:
                log.info("pool not ready", pool=str(pool_ref), reason=problem.reason, message=problem.message)
                return PoolReport(False, problem.reason, problem.message, conditions=conditions)
            total = sum(s.total for s in resolved.sources)
            counts = AddressCounts(total=total, used=sum(used), free=total - sum(used))
            message = (
                f"{cap_int64(counts.free)} of {cap_int64(counts.total)} addresses free in {len(used)} NetBox source(s) "
                f"at {client.endpoint.display_url}"
            )
            if not resolved.ownership.uid_unique:
                message += (
                    f"; the NetBox custom field {CLAIM_UID_FIELD} is not Unique, so every allocation costs an extra "
                    "lookup: tick Unique on it in NetBox"
                )
            status = {"sources": [s.status(n) for s, n in zip(resolved.sources, used, strict=True)]}
            failed = self._failures.get(parsed.ref)
            if failed is not None and failed[0] is client:
                message = f"the last allocation failed: {failed[1].message}"
                return PoolReport(False, failed[1].reason, message, status, counts, conditions)
            self._failures.pop(parsed.ref, None)  # the token changed since
            return PoolReport(True, reasons.READY, message, status, counts, conditions)

    # The repair capability (ipam_provider.backend.repair.Repairable) is the NetboxRepair's.

    async def list_holdings(self, pool_ref: PoolRef, pool: Object, pacer: Pacer) -> list[Holding]:
        with self.pools.operation(pool_ref):
            return await self.repair.list_holdings(pool_ref, pool, pacer)

    async def release_holding(self, pool_ref: PoolRef, pool: Object, holding: Holding) -> bool:
        with self.pools.operation(pool_ref):
            return await self.repair.release_holding(pool_ref, pool, holding)

    async def restore(self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, allocation: Allocation) -> Restore:
        with self.pools.operation(pool_ref):
            return await self.repair.restore(pool_ref, pool, claim, allocation)

    async def outside_pool(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> dict[str, str]:
        with self.pools.operation(pool_ref):
            return await self.repair.outside_pool(pool_ref, pool, addresses)

    async def close(self) -> None:
        self._failures.clear()
        await self.resolver.close()


def tls_conditions(pool: Pool, url: str | None) -> tuple[ReportCondition, ...]:
    """The pool's TLSVerified condition, given its Secret's `url` (None: not read; then only what the spec says, or
    nothing)."""
    if url is not None and urlsplit(url).scheme == "http":
        message = (
            "the url in the pool's Secret (spec.connection.secretRef) is http://, so the NetBox token goes over the "
            "network unencrypted; use NetBox's https:// url"
        )
        return (ReportCondition(TLS_VERIFIED, False, "PlainHTTP", message, warning=True),)
    if pool.insecure_skip_verify:
        message = (
            "spec.connection.insecureSkipVerify is true: NetBox's TLS certificate is not verified, so whoever can "
            "intercept the connection can read the token; put NetBox's CA in the Secret's caBundle and remove "
            "insecureSkipVerify"
        )
        return (ReportCondition(TLS_VERIFIED, False, "InsecureSkipVerify", message, warning=True),)
    if url is None:
        return ()
    message = "NetBox's TLS certificate is verified (against the Secret's caBundle, or the system's CAs)"
    return (ReportCondition(TLS_VERIFIED, True, "Verified", message),)
