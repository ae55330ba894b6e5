"""The contract between the reconcilers and a pool backend.

A backend serves one or more pool kinds. It is called with plain data: the pool's identity (`PoolRef`), the pool
object as the API server returned it, and a `ClaimContext`; never for a paused claim, cluster or pool, and never
twice at once for one claim. Calls for one pool are serialised unless the backend's `capabilities()` declare
`concurrent_claims=True`: then the backend itself keeps them from handing out one address twice. Every
method must be idempotent and safe to repeat after a crash at any point.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ipam_provider.common import Object, cap_int64

if TYPE_CHECKING:
    from ipam_provider.runtime.kube.client import KubeClient

REQUESTED_ADDRESS_ANNOTATION = "ipam.cluster.x-k8s.io/requested-address"


@dataclass(frozen=True)
class PoolKind:
    """A pool custom resource served by a backend."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def ref(self, namespace: str | None, name: str) -> PoolRef:
        """The pool of this kind called `name`, as seen from `namespace` (ignored for a cluster-scoped kind)."""
        return PoolRef(self.group, self.kind, namespace if self.namespaced else None, name)


@dataclass(frozen=True, order=True)
class PoolRef:
    """The identity of one pool. `namespace` is None for a cluster-scoped pool."""

    group: str
    kind: str
    namespace: str | None
    name: str

    def __str__(self) -> str:
        if self.namespace is None:
            return f"{self.kind}/{self.name}"
        return f"{self.kind}/{self.namespace}/{self.name}"

    @classmethod
    def from_object(cls, pool: Mapping[str, Any]) -> PoolRef:
        """The identity of a pool object as the API server returns it (with `apiVersion` and `kind`)."""
        meta = pool["metadata"]
        group = str(pool.get("apiVersion", "")).split("/")[0]
        return cls(group, str(pool.get("kind", "")), meta.get("namespace"), meta["name"])


@dataclass(frozen=True)
class ClaimContext:
    """What a backend may know about the claim it serves."""

    namespace: str
    name: str
    uid: str
    cluster_name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owner_references: Sequence[Object] = ()
    endpoint_of: str | None = None
    """The Cluster (of the claim's namespace) whose control-plane endpoint the claim holds, or None: a machine's
    claim, or anyone's (docs/control-plane-endpoints.md). A backend may name or mark such an address as a VIP."""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @functools.cached_property
    def requested_address(self) -> str | None:
        """The canonical text of the address REQUESTED_ADDRESS_ANNOTATION asks for, or None when absent or blank.
        Raises AllocationFailedError when it is not a plain IP address, or is an IPv4-mapped or IPv4-compatible
        IPv6 address (the message names the IPv4 address to write instead)."""
        text = (self.annotations.get(REQUESTED_ADDRESS_ANNOTATION) or "").strip()
        if not text:
            return None
        try:
            parsed = ipaddress.ip_address(text)
        except ValueError:
            parsed = None
        if parsed is None or (isinstance(parsed, ipaddress.IPv6Address) and parsed.scope_id is not None):
            raise AllocationFailedError(
                f"annotation {REQUESTED_ADDRESS_ANNOTATION} of claim {self} is {text!r}, which is not an IP address; "
                "fix or remove it"
            )
        embedded = _embedded_ipv4(parsed)
        if embedded is not None:
            raise AllocationFailedError(
                f"annotation {REQUESTED_ADDRESS_ANNOTATION} of claim {self} is {text!r}, an IPv6 address carrying "
                f"the IPv4 address {embedded} (IPv4-mapped or IPv4-compatible), which is not served; write the IPv4 "
                f"address {embedded} instead"
            )
        return str(parsed)


