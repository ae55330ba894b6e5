"""Allocation against the grid: dynamic, requested and adopted addresses of one claim.

Contract:
- Steady state is one WAPI request per allocation: a POST of a fixedaddress / ipv6fixedaddress / record:host with
  `func:nextavailableip:<subnet or range>,<network view>`, the ownership attributes and `_return_fields`, so the
  answer carries the address and no follow-up GET is needed. A hostRecord pool with configureForDNS false first
  searches its host name among IPAM-only records (`same_name`): two requests. The grid picks the address
  atomically, so two claims never get the same one, even from two controllers.
- Idempotent: a claim that owns an object in the pool's index gets it back, with no request. With `existing` (an
  IPAddress names the claim's address) the object at that address owned by the claim is kept and any other object
  the claim owns is deleted (the remains of a lost reply); if the grid holds nothing for the claim, an object of
  ours at that address recorded for the same claim namespace, name and pool under another CAPI-Claim-UID is taken
  over (re-keyed to this claim: the claim was moved by `clusterctl move` or restored from a backup, and got a new
  uid); otherwise the address is reserved literally, unless another object holds it.
- Subnets and ranges are asked in the pool's order; "Cannot find 1 available IP address(es)" moves on to the next
  (a full one is asked last for `exhausted_skip_seconds`), and when all are full the claim gets PoolExhausted.
- A 503 is retried with backoff. A lost or timed-out POST has an unknown outcome: the claim is marked uncertain and
  the grid is searched on CAPI-Claim-UID before anything is posted again, so a committed object is found and used.
  After a resent POST, the lost one's late commit is looked for twice and deleted (`LateCommits`).
- Ownership is the CAPI-Claim-UID attribute and nothing else: a same-named host record or an object at the same
  address without it is never adopted and never deleted.
- A pool gateway that the grid hands out (nothing on the grid reserves it) is reserved once with a fixedaddress
  carrying only CAPI-Pool, and the claim is served the next address.
- A new claim with the requested-address annotation (`allocate_requested`; a fulfilled claim keeps its address
  whatever it asks for) gets an object at exactly that address (`ipv4addr`/`ipv6addr` set to it instead of
  `func:nextavailableip`). The address must be one the pool could hand out (`Pool.target_for`), else the claim
  fails with `requested_address_outside` and no request is sent. The objects at that address in the pool's network
  view are searched (two GETs): one the claim owns is adopted; one of ours recording this claim's namespace, name
  and pool under another uid is re-keyed and adopted; any other makes the claim fail with
  `requested_address_held`, naming its holder. Else the object is posted with the literal address; NIOS refuses a
  second fixed address at one address in a network view (`Client.Ibap.Data.Conflict`), and the holder is then
  searched and named.
- NIOS lets a host record (without DHCP) share an address with other host records and with a fixed address, so
  every object made or adopted for a requested address is kept only if alone (`keep_alone`): the address is
  searched again, and an object not alone there at its last search is deleted and the claim fails as held. Of two
  kept objects, the one searched last would have seen the other, which was committed before its POST returned. So
  that a race has a winner, the racer whose reference sorts first waits for the others (which give way at once) for
  up to the instance's request timeout; a claim that gave way asks again after a short random delay (1-3 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

import structlog

from backends.backoff import CONTENDED_WAIT_SECONDS, race_retry_seconds
from backends.infoblox.client import Problem, WapiError
from backends.infoblox.connections import Connection
from backends.infoblox.hostname import HostnameError, host_fqdn, machine_name
from backends.infoblox.ledger import (
    HOST,
    RETURN_FIELDS,
    Allocating,
    GridObject,
    Ledger,
    claim_marks,
    fixed_payload,
    fixed_type,
    gateway_marks,
    host_payload,
    next_available,
    object_type,
    parse_object,
    same,
    types_for_version,
)
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import ANNOTATION_HOSTNAME, ANNOTATION_INSTANCE, ANNOTATION_REF, Pool, Target
from ipam_provider.backend.contract import (
    Allocation,
    AllocationFailedError,
    ClaimContext,
    PoolExhaustedError,
    PoolRef,
    requested_address_held,
    requested_address_outside,
)
from ipam_provider.runtime.kube.client import KubeClient

log = structlog.get_logger(__name__)


class Allocator:
    """Serves claims from the pools' grid objects (see the module's contract)."""

    def __init__(self, kube: KubeClient, ledger: Ledger, settings: InfobloxSettings) -> None:
        self.ledger = ledger
        self.late_commits = LateCommits(ledger)
        self._kube = kube
        self._settings = settings

    def quick(self, pool: Pool, connection: Connection, claim: ClaimContext, existing: Allocation) -> Allocation | None:
        """The claim's existing address without a request, when the index says the claim owns exactly it."""
        index = self.ledger.cached(pool.ref)
        if index is None or index.instance != connection.name or claim.uid in index.uncertain:
            return None
        owned = index.by_claim.get(claim.uid) or []
        if len(owned) != 1 or not same(owned[0].address, existing.address):
            return None
        annotations = {**existing.annotations, **self.allocation_of(pool, connection, owned[0]).annotations}
        return Allocation(existing.address, existing.prefix, existing.gateway, annotations)

    async def job(self, pool: Pool, connection: Connection, claim: ClaimContext) -> Allocating:
        """The claim's business with the pool, its index built when needed."""
        index = await self.ledger.index(pool, connection)
        return Allocating(pool, connection, index, claim, connection.network_view(pool))

    async def allocate(
        self, pool: Pool, connection: Connection, claim: ClaimContext, existing: Allocation | None
    ) -> Allocation:
        """The claim's address (see the module's contract); BackendError when it cannot be had."""
        try:
            job = await self.job(pool, connection, claim)
            if claim.uid in job.index.uncertain:
                await self.ledger.resync_claim(job)
            if existing is not None:
                return await self._hold_existing(job, existing)
            if claim.requested_address is not None:
                return await self.allocate_requested(job, claim.requested_address)
            held = job.index.by_claim.get(claim.uid)
            if held and await self._still_alone(job, held[0]):
                return self.allocation_of(pool, connection, held[0])
            return await self._allocate_next(job)
        except WapiError as error:
            raise await self.ledger.translate(connection, error, str(pool.ref)) from error

    async def _allocate_next(self, job: Allocating) -> Allocation:
        """The next free address of the pool's first subnet or range that has one."""
        pool, index, claim = job.pool, job.index, job.claim
        hostname = await self.hostname_for(pool, job.connection, claim)
        tried_gateway: set[str] = set()
        for target in self._order(pool, job):
            while True:
                try:
                    obj = await self.create_object(job, next_available(target, job.network_view), hostname)
                except WapiError as error:
                    if error.problem is not Problem.EXHAUSTED:
                        raise await self.ledger.translate(job.connection, error, str(target)) from error
                    index.exhausted[target.argument] = time.monotonic() + self._settings.exhausted_skip_seconds
                    log.info("subnet full; trying the next", claim=str(claim), pool=str(pool.ref), target=str(target))
                    break
                if target.gateway is None or not same(obj.address, target.gateway):
                    index.exhausted.pop(target.argument, None)
                    log.debug(
                        "grid object created",
                        claim=str(claim),
                        pool=str(pool.ref),
                        address=obj.address,
                        ref=obj.ref,
                        target=str(target),
                    )
                    return self.allocation_of(pool, job.connection, obj, target)
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
            await self.keep_alone(job, obj.address, obj)
        except AllocationFailedError as error:
            job.index.by_claim.pop(job.claim.uid, None)
            log.info(
                "unchecked object shared its address; deleted", claim=str(job.claim), ref=obj.ref, why=error.message
            )
            return False
        return True

    def _order(self, pool: Pool, job: Allocating) -> list[Target]:
        """The pool's targets in order, those found full a moment ago last."""
        now = time.monotonic()
        fresh = [t for t in pool.targets if job.index.exhausted.get(t.argument, 0.0) <= now]
        return fresh + [t for t in pool.targets if t not in fresh]

    async def create_object(
        self, job: Allocating, address: str, hostname: str | None, *, for_request: bool = False
    ) -> GridObject:
        """POST one object for the claim at `address` (literal or func:), resolving lost replies; WapiError if not.
        `for_request`: the object is made for a requested address, and its comment says so."""
        pool, connection = job.pool, job.connection
        obj_type = object_type(pool)
        marks = claim_marks(pool, job.claim, self.ledger.stamp.marks(connection), requested=for_request)
        if obj_type == HOST:
            assert hostname is not None and pool.spec.host_record is not None
            dns_view = pool.spec.host_record.dns_view or connection.spec.default_dns_view
            payload = host_payload(pool, address, hostname, dns_view, marks)
            payload["network_view"] = job.network_view  # as real clients do; refused unless the DNS view is in it
            if not pool.spec.host_record.configure_for_dns:  # NIOS may not refuse a second IPAM-only record
                found = await self.same_name(job, hostname, dns_view, None)
                if found is not None:
                    return found
        else:
            payload = fixed_payload(pool, address, job.network_view, marks)
        attempts, resent = self._settings.create_attempts, False
        for attempt in range(attempts):
            try:
                obj = await self.ledger.post(job, obj_type, payload)
            except WapiError as error:
                if error.problem is Problem.UNKNOWN_OUTCOME:
                    found = await self._after_lost_reply(job, error)
                    if found is not None:
                        return found
                    resent = True
                elif error.problem is Problem.CONFLICT and obj_type == HOST and hostname is not None:
                    found = await self.same_name(job, hostname, payload["view"], error)
                    assert found is not None  # given the error, same_name raises rather than answer None
                    return found
                elif error.problem is not Problem.UNAVAILABLE:
                    raise
                if attempt + 1 == attempts:
                    raise
                await asyncio.sleep(self._settings.retry.delay(attempt))
                continue
            if resent:  # the lost request may still be carried out: look again a little later
                self._watch_late_commits(job, obj)
            return obj
        raise AssertionError("unreachable")

    async def _after_lost_reply(self, job: Allocating, error: WapiError) -> GridObject | None:
        """The claim's object, if the grid made it although its reply was lost; None (to send again) if not."""
        job.index.uncertain.add(job.claim.uid)
        log.warning(
            "reply to an allocation lost; searching the grid for it",
            claim=str(job.claim),
            pool=str(job.pool.ref),
            detail=error.detail,
        )
        return await self.ledger.resync_claim(job)

    def _watch_late_commits(self, job: Allocating, obj: GridObject) -> None:
        """After a resent POST, look for a late commit of the lost one twice: past the grid's timeout, past ours."""
        timeout = float(job.connection.spec.request_timeout_seconds)
        delays = (2 * timeout, job.connection.client.call_timeout)
        self.late_commits.watch(job, obj, self._holds(job.pool.ref, job.claim.uid), delays)

    def _holds(self, ref: PoolRef, claim_uid: str) -> Callable[[], set[str]]:
        def holds() -> set[str]:
            index = self.ledger.cached(ref)
            return {o.ref for o in index.by_claim.get(claim_uid, [])} if index is not None else set()

        return holds

    async def _hold_existing(self, job: Allocating, existing: Allocation) -> Allocation:
        """Make the claim own exactly the address its IPAddress names, and nothing else."""
        pool, connection, claim = job.pool, job.connection, job.claim
        mine = job.index.by_claim.get(claim.uid) or []
        if not any(same(o.address, existing.address) for o in mine):
            mine = await self.ledger.owned(connection, types_for_version(pool.version), claim.uid)
        keep = next((o for o in mine if same(o.address, existing.address)), None)
        keep = keep or await self._adopt_or_reserve(job, existing.address)
        for other in mine:
            if other.ref != keep.ref:  # e.g. the object of a reply that was lost, then searched for too early
                await self.ledger.delete(job, other.ref)
                log.info("surplus object of a claim released", claim=str(claim), pool=str(pool.ref), ref=other.ref)
        job.index.by_claim[claim.uid] = [keep]
        annotations = {**existing.annotations, **self.allocation_of(pool, connection, keep).annotations}
        return Allocation(existing.address, existing.prefix, existing.gateway, annotations)

    async def _adopt_or_reserve(self, job: Allocating, address: str) -> GridObject:
        """The object of ours at `address` that this claim held under an earlier uid, re-keyed to the claim; else the
        address reserved literally for the claim, unless another object holds it."""
        claim = job.claim
        try:
            found = await self.ledger.holders(job.connection, job.pool, job.network_view, address)
            kept = await self.take_over(job, found, address)
            if kept is not None:
                return kept
            if found:
                raise AllocationFailedError(
                    f"address {address} of IPAddress {claim} is held on the grid by {found[0].ref}, which the claim "
                    "does not own; delete one of the two"
                )
            obj = await self.create_object(job, address, await self.hostname_for(job.pool, job.connection, claim))
        except WapiError as error:
            raise await self.ledger.translate(job.connection, error, f"address {address}") from error
        log.info("address of an existing IPAddress reserved on the grid", claim=str(claim), address=address)
        return obj

    async def take_over(self, job: Allocating, found: Sequence[GridObject], address: str) -> GridObject | None:
        """The first of `found` at `address` that is the claim's object under an earlier uid (a `clusterctl move` or
        a restore gives the claim a new uid), re-keyed to the claim; None if there is none. An object recorded for
        another claim is never taken."""
        earlier = next((o for o in found if o.earlier_self(job.pool, job.claim) and same(o.address, address)), None)
        return await self.ledger.rekey(job, earlier) if earlier is not None else None

    async def _reserve_gateway(self, job: Allocating, obj: GridObject, target: Target) -> None:
        """The grid handed out the gateway: give it back, and hold it with a reservation of the pool's own."""
        assert target.gateway is not None
        pool, connection = job.pool, job.connection
        payload = fixed_payload(pool, target.gateway, job.network_view, gateway_marks(pool))
        try:
            await self.ledger.delete(job, obj.ref)
            await connection.client.create(fixed_type(pool.version), payload, ["network_view"])
        except WapiError as error:
            if error.problem is not Problem.CONFLICT:
                raise await self.ledger.translate(connection, error, str(target)) from error
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

    async def allocate_requested(self, job: Allocating, address: str) -> Allocation:
        """The claim's requested `address`, held on the grid (see the module's contract)."""
        pool, connection, claim = job.pool, job.connection, job.claim
        target, why = pool.target_for(address)
        if target is None:
            raise AllocationFailedError(requested_address_outside(address, pool.ref, why))
        found = await self.ledger.holders(connection, pool, job.network_view, address)
        kept = next((o for o in found if o.claim_uid == claim.uid), None)
        for other in job.index.by_claim.get(claim.uid) or []:  # never handed out: no IPAddress names the claim
            if kept is None or other.ref != kept.ref:
                await self.ledger.delete(job, other.ref)
                log.info("claim's other object deleted", claim=str(claim), pool=str(pool.ref), ref=other.ref)
        job.index.by_claim.pop(claim.uid, None)
        others = [o for o in found if o.claim_uid != claim.uid]
        kept = kept or await self.take_over(job, others, address)  # a restore or a move: re-keyed, checked
        if kept is None and others:
            raise held(address, pool, others[0])
        if kept is None:
            kept = await self._create_requested(job, address)
        if not same(kept.address, address):  # a host record of the claim's name, made earlier at another address
            await self.ledger.delete(job, kept.ref)
            raise AllocationFailedError(f"claim {claim} held {kept.ref}; deleted it, asking again", retry_after=1.0)
        await self.keep_alone(job, address, kept)
        job.index.by_claim[claim.uid] = [kept]
        log.info("requested address held", claim=str(claim), pool=str(pool.ref), address=address, ref=kept.ref)
        return self.allocation_of(pool, connection, kept, target)

    async def _create_requested(self, job: Allocating, address: str) -> GridObject:
        """The claim's object posted at the requested `address`; AllocationFailed naming the holder when NIOS
        refuses it as a second fixed address there."""
        try:
            hostname = await self.hostname_for(job.pool, job.connection, job.claim)
            kept = await self.create_object(job, address, hostname, for_request=True)
        except WapiError as error:
            if error.problem is Problem.CONFLICT:  # another fixed address got there first?
                found = await self.ledger.holders(job.connection, job.pool, job.network_view, address)
                if found:
                    raise held(address, job.pool, found[0]) from error
            raise await self.ledger.translate(job.connection, error, f"address {address}") from error
        job.index.by_claim.pop(job.claim.uid, None)
        return kept

    async def keep_alone(self, job: Allocating, address: str, kept: GridObject) -> None:
        """Keep `kept` only if nothing else holds the address at the last search; else delete it and fail (held).

        When only objects of this provider's other claims share the address (a race), the one whose reference sorts
        first searches again every CONTENDED_WAIT_SECONDS, for up to the instance's request timeout (long enough for
        the others' POST replies to arrive), while the others give way at once. A racer that gives way fails with a
        short random retry, so that racers that all gave way do not race again in step. Safety rests on the last
        search alone: an object is kept only if it was alone there after its POST."""
        claim = job.claim
        deadline = asyncio.get_running_loop().time() + float(job.connection.spec.request_timeout_seconds)
        while True:
            found = await self.ledger.holders(job.connection, job.pool, job.network_view, address)
            await self._drop_duplicates(job, kept, found)
            others = [o for o in found if o.ref != kept.ref and o.claim_uid != claim.uid]
            if not others:
                return
            race = all(o.claim_uid for o in others)
            first = race and kept.ref < min(o.ref for o in others)
            if not first or asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(CONTENDED_WAIT_SECONDS)
        await self.ledger.delete(job, kept.ref)
        log.info(
            "requested address taken at the same time by another object; ours deleted",
            claim=str(claim),
            pool=str(job.pool.ref),
            address=address,
            ref=kept.ref,
            other=others[0].ref,
        )
        raise held(address, job.pool, others[0], race_retry_seconds() if race else None)

    async def _drop_duplicates(self, job: Allocating, kept: GridObject, found: list[GridObject]) -> None:
        """Another object of this claim beside `kept` (another attempt for the same claim): the one whose reference
        sorts later goes. When that is `kept`, it is deleted and the claim asks again soon (and adopts the other)."""
        twins = [o for o in found if o.claim_uid == job.claim.uid and o.ref != kept.ref]
        for twin in twins:
            if twin.ref > kept.ref:
                await self.ledger.delete(job, twin.ref)
        if any(twin.ref < kept.ref for twin in twins):
            await self.ledger.delete(job, kept.ref)
            raise AllocationFailedError(
                f"claim {job.claim} holds another object at {kept.address}; asking again", retry_after=1.0
            )

    async def same_name(
        self, job: Allocating, hostname: str, dns_view: str, error: WapiError | None
    ) -> GridObject | None:
        """The host record of this name where the pool's records go, if it carries the claim's uid (recorded as the
        claim's); None if there is none (`error`, the POST's refusal, is raised instead when given);
        AllocationFailed if another holds it.

        A pool that keeps its records out of DNS (configureForDNS false) makes IPAM-only records, which NIOS keeps in
        a blank pseudo-view (`view` is a single space): a search naming a DNS view never answers them, and one naming
        view " " is a 404. Such a pool searches by name alone, keeping the answers whose view is blank, and looks
        before it posts (one GET per new record) rather than rely on a refusal NIOS may not give."""
        assert job.pool.spec.host_record is not None
        ipam_only = not job.pool.spec.host_record.configure_for_dns
        query = {"name": hostname} if ipam_only else {"name": hostname, "view": dns_view}
        answer = await job.connection.client.search(HOST, RETURN_FIELDS[HOST], query)
        if ipam_only:
            answer = [raw for raw in answer if not str(raw.get("view") or "").strip()]
        holders = [obj for obj in (parse_object(HOST, raw) for raw in answer) if obj is not None]
        mine = [obj for obj in holders if obj.claim_uid == job.claim.uid]
        if mine:
            job.index.by_claim[job.claim.uid] = mine
            return mine[0]
        if not holders:
            if error is not None:
                raise error
            return None
        whose = (
            f"it belongs to {holders[0].describe()}"
            if holders[0].claim_uid
            else "it was not made by this provider and is never adopted"
        )
        where = "as an IPAM-only host record (not in DNS)" if ipam_only else f"in DNS view {dns_view}"
        raise AllocationFailedError(
            f"host record {hostname} already exists {where} ({whose}); delete or rename it, or change the pool's "
            "hostnameSource"
        )


