"""The grid objects this backend owns, the per-pool index of them, and how a pool's grid is reached.

Contract:
- Every object made for a claim (a fixedaddress, ipv6fixedaddress or record:host) carries CAPI-Claim-UID (the one
  attribute ownership is decided on), CAPI-Claim-Namespace, CAPI-Claim-Name, CAPI-Cluster-Name (when the claim names
  a cluster), CAPI-Pool (`<namespace>/<pool name>`, what the index searches on), the pool's own extra attributes,
  and CAPI-Cluster-Identity when it is known and the grid defines it (`ClusterStamp.marks`; NIOS refuses an
  undefined attribute). A gateway reservation carries CAPI-Pool only.
- A claim owns exactly the objects whose CAPI-Claim-UID is its uid. `release` deletes what `owned` answers and
  nothing else: the IPAddress's ref annotation only chooses the type searched first, so an edited annotation or a
  reference NIOS re-used is never deleted. A 404 on DELETE counts as released.
- The index (one paged CAPI-Pool search per pool and process, again every `index_resync_seconds` or when the pool
  moves to another instance) maps claim uids to the objects they own; every write updates it in the same method.
"""

from __future__ import annotations

import ipaddress
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from backends.infoblox.client import PAGE_SIZE, Failure, WapiError
from backends.infoblox.connections import Connection, Connections, GridHealth, InstanceProblem
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import (
    ANNOTATION_REF,
    EA_CLAIM_NAME,
    EA_CLAIM_NAMESPACE,
    EA_CLAIM_UID,
    EA_CLUSTER_IDENTITY,
    EA_CLUSTER_NAME,
    EA_POOL,
    HOST_RECORD,
    Pool,
    parse_pool,
)
from backends.validation import PoolSpecError
from ipam_provider.backend.contract import Allocation, ClaimContext, PoolNotReadyError, PoolRef, ReportCondition
from ipam_provider.backend.repair import Made, made_by
from ipam_provider.common import Object

log = structlog.get_logger(__name__)

FIXED_V4, FIXED_V6, HOST = "fixedaddress", "ipv6fixedaddress", "record:host"
ALL_TYPES = (FIXED_V4, FIXED_V6, HOST)
ZERO_MAC = "00:00:00:00:00:00"
RETURN_FIELDS = {
    FIXED_V4: ("ipv4addr", "network_view", "extattrs", "comment"),
    FIXED_V6: ("ipv6addr", "network_view", "extattrs", "comment"),
    HOST: ("name", "view", "ipv4addrs", "ipv6addrs", "extattrs", "comment"),
}
REQUESTED_COMMENT = "Cluster API IPAddressClaim, requested address: "


@dataclass(frozen=True)
class GridObject:
    """A fixed address or host record as the grid answered it."""

    ref: str
    obj_type: str
    address: str
    extattrs: Mapping[str, str]
    name: str | None = None
    comment: str = ""

    @property
    def claim_uid(self) -> str | None:
        return self.extattrs.get(EA_CLAIM_UID)

    @property
    def requested(self) -> bool:
        """Whether the object was made for a requested address (its keep-if-alone check may not have run)."""
        return self.comment.startswith(REQUESTED_COMMENT)

    def describe(self) -> str:
        """Who holds the object, for a claim's message."""
        if self.claim_uid:
            return f"claim {self.extattrs.get(EA_CLAIM_NAMESPACE)}/{self.extattrs.get(EA_CLAIM_NAME)}"
        if self.extattrs.get(EA_POOL):
            return f"the gateway reservation of InfobloxIPPool {self.extattrs[EA_POOL]} ({self.ref})"
        return f"a {self.obj_type} not managed by this provider ({self.ref})"

    def earlier_self(self, pool: Pool, claim: ClaimContext) -> bool:
        """Whether this is the claim's object under an earlier uid (its namespace, name and pool recorded)."""
        recorded = tuple(self.extattrs.get(name) for name in (EA_CLAIM_NAMESPACE, EA_CLAIM_NAME, EA_POOL))
        other_uid = bool(self.claim_uid) and self.claim_uid != claim.uid
        return other_uid and recorded == (claim.namespace, claim.name, pool.label)


