"""The contract between the claim reconciler and a pool backend.

A backend serves one or more pool kinds. The reconciler calls it with plain data: the pool object as the API
server returned it (a JSON mapping), and a `ClaimContext` describing the claim. It never calls a backend for a
paused claim, cluster or pool, and it calls a backend for one pool at a time: calls for the same pool are
serialised, calls for different pools may run concurrently.

Every method must be idempotent and safe to repeat after a crash at any point: the reconciler is
level-triggered and will call again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ipam_provider.kube.client import KubeClient

JSON = Mapping[str, Any]


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


@dataclass(frozen=True)
class ClaimContext:
    """What a backend may know about the claim it serves."""

    namespace: str
    name: str
    uid: str
    cluster_name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owner_references: Sequence[JSON] = ()

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Allocation:
    """An address held for one claim.

    `annotations` is backend bookkeeping (for example an external object reference). The reconciler stores it on
    the IPAddress under the backend's own annotation keys and hands it back on release, so that release needs no
    search in the external system.
    """

    address: str
    prefix: int
    gateway: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolReport:
    """The state of a pool as the backend sees it.

    `status` holds the pool kind's own status fields (for example `ipAddresses`); the reconciler merges it into
    the pool's status together with the `Ready` condition built from `ready`, `reason` and `message`.
    """

    ready: bool
    reason: str
    message: str = ""
    status: Mapping[str, Any] = field(default_factory=dict)


class BackendError(Exception):
    """A failure the reconciler turns into `Ready=False` on the claim, with `reason` and `message`.

    Messages are shown to people (conditions and Events): they must say what to do, and must never contain
    credentials.
    """

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

    reason = "AllocationFailed"


class ReleaseImpossibleError(BackendError):
    """The address can never be released by this backend (for example its pool and credentials are gone).

    The reconciler records a Warning Event with the message and lets the claim go, so that the owning machine can
    be deleted. Transient failures must raise another BackendError (or any exception) instead, to be retried.
    """

    reason = "ReleaseFailed"


@dataclass(frozen=True)
class BackendContext:
    """What the controller hands to a backend factory."""

    kube: KubeClient
    controller_name: str = "capi-ipam-provider-py"


@runtime_checkable
class Backend(Protocol):
    """A pool backend. One instance serves every pool of its kinds."""

    @property
    def kinds(self) -> Sequence[PoolKind]:
        """The pool kinds this backend serves."""
        ...

    async def allocate(self, pool: JSON, claim: ClaimContext, existing: Allocation | None = None) -> Allocation:
        """Return the address the pool holds for `claim.uid`, allocating one if it holds none.

        With `existing` (an IPAddress already names this claim), the claim must end up holding exactly that
        address: record it for the claim, or raise AllocationFailedError if another claim holds it.
        Raises PoolNotReadyError, PoolExhaustedError or AllocationFailedError. Never hands out an address that
        another claim holds, even when several controller processes call at once.
        """
        ...

    async def release(
        self, pool_ref: PoolRef, pool: JSON | None, claim: ClaimContext, allocation: Allocation | None
    ) -> None:
        """Release whatever the pool holds for `claim.uid`. Releasing what is already gone succeeds.

        `pool` is None when the pool object no longer exists; `allocation` is None when no IPAddress recorded
        one. Never releases an address that this controller did not allocate for this claim.
        """
        ...

    async def report(self, pool: JSON, addresses: Sequence[Allocation]) -> PoolReport:
        """Validate the pool and count its usage. `addresses` are the IPAddresses that reference the pool."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...
