"""Allocation and release against the grid, and the per-pool index of owned objects.

Contract:
- Steady state is one WAPI request per allocation: a POST of a fixedaddress / ipv6fixedaddress / record:host with
  `func:nextavailableip:<subnet or range>,<network view>`, the ownership attributes and `_return_fields`, so the
  answer carries the address and no follow-up GET is needed. A hostRecord pool with configureForDNS false first
  searches its host name among IPAM-only records (`same_name`): two requests. The grid picks the address
  atomically, so two claims never get the same one, even from two controllers.
- Idempotent: the per-pool index (built by one paged `*CAPI-Pool=<ns>/<name>` search per pool and process, and every
  `index_resync_seconds`) maps claim uids to the objects they own; a claim that owns an object gets it back, with no
  request. With `existing` (an IPAddress names the claim's address) the object at that address owned by the claim
  is kept and any other object the claim owns is deleted (the remains of a lost reply); if the grid holds nothing
  for the claim, an object of ours at that address recorded for the same claim namespace, name and pool under
  another CAPI-Claim-UID is taken over (its CAPI-Claim-UID re-keyed to this claim: the claim was moved by
  `clusterctl move` or restored from a backup, and got a new uid); otherwise the address is reserved literally,
  unless another object holds it.
- A new claim with the requested-address annotation gets an object at exactly that address (`requested`).
- Subnets and ranges are asked in the pool's order; "Cannot find 1 available IP address(es)" moves on to the next
  (a full one is asked last for `exhausted_skip_seconds`), and when all are full the claim gets PoolExhausted.
- A 503 is retried with backoff. A lost or timed-out POST has an unknown outcome: the claim is marked uncertain and
  the grid is searched on CAPI-Claim-UID before anything is posted again, so a committed object is found and used.
- Ownership is the CAPI-Claim-UID attribute and nothing else: a same-named host record or an object at the same
  address without it is never adopted and never deleted. Release searches `*CAPI-Claim-UID=<uid>` (on the object
  type the IPAddress's ref annotation names) and deletes exactly what that answers; a ref annotation that is not
  among the answers is left alone. 404 on DELETE means already released.
- A pool gateway that the grid hands out (nothing on the grid reserves it) is reserved once with a fixedaddress
  carrying only CAPI-Pool, and the claim is served the next address.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from backends.infoblox import requested
from backends.infoblox.client import Problem, WapiError
from backends.infoblox.connections import Connection
from backends.infoblox.health import GridHealth
from backends.infoblox.hostname import HostnameError, host_fqdn, machine_name
from backends.infoblox.identity import ClusterStamp
from backends.infoblox.ownership import LateCommits, owned, release_owned, same, take_over, translate
from backends.infoblox.payloads import (
    FIXED_V4,
    FIXED_V6,
    HOST,
    RETURN_FIELDS,
    GridObject,
    claim_marks,
    fixed_payload,
    gateway_marks,
    host_payload,
    next_available,
    object_type,
    parse_object,
    types_for_version,
)
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import (
    ANNOTATION_HOSTNAME,
    ANNOTATION_INSTANCE,
    ANNOTATION_REF,
    EA_POOL,
    Pool,
    Target,
)
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    BackendError,
    ClaimContext,
    PoolExhaustedError,
    PoolRef,
    requested_address_outside,
)
from ipam_provider.kube.client import KubeClient

log = structlog.get_logger(__name__)


@dataclass
class PoolState:
    """What this process knows of one pool's objects on the grid."""

    instance: str
    built_at: float
    by_claim: dict[str, list[GridObject]] = field(default_factory=dict)
    uncertain: set[str] = field(default_factory=set)
    exhausted: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Allocating:
    """One allocation under way: the claim, its pool and what this process knows of the pool's objects, the
    connection to the grid, and the network view."""

    pool: Pool
    connection: Connection
    state: PoolState
    claim: ClaimContext
    network_view: str


