"""The host record of a claim's host name that exists already: adopted only when it carries the claim's uid.

A pool that keeps its records out of DNS (configureForDNS false) makes IPAM-only records. NIOS keeps those in a
blank pseudo-view (`view` is a single space, the reference ends in `/%20`): a search naming a DNS view never
answers them, and one naming view " " is a 404 ("View  not found"). So they are searched by name alone, and only
answers whose view is blank count. Whether NIOS refuses a second IPAM-only record of one name is not public, so
such a pool looks before it posts (one GET per new record) rather than rely on a refusal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.infoblox.client import WapiError
from backends.infoblox.payloads import HOST, RETURN_FIELDS, GridObject, parse_object
from ipam_provider.backend.contract import AllocationFailedError

if TYPE_CHECKING:
    from backends.infoblox.allocator import Allocating


async def same_name(job: Allocating, hostname: str, dns_view: str, error: WapiError | None) -> GridObject | None:
    """The host record of this name where the pool's records go, if it carries the claim's uid; None if there is
    none (`error`, the POST's refusal, is raised instead when given); AllocationFailed if another holds it. An
    IPAM-only pool's records are searched by name alone, keeping the answers whose view is blank."""
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
