"""The NetBox backend: NetboxIPPool (namespaced) and GlobalNetboxIPPool (cluster-scoped), v1alpha1.

How the pieces fit: `spec` parses a pool; `connections` turns its Secret into a cached `NetboxClient` (threads,
timeouts, retries); `resolver` checks the ownership marks and turns the pool's sources, tenant and tags into NetBox
ids (cached per pool generation and client, and refreshed by every report); `allocator` allocates and releases.

Costs in steady state: an already fulfilled claim, nothing (its IPAddress's annotations are trusted); a new claim,
one `POST …/available-ips/` (a claim asking for one address with the requested-address annotation: a lookup by
UID, a lookup of the address, a `POST ip-addresses` and a second lookup of the address; see `requested`); a
release, a GET (to check the marks) and a DELETE; a pool report (every minute), a few GETs per source; a repair
pass, floor(N / page size) + 1 paced GETs per VRF for N addresses of ours in the pool (see `repair`).
Failures become a `Problem` (pool-level: Ready=False on the pool, PoolNotReady on its claims) or
AllocationFailedError; messages never contain the token. Data from NetBox the backend cannot use (ValueError,
KeyError, TypeError) also becomes a Problem: nothing but a BackendError leaves allocate and release.

A pool-level failure of an allocation that the periodic report's GETs cannot see (a token that may read but not
add IP addresses: 401/403 on the POST) is remembered per pool and client: the pool's report shows it (Ready=False)
until an allocation of that pool succeeds or the Secret's token changes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import structlog

from backends.netbox import problems, resolver
from backends.netbox.allocator import Allocator
from backends.netbox.client import NetboxClient, NetboxError
from backends.netbox.connections import Connections
from backends.netbox.problems import Problem
from backends.netbox.repair import NetboxRepair
from backends.netbox.resolver import Ownership, Resolved
from backends.netbox.settings import NetboxSettings
from backends.netbox.spec import (
    CLAIM_UID_FIELD,
    GLOBAL_NETBOX_POOL,
    NETBOX_POOL,
    Pool,
    PoolSpecError,
    parse_pool,
)
from ipam_provider.backend.contract import (
    AddressCounts,
    Allocation,
    AllocationFailedError,
    BackendContext,
    ClaimContext,
    PoolKind,
    PoolNotReadyError,
    PoolRef,
    PoolReport,
    ReleaseImpossibleError,
)
from ipam_provider.backend.repair import Holding, Pacer, Restore
from ipam_provider.common import Object, cap_int64

log = structlog.get_logger(__name__)


class NetboxBackend:
    """Serves NetboxIPPool and GlobalNetboxIPPool."""

    report_interval = 60.0  # a pool's report reads NetBox, whose changes no watch shows

    def __init__(self, context: BackendContext, settings: NetboxSettings | None = None) -> None:
        self.settings = settings or NetboxSettings()
        self.connections = Connections(context.kube, self.settings.client, self.settings.secret_seconds)
        self.allocator = Allocator(
            self.settings.full_skip_seconds,
            self.settings.unknown_retry_seconds,
            self.settings.uncertain_seconds,
            context.cluster_identity,
        )
        self._known: dict[PoolRef, Pool] = {}  # the last good spec of each pool, for releases after it is gone
        self._resolved: dict[PoolRef, tuple[int, NetboxClient, Resolved]] = {}
        self._ownership: dict[NetboxClient, tuple[float, Ownership]] = {}
        self._ownership_locks: dict[str, asyncio.Lock] = {}
        self._failures: dict[PoolRef, tuple[NetboxClient, Problem]] = {}  # allocation failures the report can't see
        self._repair = NetboxRepair(self)  # as its RepairHost

    @property
    def kinds(self) -> Sequence[PoolKind]:
        return (NETBOX_POOL, GLOBAL_NETBOX_POOL)

    def parse(self, pool_ref: PoolRef, pool: Object) -> Pool:
        try:
            parsed = parse_pool(pool_ref, pool)
        except PoolSpecError as error:
            raise Problem(problems.INVALID, f"{pool_ref} is invalid: {error}; fix the pool's spec") from error
        self._known[parsed.ref] = parsed
        return parsed

    async def _ownership_of(self, client: NetboxClient, *, fresh: bool = False) -> Ownership:
        """The ownership marks of `client`'s NetBox, checked (and created) by one pool at a time."""
        async with self._ownership_locks.setdefault(client.endpoint.url, asyncio.Lock()):
            for dead in [c for c in self._ownership if c.closed]:  # clients replaced after a Secret changed
                del self._ownership[dead]
            cached = self._ownership.get(client)
            if cached is not None and not fresh and time.monotonic() - cached[0] < self.settings.ownership_seconds:
                return cached[1]
            ownership = await resolver.ensure_ownership(client)
            self._ownership[client] = (time.monotonic(), ownership)
            return ownership

    async def resolve(self, client: NetboxClient, pool: Pool, *, fresh: bool = False) -> Resolved:
        if not fresh and self.has_resolved(pool, client):
            return self._resolved[pool.ref][2]
        ownership = await self._ownership_of(client)
        resolved = await resolver.resolve(client, pool, ownership)
        self._resolved[pool.ref] = (pool.generation, client, resolved)
        return resolved

    def has_resolved(self, pool: Pool, client: NetboxClient) -> bool:
        """Whether `resolve` answers from the cache (no NetBox request) for this generation of the pool."""
        cached = self._resolved.get(pool.ref)
        return cached is not None and cached[0] == pool.generation and cached[1] is client

    def forget(self, pool: Pool, problem: Problem) -> None:
        """Drop what a failure may have made stale: the resolved sources, and the Secret on auth failures."""
        self._resolved.pop(pool.ref, None)
        if problem.reason == problems.AUTH_FAILED:
            self.connections.invalidate(pool)
            self._ownership.clear()

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        try:
            parsed = self.parse(pool_ref, pool)
        except Problem as problem:
            raise PoolNotReadyError(problem.message) from problem
        if existing is not None and self.allocator.trusted(parsed.ref, claim, existing):
            return existing  # the steady state of a fulfilled claim: no request at all
        asked = claim.requested_address if existing is None else None  # AllocationFailedError if not an IP
        bound = log.bind(claim=str(claim), pool=str(parsed.ref))
        context = f"allocating for claim {claim} from {parsed.ref}"
        client: NetboxClient | None = None
        try:
            try:
                async with self.connections.use(parsed) as client:
                    resolved = await self.resolve(client, parsed)
                    if existing is not None:
                        allocation = await self.allocator.hold_existing(client, parsed, resolved, claim, existing)
                    elif asked is not None:
                        allocation = await self.allocator.allocate_requested(client, parsed, resolved, claim, asked)
                    else:
                        allocation = await self.allocator.allocate(client, parsed, resolved, claim)
            except problems.FAILURES as error:
                raise problems.from_failure(error, context, _token(client)) from error
        except Problem as problem:
            self.forget(parsed, problem)
            if problem.reason == problems.AUTH_FAILED and client is not None:
                self._failures[parsed.ref] = (client, problem)
            bound.info("allocation failed", reason=problem.reason, message=problem.message)
            if problem.reason != problems.NETBOX_ERROR:  # the pool cannot serve anyone: PoolNotReady
                raise PoolNotReadyError(problem.message, retry_after=problem.retry_after) from problem
            raise AllocationFailedError(problem.message, retry_after=problem.retry_after) from problem
        self._failures.pop(parsed.ref, None)
        bound.info("netbox address held", address=f"{allocation.address}/{allocation.prefix}")
        return allocation

    async def release(
        self, pool_ref: PoolRef, pool: Object | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        parsed: Pool | None = None
        if pool is not None:
            try:
                parsed = self.parse(pool_ref, pool)
            except Problem:
                parsed = None
        parsed = parsed or self._known.get(pool_ref)
        if parsed is None:
            raise ReleaseImpossibleError(  # nothing is touched: the address, if any, is left to the repair loop
                f"{pool_ref} is gone and its NetBox connection is unknown to this controller; the NetBox IP address "
                f"whose custom field {CLAIM_UID_FIELD} is {claim.uid}, if it exists, stays in NetBox, where the repair "
                "loop finds it through any pool whose sources cover it (if none does, delete it by hand)"
            )
        context = f"releasing claim {claim} from {parsed.ref}"
        client: NetboxClient | None = None
        try:
            async with self.connections.use(parsed) as client:
                cached = self._ownership.get(client)
                sweep = not (cached[1] if cached else await self._ownership_of(client)).uid_unique
                await self.allocator.release(client, parsed.ref, claim, allocation, sweep=sweep)
        except Problem as problem:
            raise AllocationFailedError(f"releasing claim {claim}: {problem.message}") from problem
        except problems.FAILURES as error:
            failure = problems.from_failure(error, context, _token(client))
            if isinstance(error, NetboxError):  # unusable data leaves no connection state to drop
                self.forget(parsed, failure)
            raise AllocationFailedError(failure.message, retry_after=failure.retry_after) from error

    async def report(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[Allocation]) -> PoolReport:
        try:
            parsed = self.parse(pool_ref, pool)
        except Problem as problem:
            return PoolReport(False, problem.reason, problem.message)
        client: NetboxClient | None = None
        try:
            try:
                async with self.connections.use(parsed) as client:
                    resolved = await self.resolve(client, parsed, fresh=True)
                    usage = await resolver.usage(client, resolved.sources)
            except problems.FAILURES as error:
                raise problems.from_failure(error, f"checking {parsed.ref}", _token(client)) from error
        except Problem as problem:
            self.forget(parsed, problem)
            log.info("pool not ready", pool=str(parsed.ref), reason=problem.reason, message=problem.message)
            return PoolReport(False, problem.reason, problem.message)
        total = sum(u.source.total for u in usage)
        used = sum(u.used for u in usage)
        counts = AddressCounts(total=total, used=used, free=total - used)
        message = (
            f"{cap_int64(counts.free)} of {cap_int64(counts.total)} addresses free in {len(usage)} NetBox source(s) at "
            f"{client.endpoint.display_url}"
        )
        if parsed.insecure_skip_verify:
            message += "; TLS verification is off (insecureSkipVerify)"
        if not resolved.ownership.uid_unique:
            message += (
                f"; the NetBox custom field {CLAIM_UID_FIELD} is not Unique, so every allocation costs an extra "
                "lookup: tick Unique on it in NetBox"
            )
        status = {"sources": [u.wire() for u in usage]}
        failed = self._failures.get(parsed.ref)
        if failed is not None and failed[0] is client:
            message = f"the last allocation failed: {failed[1].message}"
            return PoolReport(False, failed[1].reason, message, status, counts)
        self._failures.pop(parsed.ref, None)  # the token changed since
        return PoolReport(True, problems.READY, message, status, counts)

    # --- the repair capability (backends/netbox/repair.py) ----------------------------------------------------------

    async def list_holdings(self, pool_ref: PoolRef, pool: Object, pacer: Pacer) -> Sequence[Holding]:
        return await self._repair.list_holdings(pool_ref, pool, pacer)

    async def release_holding(self, pool_ref: PoolRef, pool: Object, holding: Holding) -> bool:
        return await self._repair.release_holding(pool_ref, pool, holding)

    async def restore(self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, allocation: Allocation) -> Restore:
        return await self._repair.restore(pool_ref, pool, claim, allocation)

    async def outside_pool(self, pool_ref: PoolRef, pool: Object, addresses: Sequence[str]) -> dict[str, str]:
        return await self._repair.outside_pool(pool_ref, pool, addresses)

    async def close(self) -> None:
        self._resolved.clear()
        self._ownership.clear()
        self._failures.clear()
        await self.connections.close()


def _token(client: NetboxClient | None) -> str | None:
    """The token to scrub from messages about data `client` answered (None before a client was had)."""
    return client.endpoint.token if client is not None else None