def held(address: str, pool: Pool, holder: GridObject, retry_after: float | None = None) -> AllocationFailedError:
    return AllocationFailedError(requested_address_held(address, pool.ref, holder.describe()), retry_after=retry_after)


class LateCommits:
    """Removes the object a timed-out or lost POST may still create after the claim was served by a second POST.

    `watch` is called when a POST's outcome was unknown, a search found nothing, and the POST was sent again. Twice
    (after `delays`) it searches the claim's objects of `kept`'s type and deletes those other than `kept` (the one
    the claim was given), as long as the claim holds `kept` or has been released (`holds` answers the refs the
    pool's index lists for the claim). Failures are logged; release deletes every owned object anyway.
    """

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._tasks: set[asyncio.Task[None]] = set()

    def watch(self, job: Allocating, kept: GridObject, holds: Callable[[], set[str]], delays: Sequence[float]) -> None:
        task = asyncio.create_task(self._check(job, kept, holds, delays))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check(
        self, job: Allocating, kept: GridObject, holds: Callable[[], set[str]], delays: Sequence[float]
    ) -> None:
        claim, connection = job.claim, job.connection
        for delay in delays:
            await asyncio.sleep(delay)
            held = holds()
            if held and kept.ref not in held:
                return  # the claim holds something else now: allocation sorts it out
            try:
                for obj in await self._ledger.owned(connection, (kept.obj_type,), claim.uid):
                    if obj.ref != kept.ref:
                        await connection.client.delete(obj.ref)
                        log.info("late object of a lost request released", claim=str(claim), ref=obj.ref)
            except WapiError as error:
                log.info("cannot look for a late object", claim=str(claim), detail=error.detail)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