def _embedded_ipv4(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside an IPv4-mapped (::ffff:a.b.c.d) or IPv4-compatible (::a.b.c.d) IPv6 address."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if int(address) >> 32 == 0 and int(address) > 1:  # ::/96 except :: and ::1
        return ipaddress.IPv4Address(int(address))
    return None


def requested_address_held(address: str, pool: PoolRef | str, holder: str) -> str:
    """The claim's Ready message when its requested address is held by `holder` (a claim, or a description)."""
    return f"requested address {address} is already held by {holder} in {pool}; request another address"


def requested_address_outside(address: str, pool: PoolRef | str, why: str = "") -> str:
    """The claim's Ready message when its requested address is not allocatable in the pool, `why` if known."""
    detail = f" ({why})" if why else ""
    return f"requested address {address} is outside {pool}{detail}; request an address of the pool"


@dataclass(frozen=True)
class Allocation:
    """An address held for one claim. `annotations` is the backend's bookkeeping: stored on the IPAddress and handed
    back on release."""

    address: str
    prefix: int
    gateway: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AddressCounts:
    """A pool's `status.ipAddresses`: `used` counts the IPAddresses naming the pool, `free` the addresses still to
    be handed out, `out_of_range` (None: not counted) the IPAddresses whose address lies outside the pool."""

    total: int
    used: int
    free: int
    out_of_range: int | None = None

    def wire(self) -> dict[str, int]:
        """The `status.ipAddresses` object, each count capped at the int64 maximum."""
        counts = {"total": cap_int64(self.total), "used": cap_int64(self.used), "free": cap_int64(self.free)}
        if self.out_of_range is not None:
            counts["outOfRange"] = cap_int64(self.out_of_range)
        return counts


STATUS_COUNTS_FIELD = "ipAddresses"


def reported_free(pool: Mapping[str, Any]) -> int:
    """The free count last written to the pool's `status.ipAddresses` (0 when there is none)."""
    value = ((pool.get("status") or {}).get(STATUS_COUNTS_FIELD) or {}).get("free")
    return value if isinstance(value, int) else 0


@dataclass(frozen=True)
class ReportCondition:
    """A pool condition besides `Ready`. With `warning`, a Warning Event is recorded each time the condition enters
    this status and reason."""

    type: str
    status: bool
    reason: str
    message: str = ""
    warning: bool = False


@dataclass(frozen=True)
class PoolReport:
    """The state of a pool as the backend sees it, written to its status: `Ready` from `ready`, `reason` and
    `message`; each of `conditions` (types left out are left as they are); `status.ipAddresses` from `counts` (None:
    left as it is); `status`, the kind's other status fields, merged in. `related` names the pools whose report
    depends on this pool's addresses: they are reported again soon when this pool's status changed. `report_again`:
    seconds until the report changes with no watched change (a grace period ending), the pool then being reported
    again (at least a second later); None: on changes and at the usual interval."""

    ready: bool
    reason: str
    message: str = ""
    status: Mapping[str, Any] = field(default_factory=dict)
    counts: AddressCounts | None = None
    conditions: Sequence[ReportCondition] = ()
    related: Sequence[PoolRef] = ()
    report_again: float | None = None

    def status_fields(self) -> dict[str, Any]:
        """The status fields to write besides the conditions."""
        fields = dict(self.status)
        if self.counts is not None:
            fields[STATUS_COUNTS_FIELD] = self.counts.wire()
        return fields


class BackendError(Exception):
    """A failure that becomes `Ready=False` on the claim, with `reason` and `message` (shown to people: it must
    say what to do and never contain a credential)."""

    reason = "AllocationFailed"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class PoolNotReadyError(BackendError):
    """The pool is missing, invalid, or its external system cannot be used now."""

    reason = "PoolNotReady"


class PoolExhaustedError(BackendError):
    """Every source of the pool is full. The claim is retried when the pool gains free addresses."""

    reason = "PoolExhausted"


class AllocationFailedError(BackendError):
    """Anything else that prevented allocation."""


class ReleaseImpossibleError(BackendError):
    """The address can never be released by this backend (for example its pool and credentials are gone): a
    Warning Event, and the claim is let go; what the backend still holds is left to the repair loop. Transient
    failures must raise another exception, to be retried."""

    reason = "ReleaseFailed"


@dataclass(frozen=True)
class BackendContext:
    """What the controller hands to a backend factory. `cached_addresses(pool_ref)` and `cached_pools(kind)` answer
    from the watch cache (projections, not to be changed), or None when it cannot answer (then read the API server).
    `cluster_identity` names this management cluster: a backend whose external system clusters may share stamps it
    on what it makes and releases only what carries it (`Holding.releasable`); "" (unknown): nothing is stamped, and
    whatever carries the backend's other marks is releasable."""

    kube: KubeClient
    controller_name: str = "capi-ipam-provider-py"
    cached_addresses: Callable[[PoolRef], Sequence[Object] | None] = lambda ref: None
    cached_pools: Callable[[PoolKind], Sequence[Object] | None] = lambda kind: None
    cluster_identity: str = ""


Preparer = Callable[[PoolRef, Object], Awaitable[None]]  # `Capabilities.prepare`


@dataclass(frozen=True)
class AddressInUse:
    """A live IPAddress naming a pool, for admission checks: `namespace`/`name`, its spec's `address` and `prefix`
    (None: none), and its claim as namespace/name."""

    namespace: str
    name: str
    address: str
    claim: str
    prefix: int | None = None

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


AdmissionReviewer = Callable[[PoolRef, Object | None, Object | None, Sequence[AddressInUse]], Awaitable[list[str]]]
PoolObserver = Callable[[PoolKind, Object | None, Object | None], Collection[PoolRef]]
