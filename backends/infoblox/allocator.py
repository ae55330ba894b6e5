"""Allocation against the grid: dynamic, requested and adopted addresses of one claim.

Contract:
- Steady state is one POST per allocation, `func:nextavailableip:<subnet or range>,<network view>` with the
  ownership attributes and `_return_fields` (a hostRecord pool with configureForDNS false first searches its host
  name: two requests). The grid picks the address atomically, so two claims never get the same one.
- Idempotent: a claim that owns an object in the pool's index gets it back with no request. With `existing` the
  claim's object at that address is kept and any other it owns deleted; else one of ours recorded for the same claim
  namespace, name and pool under another uid is re-keyed (`clusterctl move`, a restore); else the address is
  reserved literally unless another object holds it. An object without the claim's uid is never adopted or deleted.
- Subnets and ranges are asked in the pool's order, a full one last for `exhausted_skip_seconds`; all full gives
  PoolExhausted. A pool gateway the grid hands out is reserved once (CAPI-Pool only) and the next address served.
- A 503 is retried with backoff. A lost POST marks the claim uncertain: the grid is searched on CAPI-Claim-UID
  before anything is posted again, and after a resent POST a late commit of the lost one is looked for and deleted.
- A requested address (`allocate_requested`) the pool could not hand out fails with `requested_address_outside`,
  sending nothing; one held by another object fails with `requested_address_held`, naming it. NIOS lets host records
  share an address, so an object made or adopted for a requested address is kept only if alone at its last search
  (`keep_alone`), else deleted; a claim that gave way to a racer asks again after a short random delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from backends.backoff import CONTENDED_WAIT_SECONDS, race_retry_seconds
from backends.infoblox.client import Failure, WapiError
from backends.infoblox.connections import Connection
from backends.infoblox.hostname import HostnameError, host_fqdn, machine_name
from backends.infoblox.ledger import (
    HOST,
    RETURN_FIELDS,
    Allocating,
    GridObject,
    Ledger,
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
    requested_address_held,
    requested_address_outside,
)
from ipam_provider.runtime.kube.client import KubeClient


class Allocator:
    def __init__(self, kube: KubeClient, ledger: Ledger, settings: InfobloxSettings) -> None:
        self.ledger = ledger
        self._kube = kube
        self._settings = settings
        self._late_checks: set[asyncio.Task[None]] = set()

    def quick(self, pool: Pool, connection: Connection, claim: ClaimContext, existing: Allocation) -> Allocation | None:
        """The claim's existing address without a request, when the index says the claim owns exactly it."""
        index = self.ledger.indexes.get(pool.ref)
        if index is None or index.instance != connection.name or claim.uid in index.uncertain:
            return None
        owned = index.by_claim.get(claim.uid) or []
        if len(owned) != 1 or not same(owned[0].address, existing.address):
            return None
        return self._existing(existing, pool, connection, owned[0])

    def _existing(self, existing: Allocation, pool: Pool, connection: Connection, obj: GridObject) -> Allocation:
        annotations = {**existing.annotations, **self.allocation_of(pool, connection, obj).annotations}
        return Allocation(existing.address, existing.prefix, existing.gateway, annotations)

    async def allocate(
        self, pool: Pool, connection: Connection, claim: ClaimContext, existing: Allocation | None
    ) -> Allocation:
        """The claim's address (see the module's contract); BackendError when it cannot be had."""
        try:
            job = Allocating(pool, connection, await self.ledger.index(pool, connection), claim)
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
            raise await self.ledger.grid.translate(connection, error, str(pool.ref)) from error

    async def _allocate_next(self, job: Allocating) -> Allocation:
        """The next free address of the pool's first subnet or range that has one."""
        pool, index = job.pool, job.index
        hostname = await self.hostname_for(job)
        tried_gateway: set[str] = set()
        now = time.monotonic()  # the pool's targets in order, those found full a moment ago last
        for target in sorted(pool.targets, key=lambda t: index.exhausted.get(t.argument, 0.0) > now):
            next_ip = f"func:nextavailableip:{target.argument},{job.connection.network_view(pool)}"
            while True:
                try:
                    obj = await self.create_object(job, next_ip, hostname)
                except WapiError as error:
                    if error.failure is not Failure.EXHAUSTED:
                        raise await self.ledger.grid.translate(job.connection, error, str(target)) from error
                    index.exhausted[target.argument] = time.monotonic() + self._settings.exhausted_skip_seconds
                    job.log.info("subnet full; trying the next", target=str(target))
                    break
                if target.gateway is None or not same(obj.address, target.gateway):
                    index.exhausted.pop(target.argument, None)
                    job.log.debug("grid object created", address=obj.address, ref=obj.ref, target=str(target))
                    return self.allocation_of(pool, job.connection, obj, target)
                if target.argument in tried_gateway:
                    raise AllocationFailedError(f"the grid keeps handing out gateway {target.gateway} of {target}")
                tried_gateway.add(target.argument)
                try:  # the grid handed out the gateway: give it back, and hold it with a reservation of the pool's own
                    await self.ledger.delete(job, obj.ref)
                    await self.ledger.post_gateway(job, target.gateway)
                except WapiError as error:
                    if error.failure is not Failure.CONFLICT:
                        raise await self.ledger.grid.translate(job.connection, error, str(target)) from error
                job.log.warning("gateway was free on the grid; reserved it", gateway=target.gateway)
        names = ", ".join(str(t) for t in pool.targets)
        raise PoolExhaustedError(f"{pool.ref} has no free address on the grid in {names}; add a subnet or free some")

    async def _still_alone(self, job: Allocating, obj: GridObject) -> bool:
        """Whether the claim may keep its object `obj`. One made for a requested address may never have had its
        keep-if-alone check (a crash after the POST): it is checked now, and deleted if it shares its address."""
        try:
            if obj.requested:
                await self.keep_alone(job, obj.address, obj)
        except AllocationFailedError as error:
            job.index.by_claim.pop(job.claim.uid, None)
            job.log.info("unchecked object shared its address; deleted", ref=obj.ref, why=error.message)
            return False
        return True

    async def create_object(
        self, job: Allocating, address: str, hostname: str | None, *, for_request: bool = False
    ) -> GridObject:
        """POST one object for the claim at `address` (literal or func:), resolving lost replies; WapiError if not.
        `for_request`: the object is made for a requested address, and its comment says so."""
        host = object_type(job.pool) == HOST and hostname is not None
        if host and job.pool.spec.host_record and not job.pool.spec.host_record.configure_for_dns:
            found = await self.same_name(job, str(hostname), None)  # NIOS may not refuse a second IPAM-only record
            if found is not None:
                return found
        attempts, resent = self._settings.create_attempts, False
        for attempt in range(attempts):
            try:
                obj = await self.ledger.post(job, address, hostname, requested=for_request)
            except WapiError as error:
                if error.failure is Failure.UNKNOWN_OUTCOME:
                    job.index.uncertain.add(job.claim.uid)
                    job.log.warning("reply to an allocation lost; searching the grid for it", detail=error.detail)
                    found = await self.ledger.resync_claim(job)
                    if found is not None:
                        return found
                    resent = True
                elif error.failure is Failure.CONFLICT and host:
                    found = await self.same_name(job, str(hostname), error)
                    assert found is not None  # given the error, same_name raises rather than answer None
                    return found
                elif error.failure is not Failure.UNAVAILABLE:
                    raise
                if attempt + 1 == attempts:
                    raise
                await asyncio.sleep(self._settings.retry.delay(attempt))
                continue
            if resent:  # the lost request may still be carried out: look again a little later
                task = asyncio.create_task(self._remove_late_commits(job, obj))
                self._late_checks.add(task)
                task.add_done_callback(self._late_checks.discard)
            return obj
        raise AssertionError("unreachable")

    async def _remove_late_commits(self, job: Allocating, kept: GridObject) -> None:
        """After a resent POST, look for a late commit of the lost one twice (past the grid's timeout, past ours):
        delete the claim's objects of `kept`'s type other than `kept`, while the index lists `kept` for the claim or
        nothing (released). Failures are logged: release deletes every owned object."""
        for delay in (2 * float(job.connection.spec.request_timeout_seconds), job.connection.client.call_timeout):
            await asyncio.sleep(delay)
            index = self.ledger.indexes.get(job.pool.ref)
            held = {o.ref for o in index.by_claim.get(job.claim.uid, [])} if index is not None else set()
            if held and kept.ref not in held:
                return  # the claim holds something else now: allocation sorts it out
            try:
                for obj in await self.ledger.owned(job.connection, (kept.obj_type,), job.claim.uid):
                    if obj.ref != kept.ref:
                        await job.connection.client.delete(obj.ref)
                        job.log.info("late object of a lost request released", ref=obj.ref)
            except WapiError as error:
                job.log.info("cannot look for a late object", detail=error.detail)

    async def close(self) -> None:
        """Stop looking for late commits (the process is stopping)."""
        for task in list(self._late_checks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _hold_existing(self, job: Allocating, existing: Allocation) -> Allocation:
        """Make the claim own exactly the address its IPAddress names, and nothing else: its object there, else one it
        held under an earlier uid or a literal reservation (`take_over_or_post`), unless another object holds it."""
        address = existing.address
        mine = job.index.by_claim.get(job.claim.uid) or []
        if not any(same(o.address, address) for o in mine):
            mine = await self.ledger.owned(job.connection, types_for_version(job.pool.version), job.claim.uid)
        keep = next((o for o in mine if same(o.address, address)), None)
        if keep is None:
            try:
                found = await self.ledger.holders(job.connection, job.pool, address)
                keep = await self.take_over_or_post(job, address, found, None, requested=False)
            except WapiError as error:
                raise await self.ledger.grid.translate(job.connection, error, f"address {address}") from error
            if keep is None:
                raise AllocationFailedError(
                    f"address {address} of IPAddress {job.claim} is held on the grid by {found[0].ref}, which the "
                    "claim does not own; delete one of the two"
                )
            if not found:
                job.log.info("address of an existing IPAddress reserved on the grid", address=address)
        for other in (o for o in mine if o.ref != keep.ref):  # e.g. a lost reply's object, searched for too early
            await self.ledger.delete(job, other.ref)
            job.log.info("surplus object of a claim released", ref=other.ref)
        job.index.by_claim[job.claim.uid] = [keep]
        return self._existing(existing, job.pool, job.connection, keep)

    async def take_over_or_post(
        self, job: Allocating, address: str, found: list[GridObject], hostname: str | None, *, requested: bool = True
    ) -> GridObject | None:
        """The claim's object at `address`, given what a search `found` there: the claim's object under an earlier uid
        (`clusterctl move`, a restore) re-keyed; else, when nothing holds it, one posted (`create_object`, named
        `hostname` or by `hostname_for`); None when only others hold it: another claim's object is never taken."""
        earlier = next((o for o in found if o.earlier_self(job.pool, job.claim) and same(o.address, address)), None)
        if earlier is not None:
            return await self.ledger.rekey(job, earlier)
        if found:
            return None
        hostname = hostname or await self.hostname_for(job)
        return await self.create_object(job, address, hostname, for_request=requested)

    async def hostname_for(self, job: Allocating) -> str | None:
        """The host record name of the claim (None for a fixedAddress pool); AllocationFailed when none can be had."""
        settings, claim = job.pool.spec.host_record, job.claim
        if settings is None or object_type(job.pool) != HOST:
            return None
        try:
            if claim.endpoint_of is not None:  # a Cluster's control-plane endpoint: its API server's name
                return host_fqdn(f"{claim.endpoint_of}-apiserver", settings.dns_zone, claim, "Cluster name")
            if settings.hostname_source == "claimName":
                return host_fqdn(claim.name, settings.dns_zone, claim, "claim name")
            name = await machine_name(self._kube, claim, self._settings.owners)
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
        found = await self.ledger.holders(connection, pool, address)
        kept = next((o for o in found if o.claim_uid == claim.uid), None)
        for other in job.index.by_claim.get(claim.uid) or []:  # never handed out: no IPAddress names the claim
            if kept is None or other.ref != kept.ref:
                await self.ledger.delete(job, other.ref)
                job.log.info("claim's other object deleted", ref=other.ref)
        job.index.by_claim.pop(claim.uid, None)
        try:
            kept = kept or await self.take_over_or_post(job, address, found, None)  # a restore or a move: re-keyed
        except WapiError as error:
            if found:  # the take-over's PUT, not a POST
                raise
            if error.failure is Failure.CONFLICT:  # another fixed address got there first?
                found = await self.ledger.holders(connection, pool, address)
                if found:
                    raise held(address, pool, found[0]) from error
            raise await self.ledger.grid.translate(connection, error, f"address {address}") from error
        if kept is None:
            raise held(address, pool, found[0])
        if not found:  # posted: the lost reply's search or the name's may have recorded other objects of the claim
            job.index.by_claim.pop(claim.uid, None)
        if not same(kept.address, address):  # a host record of the claim's name, made earlier at another address
            await self.ledger.delete(job, kept.ref)
            raise AllocationFailedError(f"claim {claim} held {kept.ref}; deleted it, asking again", retry_after=1.0)
        await self.keep_alone(job, address, kept)
        job.index.by_claim[claim.uid] = [kept]
        job.log.info("requested address held", address=address, ref=kept.ref)
        return self.allocation_of(pool, connection, kept, target)

    async def keep_alone(self, job: Allocating, address: str, kept: GridObject) -> None:
        """Keep `kept` only if nothing else holds the address at the last search; else delete it and fail (held,
        retried soon when only other claims' objects shared it). The racer whose reference sorts first searches
        again every CONTENDED_WAIT_SECONDS, up to the instance's request timeout."""
        deadline = asyncio.get_running_loop().time() + float(job.connection.spec.request_timeout_seconds)
        while True:
            found = await self.ledger.holders(job.connection, job.pool, address)
            await self._drop_duplicates(job, kept, found)
            others = [o for o in found if o.ref != kept.ref and o.claim_uid != job.claim.uid]
            if not others:
                return
            race = all(o.claim_uid for o in others)
            first = race and kept.ref < min(o.ref for o in others)
            if not first or asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(CONTENDED_WAIT_SECONDS)
        await self.ledger.delete(job, kept.ref)
        message = "requested address taken at the same time by another object; ours deleted"
        job.log.info(message, address=address, ref=kept.ref, other=others[0].ref)
        raise held(address, job.pool, others[0], race_retry_seconds() if race else None)

    async def _drop_duplicates(self, job: Allocating, kept: GridObject, found: list[GridObject]) -> None:
        """Another object of this claim beside `kept` (another attempt for the same claim): the one whose reference
        sorts later goes. When that is `kept`, it is deleted and the claim asks again soon (and adopts the other)."""
        twins = [o for o in found if o.claim_uid == job.claim.uid and o.ref != kept.ref]
        for later in (twin for twin in twins if twin.ref > kept.ref):
            await self.ledger.delete(job, later.ref)
        if any(twin.ref < kept.ref for twin in twins):
            await self.ledger.delete(job, kept.ref)
            message = f"claim {job.claim} holds another object at {kept.address}; asking again"
            raise AllocationFailedError(message, retry_after=1.0)

    async def same_name(self, job: Allocating, hostname: str, error: WapiError | None) -> GridObject | None:
        """The host record of this name where the pool's records go, if it carries the claim's uid (then recorded as
        the claim's); None if there is none (`error`, the POST's refusal, is raised instead when given);
        AllocationFailed if another holds it. IPAM-only records sit in NIOS's blank view: searched by name alone."""
        assert job.pool.spec.host_record is not None
        ipam_only, dns_view = not job.pool.spec.host_record.configure_for_dns, job.connection.dns_view(job.pool)
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
        whose = "it was not made by this provider and is never adopted"
        whose = f"it belongs to {holders[0].describe()}" if holders[0].claim_uid else whose
        where = "as an IPAM-only host record (not in DNS)" if ipam_only else f"in DNS view {dns_view}"
        raise AllocationFailedError(
            f"host record {hostname} already exists {where} ({whose}); delete or rename it, or change the pool's "
            "hostnameSource"
        )


def held(address: str, pool: Pool, holder: GridObject, retry_after: float | None = None) -> AllocationFailedError:
    return AllocationFailedError(requested_address_held(address, pool.ref, holder.describe()), retry_after=retry_after)
