"""The `RequestedAddressIgnored` notice: a fulfilled claim whose requested-address annotation names another address
than its IPAddress's (or no IP address at all) keeps what it has, since an IPAddress is immutable. One Warning Event
per change of the annotation says so: the value last noticed is remembered per claim (and uid), and forgotten when
the annotation matches the IPAddress again.
"""

from __future__ import annotations

from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION, Allocation, AllocationFailedError
from ipam_provider.common import normalized_address
from ipam_provider.reconcile.context import ClaimWork
from ipam_provider.runtime.events import WARNING, EventRecorder

REASON_REQUESTED_ADDRESS_IGNORED = "RequestedAddressIgnored"


def ignored_message(requested: str, current: str, valid: bool) -> str:
    """The Event's message: which address the annotation asks for, which one the claim keeps, and what to do."""
    asked = f"asks for {requested}" if valid else f"is {requested!r}, which is not an IP address"
    return (
        f"annotation {REQUESTED_ADDRESS_ANNOTATION} {asked}, but the claim already has {current}; its IPAddress is "
        "immutable, so nothing changes: delete and recreate the claim to get another address"
    )


class RequestedAddressNotices:
    """Records `RequestedAddressIgnored` on a fulfilled claim once per change of its annotation."""

    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder
        self._noticed: dict[tuple[str, str], tuple[str, str]] = {}  # claim → (uid, annotation value noticed)

    def check(self, work: ClaimWork, existing: Allocation) -> None:
        """Look at the annotation of a claim whose IPAddress holds `existing`."""
        key = (work.namespace, work.name)
        text = (work.claim.metadata.annotations.get(REQUESTED_ADDRESS_ANNOTATION) or "").strip()
        try:
            requested = work.context().requested_address
        except AllocationFailedError:
            requested = None
        current = normalized_address(existing.address)
        if not text or requested == current:
            self._noticed.pop(key, None)
            return
        noticed = (work.claim.metadata.uid, text)
        if self._noticed.get(key) == noticed:
            return
        self._noticed[key] = noticed
        message = ignored_message(requested or text, current, requested is not None)
        work.log.info("requested address ignored: the claim is fulfilled", requested=text, address=current)
        self.recorder.record(work.raw, WARNING, REASON_REQUESTED_ADDRESS_IGNORED, message, related=work.pool)

    def forget(self, namespace: str, name: str) -> None:
        self._noticed.pop((namespace, name), None)
