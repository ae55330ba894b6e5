"""Admission of pool changes: `admission.k8s.io/v1` AdmissionReviews in, a verdict out.

`parse_review` reads a review (raising MalformedReview for anything that is not one); `PoolAdmission.decide`
answers it for any served pool kind:

- DELETE (every kind, here in the core): refused while live IPAddresses (not being deleted) name the pool, unless
  the pool carries `ipam.cluster.x-k8s.io/skip-validate-delete-webhook` (the Go provider's annotation) or
  `clusterctl.cluster.x-k8s.io/delete-for-move` (set by `clusterctl move` before it deletes its source copy);
- CREATE and UPDATE, and a DELETE that passed: whatever the kind's backend refuses through its optional
  `review_pool_change` (`admission_reviewer_of`); a kind whose backend has none is allowed.

The IPAddresses in use come from the controller's synced cache when it can answer for the pool, else from a fresh
LIST. Refusals of CREATE and UPDATE are 422 (Invalid), of DELETE 403 (Forbidden); a check that cannot be made (the
API server did not answer the LIST) is 500, so that the API server refuses the change with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ipam_provider.api.capi import ANNOTATION_DELETE_FOR_MOVE, ANNOTATION_SKIP_DELETE_VALIDATION
from ipam_provider.api.pools import names_pool
from ipam_provider.backend.contract import AddressInUse, PoolKind, PoolRef, admission_reviewer_of
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.common import Object
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.resources import ADDRESSES

ADMISSION_API_VERSION = "admission.k8s.io/v1"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
IN_USE = "Pool has IPAddresses allocated. Cannot delete Pool until all IPAddresses have been removed."  # Go's text
LISTED_ADDRESSES = 10


class MalformedReview(ValueError):
    """The body is not an `admission.k8s.io/v1` AdmissionReview request this webhook can answer."""


@dataclass(frozen=True)
class ReviewRequest:
    """What a review asks: may `operation` turn `old` into `new` for the object `group`/`kind` `name`?"""

    uid: str
    operation: str
    group: str
    kind: str
    namespace: str | None
    name: str
    old: Object | None
    new: Object | None


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    code: int = 200
    reason: str = ""
    message: str = ""


ALLOWED = Verdict(True)


def webhook_path(kind: PoolKind) -> str:
    """The kubebuilder path of a kind's validating webhook: `/validate-<group, dots as dashes>-<version>-<kind>`."""
    return f"/validate-{kind.group.replace('.', '-')}-{kind.version}-{kind.kind.lower()}"


def parse_review(body: Any) -> ReviewRequest:
    """The request of an AdmissionReview; raises MalformedReview saying what is wrong."""
    if not isinstance(body, dict):
        raise MalformedReview("the body is not a JSON object")
    if (body.get("apiVersion"), body.get("kind")) != (ADMISSION_API_VERSION, "AdmissionReview"):
        raise MalformedReview(f"expected an {ADMISSION_API_VERSION} AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("the AdmissionReview has no request")
    uid, operation, kind = request.get("uid"), request.get("operation"), request.get("kind")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("the request has no uid")
    if operation not in OPERATIONS:
        raise MalformedReview(f"unknown operation {operation!r}")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str):
        raise MalformedReview("the request has no kind")
    old, new = request.get("oldObject"), request.get("object")
    for name, obj in (("oldObject", old), ("object", new)):
        if obj is not None and not (isinstance(obj, dict) and isinstance(obj.get("metadata", {}), dict)):
            raise MalformedReview(f"the request's {name} is not an object")
    namespace = request.get("namespace")
    return ReviewRequest(
        uid=uid,
        operation=str(operation),
        group=str(kind.get("group") or ""),
        kind=str(kind["kind"]),
        namespace=namespace if isinstance(namespace, str) and namespace else None,
        name=str(request.get("name") or ""),
        old=old if operation != "CREATE" else None,
        new=new if operation != "DELETE" else None,
    )