class Allocator:
    def __init__(
        self, kube: KubeClient, grid: GridHealth, settings: InfobloxSettings, stamp: ClusterStamp | None = None
    ) -> None:
        self.stamp = stamp or ClusterStamp("")
        self._kube = kube
        self._grid = grid
        self._settings = settings
        self._states: dict[PoolRef, PoolState] = {}
        self.late_commits = LateCommits()

    async def index(self, pool: Pool, connection: Connection) -> PoolState:
        """The pool's index, rebuilt by a search on CAPI-Pool when missing, stale, or of another instance."""
        state = self._states.get(pool.ref)
        age = time.monotonic() - state.built_at if state is not None else 0.0
        if state is None or state.instance != connection.name or age > self._settings.index_resync_seconds:
            obj_type = object_type(pool)
            answer = await connection.client.search(
                obj_type, RETURN_FIELDS[obj_type], extattrs={EA_POOL: pool.label}, paging=True
            )
            fresh = PoolState(connection.name, time.monotonic())
            if state is not None:
                fresh.uncertain, fresh.exhausted = state.uncertain, state.exhausted
            for raw in answer:
                obj = parse_object(obj_type, raw)
                if obj is not None and obj.claim_uid:
                    fresh.by_claim.setdefault(obj.claim_uid, []).append(obj)
            doubled = sum(1 for objects in fresh.by_claim.values() if len(objects) > 1)
            log.info("pool index built", pool=str(pool.ref), objects=len(answer), claims_with_duplicates=doubled)
            self._states[pool.ref] = state = fresh
        return state

    def released_elsewhere(self, ref: PoolRef) -> None:
        """An address of the pool came free: full subnets are worth asking again."""
        state = self._states.get(ref)
        if state is not None:
            state.exhausted.clear()

    def forget_claim(self, ref: PoolRef, claim_uid: str) -> None:
        """Forget what the index says the claim owns in the pool (an object of it was deleted elsewhere): the claim's
        next allocation searches the grid instead of trusting the index."""
        state = self._states.get(ref)
        if state is not None:
            state.by_claim.pop(claim_uid, None)

    # --- allocation ----------------------------------------------------------------------------------------------

    def quick(self, pool: Pool, connection: Connection, claim: ClaimContext, existing: Allocation) -> Allocation | None:
        """The claim's existing address without a request, when the index says the claim owns exactly it."""
        state = self._states.get(pool.ref)
        if state is None or state.instance != connection.name or claim.uid in state.uncertain:
            return None
        owned = state.by_claim.get(claim.uid) or []
        if len(owned) != 1 or not same(owned[0].address, existing.address):
            return None
        annotations = {**existing.annotations, **self.allocation_of(pool, connection, owned[0]).annotations}
        return Allocation(existing.address, existing.prefix, existing.gateway, annotations)

    async def allocate(
        self, pool: Pool, connection: Connection, claim: ClaimContext, existing: Allocation | None
    ) -> Allocation:
        """The claim's address (see the module's contract); BackendError when it cannot be had."""
        try:
            return await self._allocate(pool, connection, claim, existing)
        except WapiError as error:
            raise await self.translate_error(connection, error, str(pool.ref)) from error

    async def _allocate(
        self, pool: Pool, connection: Connection, claim: ClaimContext, existing: Allocation | None
    ) -> Allocation:
        state = await self.index(pool, connection)
        network_view = pool.spec.network_view or connection.spec.default_network_view
        job = Allocating(pool, connection, state, claim, network_view)
        if claim.uid in state.uncertain:
            await self._resolve(job)
        if existing is not None:
            return await self._hold_existing(job, existing)
        asked = claim.requested_address
        if asked is not None:
            return await self.allocate_requested(job, asked)
        held = state.by_claim.get(claim.uid)
        if held and await self._still_alone(job, held[0]):
            return self.allocation_of(pool, connection, held[0])
        hostname = await self.hostname_for(pool, connection, claim)
        tried_gateway: set[str] = set()
        for target in self._order(pool, state):
            while True:
                value = next_available(target, network_view)
                try:
                    obj = await self.create_object(job, value, hostname)
                except WapiError as error:
                    if error.problem is not Problem.EXHAUSTED:
                        raise await self.translate_error(connection, error, str(target)) from error
                    state.exhausted[target.argument] = time.monotonic() + self._settings.exhausted_skip_seconds
                    log.info("subnet full; trying the next", claim=str(claim), pool=str(pool.ref), target=str(target))
                    break
                if target.gateway is None or not same(obj.address, target.gateway):
                    state.exhausted.pop(target.argument, None)
                    log.debug(
                        "grid object created",
                        claim=str(claim),
                        pool=str(pool.ref),
                        address=obj.address,
                        ref=obj.ref,
                        target=str(target),
                    )
                    return self.allocation_of(pool, connection, obj, target)
                if target.argument in tried_gateway:
                    raise AllocationFailedError(f"the grid keeps handing out gateway {target.gateway} of {target}")
                tried_gateway.add(target.argument)
                await self._reserve_gateway(job, obj, target)
        names = ", ".join(str(t) for t in pool.targets)
        raise PoolExhaustedError(f"{pool.ref} has no free address on the grid in {names}; add a subnet or free some")

    async def _still_alone(self, job: Allocating, obj: GridObject) -> bool:
        """Whether the claim may keep its object `obj`. One made for a requested address may never have had its
        keep-if-alone check (a crash after the POST): it is checked now, and deleted if it shares its address."""
        if not obj.requested:
            return True
        try:
            await requested.keep_alone(job.connection, job.pool, job.claim, job.network_view, obj.address, obj)
        except AllocationFailedError as error:
            job.state.by_claim.pop(job.claim.uid, None)
            log.info(
                "unchecked object shared its address; deleted", claim=str(job.claim), ref=obj.ref, why=error.message
            )
            return False
        return True

    def _order(self, pool: Pool, state: PoolState) -> list[Target]:
        """The pool's targets in order, those found full a moment ago last."""
        now = time.monotonic()
        fresh = [t for t in pool.targets if state.exhausted.get(t.argument, 0.0) <= now]
        return fresh + [t for t in pool.targets if t not in fresh]

    async def create_object(
        self, job: Allocating, address: str, hostname: str | None, *, for_request: bool = False
    ) -> GridObject:
        """POST one object for the claim at `address` (literal or func:), resolving lost replies; WapiError if not.
        `for_request`: the object is made for a requested address, and its comment says so."""
        pool, connection, state, claim = job.pool, job.connection, job.state, job.claim
        obj_type = object_type(pool)
        marks = claim_marks(pool, claim, requested=for_request, stamp=self.stamp.marks(connection))
        if obj_type == HOST:
            assert hostname is not None and pool.spec.host_record is not None
            dns_view = pool.spec.host_record.dns_view or connection.spec.default_dns_view
            payload = host_payload(pool, address, hostname, dns_view, marks)
            if not pool.spec.host_record.configure_for_dns:  # NIOS may not refuse a second IPAM-only record
                found = await same_name(job, hostname, dns_view, None)
                if found is not None:
                    return found
        else:
            payload = fixed_payload(pool, address, job.network_view, marks)
        if obj_type == HOST:  # as real clients do; the grid refuses it unless the DNS view belongs to it
            payload["network_view"] = job.network_view
        attempts, resent = self._settings.create_attempts, False
        for attempt in range(attempts):
            try:
                raw = await connection.client.create(obj_type, payload, RETURN_FIELDS[obj_type])
            except WapiError as error:
                last = attempt + 1 == attempts
                if error.problem is Problem.UNKNOWN_OUTCOME:
                    found = await self._after_lost_reply(job, error)
                    if found is not None:
                        return found
                    resent = True
                elif error.problem is Problem.CONFLICT and obj_type == HOST and hostname is not None:
                    found = await same_name(job, hostname, payload["view"], error)
                    assert found is not None  # given the error, same_name raises rather than answer None
                    return found
                elif error.problem is not Problem.UNAVAILABLE:
                    raise
                if last:
                    raise
                await asyncio.sleep(self._settings.retry.delay(attempt))
                continue
            obj = parse_object(obj_type, raw)
            if obj is None:
                raise WapiError(Problem.REFUSED, f"the grid answered a {obj_type} without an address")
            state.by_claim[claim.uid] = [obj]
            if resent:  # the lost request may still be carried out: look again a little later
                self._watch_late_commits(job, obj)
            return obj
        raise AssertionError("unreachable")

    async def _after_lost_reply(self, job: Allocating, error: WapiError) -> GridObject | None:
        """The claim's object, if the grid made it although its reply was lost; None (to send again) if not."""
        job.state.uncertain.add(job.claim.uid)
        log.warning(
            "reply to an allocation lost; searching the grid for it",
            claim=str(job.claim),
            pool=str(job.pool.ref),
            detail=error.detail,
        )
        return await self._resolve(job)

    def _watch_late_commits(self, job: Allocating, obj: GridObject) -> None:
        """After a resent POST, look for a late commit of the lost one twice: past the grid's timeout, past ours."""
        timeout = float(job.connection.spec.request_timeout_seconds)
        delays = (2 * timeout, job.connection.client.call_timeout)
        holds = self._holds(job.pool.ref, job.claim.uid)
        self.late_commits.watch(job.connection, job.claim, obj, holds, delays)

    def _holds(self, ref: PoolRef, claim_uid: str) -> Callable[[], set[str]]:
        def holds() -> set[str]:
            state = self._states.get(ref)
            return {o.ref for o in state.by_claim.get(claim_uid, [])} if state is not None else set()

        return holds

    async def _resolve(self, job: Allocating) -> GridObject | None:
        """Search the grid for what the claim owns after a lost reply; the claim stays uncertain if that fails."""
        pool, state, claim = job.pool, job.state, job.claim
        found = await owned(job.connection, (object_type(pool),), claim.uid)
        state.uncertain.discard(claim.uid)
        if not found:
            state.by_claim.pop(claim.uid, None)
            return None
        state.by_claim[claim.uid] = found
        log.info("lost allocation found on the grid", claim=str(claim), pool=str(pool.ref), address=found[0].address)
        return found[0]

    async def _hold_existing(self, job: Allocating, existing: Allocation) -> Allocation:
        """Make the claim own exactly the address its IPAddress names, and nothing else."""
        pool, connection, state, claim = job.pool, job.connection, job.state, job.claim
        mine = state.by_claim.get(claim.uid) or []
        if not any(same(o.address, existing.address) for o in mine):
            mine = await owned(connection, types_for_version(pool.version), claim.uid)
        keep = next((o for o in mine if same(o.address, existing.address)), None)
        if keep is None:
            keep = await self._take_over(job, existing.address)
        if keep is None:
            keep = await self._reserve_literal(job, existing.address)
        for other in mine:
            if other.ref != keep.ref:  # e.g. the object of a reply that was lost, then searched for too early
                await connection.client.delete(other.ref)
                log.info("surplus object of a claim released", claim=str(claim), pool=str(pool.ref), ref=other.ref)
        state.by_claim[claim.uid] = [keep]
        annotations = {**existing.annotations, **self.allocation_of(pool, connection, keep).annotations}
        return Allocation(existing.address, existing.prefix, existing.gateway, annotations)

    async def _take_over(self, job: Allocating, address: str) -> GridObject | None:
        """The object at `address` this claim held under another uid, re-keyed to the claim (see `take_over`)."""
        try:
            stamp = self.stamp.marks(job.connection)
            return await take_over(job.connection, job.pool, job.claim, job.network_view, address, stamp)
        except WapiError as error:
            raise await self.translate_error(job.connection, error, f"address {address}") from error

    async def _reserve_literal(self, job: Allocating, address: str) -> GridObject:
        pool, connection, claim, view = job.pool, job.connection, job.claim, job.network_view
        fixed = FIXED_V4 if pool.version == 4 else FIXED_V6
        field_name = "ipv4addr" if pool.version == 4 else "ipv6addr"
        try:
            holders = await connection.client.search(fixed, [field_name], {field_name: address, "network_view": view})
            holders += await connection.client.search(HOST, ["name"], {field_name: address})
            if holders:
                raise AllocationFailedError(
                    f"address {address} of IPAddress {claim} is held on the grid by {holders[0]['_ref']}, which "
                    f"the claim does not own; delete one of the two"
                )
            hostname = await self.hostname_for(pool, connection, claim)
            obj = await self.create_object(job, address, hostname)
        except WapiError as error:
            raise await self.translate_error(connection, error, f"address {address}") from error
        log.info("address of an existing IPAddress reserved on the grid", claim=str(claim), address=address)
        return obj

    async def _reserve_gateway(self, job: Allocating, obj: GridObject, target: Target) -> None:
        """The grid handed out the gateway: give it back, and hold it with a reservation of the pool's own."""
        assert target.gateway is not None
        pool, connection = job.pool, job.connection
        payload = fixed_payload(pool, target.gateway, job.network_view, gateway_marks(pool))
        try:
            await connection.client.delete(obj.ref)
            job.state.by_claim.pop(job.claim.uid, None)
            await connection.client.create(FIXED_V4 if pool.version == 4 else FIXED_V6, payload, ["network_view"])
        except WapiError as error:
            if error.problem is not Problem.CONFLICT:
                raise await self.translate_error(connection, error, str(target)) from error
        log.warning("gateway was free on the grid; reserved it", pool=str(pool.ref), gateway=target.gateway)

    async def hostname_for(self, pool: Pool, connection: Connection, claim: ClaimContext) -> str | None:
        settings = pool.spec.host_record
        if settings is None or object_type(pool) != HOST:
            return None
        try:
            if settings.hostname_source == "claimName":
                return host_fqdn(claim.name, settings.dns_zone, claim, "claim name")
            name = await machine_name(self._kube, claim, self._settings.owner_depth)
            return host_fqdn(name, settings.dns_zone, claim, "Machine name")
        except HostnameError as error:
            raise AllocationFailedError(str(error)) from error

    def allocation_of(
        self, pool: Pool, connection: Connection, obj: GridObject, target: Target | None = None
    ) -> Allocation:
        target = target or pool.target_of(obj.address)
        annotations = {ANNOTATION_REF: obj.ref, ANNOTATION_INSTANCE: connection.name}
        if obj.name:
            annotations[ANNOTATION_HOSTNAME] = obj.name
        return Allocation(obj.address, target.prefix, target.gateway, annotations)

    # --- release -------------------------------------------------------------------------------------------------

    async def release(
        self, connection: Connection, pool_ref: PoolRef, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        """Delete every object the claim owns (see `ownership.release_owned`); BackendError if the grid fails."""
        try:
            await release_owned(connection, pool_ref, claim, allocation)
        except WapiError as error:
            raise await self.translate_error(connection, error, "release") from error
        state = self._states.get(pool_ref)
        if state is not None:
            state.by_claim.pop(claim.uid, None)
            state.uncertain.discard(claim.uid)
            state.exhausted.clear()

    async def translate_error(self, connection: Connection, error: WapiError, what: str) -> BackendError:
        return await translate(self._grid, connection, error, what)

    async def allocate_requested(self, job: Allocating, address: str) -> Allocation:
        """The claim's requested `address`, held on the grid (see `requested`'s contract)."""
        pool, connection, state, claim, view = job.pool, job.connection, job.state, job.claim, job.network_view
        target, why = requested.target_for(pool, address)
        if target is None:
            raise AllocationFailedError(requested_address_outside(address, pool.ref, why))
        found = await requested.holders(connection, pool, view, address)
        kept = next((o for o in found if o.claim_uid == claim.uid), None)
        for other in state.by_claim.get(claim.uid) or []:  # never handed out: no IPAddress names the claim
            if kept is None or other.ref != kept.ref:
                await connection.client.delete(other.ref)
                log.info("claim's other object deleted", claim=str(claim), pool=str(pool.ref), ref=other.ref)
        state.by_claim.pop(claim.uid, None)
        others = [o for o in found if o.claim_uid != claim.uid]
        if kept is None and any(
            requested.earlier_self(o, pool, claim) for o in others
        ):  # a restore or a move: re-keyed, checked
            kept = await take_over(connection, pool, claim, view, address, self.stamp.marks(connection))
        if kept is None and others:
            raise requested.held(address, pool, others[0])
        if kept is None:
            try:
                hostname = await self.hostname_for(pool, connection, claim)
                kept = await self.create_object(job, address, hostname, for_request=True)
            except WapiError as error:
                if error.problem is Problem.CONFLICT:  # another fixed address got there first?
                    found = await requested.holders(connection, pool, view, address)
                    if found:
                        raise requested.held(address, pool, found[0]) from error
                raise await self.translate_error(connection, error, f"address {address}") from error
            state.by_claim.pop(claim.uid, None)
        if not same(kept.address, address):  # a host record of the claim's name, made earlier at another address
            await connection.client.delete(kept.ref)
            raise AllocationFailedError(f"claim {claim} held {kept.ref}; deleted it, asking again", retry_after=1.0)
        await requested.keep_alone(connection, pool, claim, view, address, kept)
        state.by_claim[claim.uid] = [kept]
        log.info("requested address held", claim=str(claim), pool=str(pool.ref), address=address, ref=kept.ref)
        return self.allocation_of(pool, connection, kept, target)


async def same_name(job: Allocating, hostname: str, dns_view: str, error: WapiError | None) -> GridObject | None:
    """The host record of this name where the pool's records go, if it carries the claim's uid; None if there is
    none (`error`, the POST's refusal, is raised instead when given); AllocationFailed if another holds it. An
    IPAM-only pool's records are searched by name alone, keeping the answers whose view is blank.

    A pool that keeps its records out of DNS (configureForDNS false) makes IPAM-only records. NIOS keeps those in a
    blank pseudo-view (`view` is a single space, the reference ends in `/%20`): a search naming a DNS view never
    answers them, and one naming view " " is a 404 ("View  not found"). Whether NIOS refuses a second IPAM-only
    record of one name is not public, so such a pool looks before it posts (one GET per new record) rather than
    rely on a refusal."""
    state, claim = job.state, job.claim
    assert job.pool.spec.host_record is not None
    ipam_only = not job.pool.spec.host_record.configure_for_dns
    query = {"name": hostname} if ipam_only else {"name": hostname, "view": dns_view}
    answer = await job.connection.client.search(HOST, RETURN_FIELDS[HOST], query)
    if ipam_only:
        answer = [raw for raw in answer if not str(raw.get("view") or "").strip()]
    holders = [obj for obj in (parse_object(HOST, raw) for raw in answer) if obj is not None]
    mine = [obj for obj in holders if obj.claim_uid == claim.uid]
    if mine:
        state.by_claim[claim.uid] = mine
        return mine[0]
    if not holders:
        if error is not None:
            raise error
        return None
    owner = holders[0].extattrs
    if holders[0].claim_uid:
        whose = f"it belongs to claim {owner.get('CAPI-Claim-Namespace')}/{owner.get('CAPI-Claim-Name')}"
    else:
        whose = "it was not made by this provider and is never adopted"
    where = "as an IPAM-only host record (not in DNS)" if ipam_only else f"in DNS view {dns_view}"
    raise AllocationFailedError(
        f"host record {hostname} already exists {where} ({whose}); delete or rename it, or change the pool's "
        "hostnameSource"
    )