def parse_object(obj_type: str, raw: Mapping[str, Any]) -> GridObject | None:
    """A GridObject from a WAPI answer (None if it carries no address)."""
    ref, entries = raw.get("_ref"), host_entries(raw) if obj_type == HOST else [raw]
    address = (entries[0].get("ipv4addr") or entries[0].get("ipv6addr")) if entries else None
    if not isinstance(ref, str) or not isinstance(address, str):
        return None
    extattrs = raw.get("extattrs")
    eas = {
        str(name): str(entry.get("value")) if isinstance(entry, Mapping) else str(entry)
        for name, entry in (extattrs.items() if isinstance(extattrs, Mapping) else ())
    }
    name, comment = raw.get("name"), raw.get("comment")
    name, comment = name if isinstance(name, str) else None, comment if isinstance(comment, str) else ""
    return GridObject(ref, obj_type, address, eas, name, comment)


def host_entries(raw: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    lists = (raw.get(key) for key in ("ipv4addrs", "ipv6addrs"))
    return [entry for entries in lists if isinstance(entries, list) for entry in entries if isinstance(entry, Mapping)]


def object_type(pool: Pool) -> str:
    return HOST if pool.spec.mode == HOST_RECORD else fixed_type(pool.version)


def fixed_type(version: int) -> str:
    return FIXED_V4 if version == 4 else FIXED_V6


def address_field(version: int) -> str:
    return "ipv4addr" if version == 4 else "ipv6addr"


def type_of_ref(ref: str) -> str:
    return ref.split("/", 1)[0]


def types_for_version(version: int | None) -> tuple[str, ...]:
    """Every type an object of this IP family (None: any) could have been created as."""
    return {4: (FIXED_V4, HOST), 6: (FIXED_V6, HOST)}.get(version or 0, ALL_TYPES)


def canonical(address: str) -> str | None:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def same(a: str, b: str) -> bool:
    """Whether two address strings name one address (text that is none: the same text)."""
    return (canonical(a) or a) == (canonical(b) or b)


def wapi_extattrs(eas: Mapping[str, str]) -> dict[str, dict[str, str]]:
    return {name: {"value": value} for name, value in eas.items()}


def fixed_payload(version: int, address: str, view: str, eas: Mapping[str, str], comment: str, identity: str) -> Object:
    """A fixedaddress (MAC of zeros: a reservation no DHCP client matches) or an ipv6fixedaddress (a DUID-UUID
    derived from `identity`, so that no two objects share one)."""
    fixed = {"mac": ZERO_MAC} if version == 4 else {"duid": duid_for(identity)}
    fixed[address_field(version)] = address
    return {"network_view": view, "comment": comment, "extattrs": wapi_extattrs(eas), **fixed}


def duid_for(identity: str) -> str:
    """A DUID-UUID (RFC 6355: type 4 followed by 16 octets) for a claim uid or any other identity."""
    try:
        value = uuid.UUID(identity)
    except ValueError:
        value = uuid.uuid5(uuid.NAMESPACE_URL, identity)
    return ":".join(f"{octet:02x}" for octet in b"\x00\x04" + value.bytes)


WHY_UNSTAMPED = (
    f"it carries no {EA_CLUSTER_IDENTITY} extensible attribute, so it may belong to another management cluster "
    "sharing this grid (objects made before identities were stamped, or while the grid did not define the attribute)"
)
CONDITION = "ClusterIdentityStamped"


@dataclass(frozen=True)
class ClusterStamp:
    identity: str  # "" when unknown

    def defined(self, connection: Connection) -> bool:
        """Whether the connection's last grid check found the CAPI-Cluster-Identity definition."""
        return connection.health is not None and EA_CLUSTER_IDENTITY in connection.health.ea_names

    def marks(self, connection: Connection) -> Mapping[str, str]:
        return {EA_CLUSTER_IDENTITY: self.identity} if self.identity and self.defined(connection) else {}

    def judge(self, obj: GridObject) -> Made:
        return made_by(obj.extattrs.get(EA_CLUSTER_IDENTITY) or "", self.identity)

    def condition(self, connection: Connection) -> ReportCondition | None:
        """The pool's ClusterIdentityStamped condition (None when the backend knows no identity)."""
        if not self.identity:
            return None
        if self.defined(connection):
            message = f"new grid objects carry {EA_CLUSTER_IDENTITY}={self.identity} (this management cluster)"
            return ReportCondition(CONDITION, True, "Stamped", message)
        message = (
            f"the grid has no {EA_CLUSTER_IDENTITY} extensible attribute definition: grid objects are not stamped with "
            f"this management cluster's identity ({self.identity}), so the repair loop only reports their leaks and "
            "never releases them; define it (STRING) in Grid Manager, or let the provider's API user create extensible "
            "attribute definitions"
        )
        return ReportCondition(CONDITION, False, "ExtensibleAttributeMissing", message)


@dataclass
class PoolIndex:
    instance: str
    built_at: float
    by_claim: dict[str, list[GridObject]] = field(default_factory=dict)
    uncertain: set[str] = field(default_factory=set)
    exhausted: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Allocating:
    pool: Pool
    connection: Connection
    index: PoolIndex
    claim: ClaimContext

    @property
    def log(self) -> Any:
        return log.bind(claim=str(self.claim), pool=str(self.pool.ref))


class Ledger:
    """The grid objects of every pool this process serves, the pools' last good specs and their indexes."""

    def __init__(
        self, connections: Connections, grid: GridHealth, settings: InfobloxSettings, stamp: ClusterStamp
    ) -> None:
        self.connections = connections
        self.grid = grid
        self.stamp = stamp
        self._settings = settings
        self.indexes: dict[PoolRef, PoolIndex] = {}  # each pool's as it stands (`index` rebuilds it)
        self.known: dict[PoolRef, Pool] = {}  # last good spec of each pool, until its deletion is observed

    def forget(self, pool_ref: PoolRef) -> None:
        """Drop what is kept of a deleted pool (its IPAddresses name their instance, for releases after it)."""
        self.indexes.pop(pool_ref, None)
        self.known.pop(pool_ref, None)

    def parse(self, pool_ref: PoolRef, pool: Object) -> Pool:
        """The pool's spec, remembered in `known`; PoolNotReadyError when it cannot be used."""
        try:
            parsed = self.known[pool_ref] = parse_pool(pool_ref, pool)
        except PoolSpecError as error:
            raise PoolNotReadyError(f"{pool_ref} is invalid: {error}; fix the pool's spec") from error
        return parsed

    async def connect(self, instance: str, pool_ref: PoolRef, *, unrefused: bool = False) -> Connection:
        """The instance's connection for pool `pool_ref`; PoolNotReadyError (caused by the InstanceProblem, if any)
        when the instance cannot be used or does not allow the pool's namespace, or with `unrefused` while its refused
        credentials are not due for a re-check."""
        try:
            connection = await self.connections.connect(instance, pool_ref.namespace or "")
        except InstanceProblem as problem:
            raise PoolNotReadyError(f"InfobloxInstance {instance}: {problem.message}") from problem
        refused = self.grid.refused(connection) if unrefused else None
        if refused is not None:
            raise PoolNotReadyError(f"InfobloxInstance {instance} is not ready ({refused.reason}): {refused.message}")
        return connection

    async def pool_connection(self, pool_ref: PoolRef, pool: Object) -> tuple[Pool, Connection]:
        """The parsed pool and its instance's unrefused connection; PoolNotReadyError when either cannot be used."""
        parsed = self.parse(pool_ref, pool)
        return parsed, await self.connect(parsed.instance, pool_ref, unrefused=True)

    async def index(self, pool: Pool, connection: Connection) -> PoolIndex:
        """The pool's index, rebuilt by a search on CAPI-Pool when missing, stale, or of another instance."""
        index = self.indexes.get(pool.ref)
        age = time.monotonic() - index.built_at if index is not None else 0.0
        if index is not None and index.instance == connection.name and age <= self._settings.index_resync_seconds:
            return index
        obj_type = object_type(pool)
        answer = await connection.client.search(
            obj_type, RETURN_FIELDS[obj_type], extattrs={EA_POOL: pool.label}, page_size=PAGE_SIZE
        )
        fresh = PoolIndex(connection.name, time.monotonic())
        if index is not None:
            fresh.uncertain, fresh.exhausted = index.uncertain, index.exhausted
        for obj in (parse_object(obj_type, raw) for raw in answer):
            if obj is not None and obj.claim_uid:
                fresh.by_claim.setdefault(obj.claim_uid, []).append(obj)
        doubled = sum(1 for objects in fresh.by_claim.values() if len(objects) > 1)
        log.info("pool index built", pool=str(pool.ref), objects=len(answer), claims_with_duplicates=doubled)
        self.indexes[pool.ref] = fresh
        return fresh

    async def owned(self, connection: Connection, types: Sequence[str], claim_uid: str) -> list[GridObject]:
        """Every object of `types` whose CAPI-Claim-UID is `claim_uid` (one search per type)."""
        found: list[GridObject] = []
        for obj_type in types:
            try:
                answer = await connection.client.search(
                    obj_type, RETURN_FIELDS[obj_type], extattrs={EA_CLAIM_UID: claim_uid}
                )
            except WapiError as error:
                if error.failure is Failure.UNKNOWN_EA:  # the attribute is not even defined: nothing carries it
                    return []
                raise
            parsed = (parse_object(obj_type, raw) for raw in answer)
            found += [o for o in parsed if o is not None and o.claim_uid == claim_uid]
        return found

    async def holders(self, connection: Connection, pool: Pool, address: str) -> list[GridObject]:
        """The fixed addresses and host records at `address` in the pool's network view (two searches)."""
        query = {address_field(pool.version): address, "network_view": connection.network_view(pool)}
        found: list[GridObject] = []
        for obj_type in (fixed_type(pool.version), HOST):
            for raw in await connection.client.search(obj_type, RETURN_FIELDS[obj_type], query):
                obj = parse_object(obj_type, raw)
                held = [str(e.get("ipv4addr") or e.get("ipv6addr") or "") for e in host_entries(raw)]
                if obj is not None and (obj_type != HOST or any(same(at, address) for at in held)):
                    found.append(obj)
        return found

    async def post(self, job: Allocating, address: str, hostname: str | None, *, requested: bool = False) -> GridObject:
        """One POST of the claim's object at `address` (literal or func:), recorded as the claim's only one; a host
        record is named `hostname`; `requested` goes into the comment (`GridObject.requested`). WapiError if refused."""
        pool, claim, connection = job.pool, job.claim, job.connection
        view = connection.network_view(pool)
        eas = {**pool.spec.extensible_attributes, **self.stamp.marks(connection), EA_CLAIM_UID: claim.uid}
        eas.update({EA_CLAIM_NAMESPACE: claim.namespace, EA_CLAIM_NAME: claim.name, EA_POOL: pool.label})
        if claim.cluster_name:
            eas[EA_CLUSTER_NAME] = claim.cluster_name
        comment = f"{REQUESTED_COMMENT if requested else 'Cluster API IPAddressClaim '}{claim}"[:256]
        obj_type = object_type(pool)
        if obj_type != HOST:
            payload = fixed_payload(pool.version, address, view, eas, comment, claim.uid)
        else:
            settings, field = pool.spec.host_record, address_field(pool.version)
            assert settings is not None and hostname is not None
            dns = {"name": hostname, "view": connection.dns_view(pool), "configure_for_dns": settings.configure_for_dns}
            payload = {**dns, f"{field}s": [{field: address}], "comment": comment, "extattrs": wapi_extattrs(eas)}
            payload["network_view"] = view  # as real clients do; refused unless the DNS view is in it
        raw = await connection.client.create(obj_type, payload, RETURN_FIELDS[obj_type])
        obj = parse_object(obj_type, raw)
        if obj is None:
            raise WapiError(Failure.REFUSED, f"the grid answered a {obj_type} without an address")
        job.index.by_claim[claim.uid] = [obj]
        return obj

    async def post_gateway(self, job: Allocating, gateway: str) -> None:
        """One POST of the fixed address that keeps the pool's gateway from being handed out (CAPI-Pool only)."""
        pool, view = job.pool, job.connection.network_view(job.pool)
        comment = f"Gateway of InfobloxIPPool {pool.label}, reserved so the Cluster API IPAM provider skips it"
        payload = fixed_payload(pool.version, gateway, view, {EA_POOL: pool.label}, comment, pool.uid)
        await job.connection.client.create(fixed_type(pool.version), payload, ["network_view"])

    async def rekey(self, job: Allocating, obj: GridObject) -> GridObject:
        """Re-key `obj` (one of ours recording the claim under an earlier uid) to the claim, stamped (one PUT),
        recorded as the claim's only object."""
        extattrs = {**obj.extattrs, **self.stamp.marks(job.connection), EA_CLAIM_UID: job.claim.uid}
        await job.connection.client.update(obj.ref, {"extattrs": wapi_extattrs(extattrs)})
        job.log.info("grid object re-keyed to the claim's new UID", ref=obj.ref, previous_uid=obj.claim_uid)
        kept = GridObject(obj.ref, obj.obj_type, obj.address, extattrs, obj.name, obj.comment)
        job.index.by_claim[job.claim.uid] = [kept]
        return kept

    async def delete(self, job: Allocating, ref: str) -> bool:
        """DELETE one object of the claim, and drop it from the claim's index entry; False if it was already gone."""
        deleted = await job.connection.client.delete(ref)
        _drop(job.index, job.claim.uid, ref)
        return deleted

    async def resync_claim(self, job: Allocating) -> GridObject | None:
        """The claim's objects of the pool's type, searched (after a lost reply) and recorded as the index's truth;
        the claim stays uncertain if the search fails."""
        found = await self.owned(job.connection, (object_type(job.pool),), job.claim.uid)
        job.index.uncertain.discard(job.claim.uid)
        if not found:
            job.index.by_claim.pop(job.claim.uid, None)
            return None
        job.index.by_claim[job.claim.uid] = found
        job.log.info("lost allocation found on the grid", address=found[0].address)
        return found[0]

    async def release(
        self, connection: Connection, pool_ref: PoolRef, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        """Delete every object the claim owns (see the module's contract); BackendError when the grid fails."""
        ref = allocation.annotations.get(ANNOTATION_REF) if allocation is not None else None
        address = canonical(allocation.address) if allocation is not None else None
        family = types_for_version(ipaddress.ip_address(address).version if address else None)
        first: Sequence[str] = (type_of_ref(ref),) if ref and type_of_ref(ref) in ALL_TYPES else family
        bound = log.bind(claim=str(claim), pool=str(pool_ref))
        try:
            objects = await self.owned(connection, first, claim.uid)
            if not objects and first != family:  # recorded again as another type since, after the mode changed
                objects = await self.owned(connection, [t for t in family if t not in first], claim.uid)
            for obj in objects:
                deleted = await connection.client.delete(obj.ref)
                bound.info("grid object released", address=obj.address, ref=obj.ref, already_gone=not deleted)
        except WapiError as error:
            raise await self.grid.translate(connection, error, "release") from error
        if ref and ref not in {obj.ref for obj in objects}:
            bound.info("object named by the IPAddress is not owned by the claim (or is gone); left alone", ref=ref)
        index = self.indexes.get(pool_ref)
        if index is not None:
            index.by_claim.pop(claim.uid, None)
            index.uncertain.discard(claim.uid)
            index.exhausted.clear()

    async def release_leak(self, connection: Connection, pool_ref: PoolRef, claim_uid: str, ref: str) -> bool:
        """DELETE a leaked object of the pool (the repair loop's), dropped from the index with its claim's uncertainty;
        False if already gone."""
        deleted = await connection.client.delete(ref)
        index = self.indexes.get(pool_ref)
        if index is not None:
            _drop(index, claim_uid, ref)
            index.uncertain.discard(claim_uid)
            index.exhausted.clear()
        return deleted


def _drop(index: PoolIndex, claim_uid: str, ref: str) -> None:
    kept = [o for o in index.by_claim.pop(claim_uid, []) if o.ref != ref]
    if kept:
        index.by_claim[claim_uid] = kept