def review_response(uid: str, verdict: Verdict) -> Object:
    """The AdmissionReview answering the request `uid`."""
    response: Object = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {
            "status": "Failure",
            "code": verdict.code,
            "reason": verdict.reason,
            "message": verdict.message,
        }
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


class PoolAdmission:
    """Decides reviews of pools of the registry's kinds. `cached_addresses(ref)` answers the IPAddresses naming a
    pool from the controller's cache, or None when the cache cannot answer (then they are listed)."""

    def __init__(
        self,
        kube: KubeClient,
        registry: BackendRegistry,
        cached_addresses: Callable[[PoolRef], Sequence[Object] | None] = lambda ref: None,
    ) -> None:
        self.kube = kube
        self.registry = registry
        self.cached_addresses = cached_addresses

    async def decide(self, request: ReviewRequest, path_kind: PoolKind) -> Verdict:
        """The verdict on `request`, which came in at `path_kind`'s path. Raises what the API server raised when
        the IPAddresses had to be listed (ApiError, aiohttp.ClientError, OSError, TimeoutError)."""
        if (request.group, request.kind) != (path_kind.group, path_kind.kind):
            return Verdict(
                False, 400, "BadRequest", f"this path reviews {path_kind.kind}, not {request.kind or 'an object'}"
            )
        if request.operation == "CONNECT":
            return ALLOWED
        pool = request.new if request.new is not None else request.old
        if pool is None:
            return Verdict(False, 400, "BadRequest", f"the {request.operation} request carries no object")
        ref = path_kind.ref(request.namespace, request.name or str((pool.get("metadata") or {}).get("name", "")))
        in_use = await self.addresses_in_use(ref)
        if request.operation == "DELETE":
            refused = _delete_refusal(pool, in_use)
            if refused is not None:
                return Verdict(False, 403, "Forbidden", refused)
        found = self.registry.lookup(path_kind.group, path_kind.kind)
        review = admission_reviewer_of(found[0]) if found is not None else None
        if review is None:
            return ALLOWED
        reasons = await review(ref, request.old, request.new, in_use)
        if not reasons:
            return ALLOWED
        code, reason = (403, "Forbidden") if request.operation == "DELETE" else (422, "Invalid")
        return Verdict(False, code, reason, f"{path_kind.kind} {request.name}: {'; '.join(reasons)}")

    async def addresses_in_use(self, ref: PoolRef) -> list[AddressInUse]:
        """The live IPAddresses naming the pool: from the cache if it can answer, else listed."""
        cached = self.cached_addresses(ref)
        items = cached if cached is not None else (await self.kube.list(ADDRESSES, ref.namespace))[0]
        in_use: list[AddressInUse] = []
        for item in items:
            meta = item.get("metadata") or {}
            if meta.get("deletionTimestamp") or not names_pool(item, ref):
                continue
            spec = item.get("spec") or {}
            namespace = str(meta.get("namespace", ""))
            claim = (spec.get("claimRef") or {}).get("name") or meta.get("name", "")
            prefix = spec.get("prefix")
            in_use.append(
                AddressInUse(
                    namespace,
                    str(meta.get("name", "")),
                    str(spec.get("address", "")),
                    f"{namespace}/{claim}",
                    prefix if isinstance(prefix, int) and not isinstance(prefix, bool) else None,
                )
            )
        return in_use


def _delete_refusal(pool: Object, in_use: Sequence[AddressInUse]) -> str | None:
    annotations = (pool.get("metadata") or {}).get("annotations") or {}
    if ANNOTATION_SKIP_DELETE_VALIDATION in annotations or ANNOTATION_DELETE_FOR_MOVE in annotations:
        return None
    if not in_use:
        return None
    names = sorted(str(address) for address in in_use)
    listed = ", ".join(names[:LISTED_ADDRESSES]) + (
        f" and {len(names) - LISTED_ADDRESSES} more" if len(names) > LISTED_ADDRESSES else ""
    )
    return (
        f"{IN_USE} IPAddresses: {listed}. Delete their claims first, or annotate the pool "
        f"{ANNOTATION_SKIP_DELETE_VALIDATION} to delete it anyway."
    )
