"""The end-of-run check against the truth: the API server, read directly, and the backend's own records
(`ChaosBackend.truth()`, read from the system itself).

- duplicates: an address held twice within one pool, by two IPAddresses or by two backend records;
- leaks: a backend record held for a claim uid that no live claim has;
- unfulfilled: a live claim without an IPAddress (no `status.addressRef`, or one naming no IPAddress), or still
  terminating (its release never finished);
- unrecorded: an IPAddress with no backend record of its address in its pool for its claim.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.chaos.backends import ChaosBackend, TruthRecord
from benchmarks.chaos.workload import PoolTarget
from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.runtime.kube.client import KubeClient

EXAMPLES = 5  # per check, in the findings' details


@dataclass
class Findings:
    duplicates: int = 0
    leaks: int = 0
    unfulfilled: int = 0
    unrecorded: int = 0
    details: dict[str, list[str]] = field(default_factory=lambda: collections.defaultdict(list))

    @property
    def clean(self) -> bool:
        return not (self.duplicates or self.leaks or self.unfulfilled or self.unrecorded)

    def note(self, check: str, text: str) -> None:
        if len(self.details[check]) < EXAMPLES:
            self.details[check].append(text)

    def counts(self) -> dict[str, int]:
        return {
            "duplicates": self.duplicates,
            "leaks": self.leaks,
            "unfulfilled": self.unfulfilled,
            "unrecorded": self.unrecorded,
        }


async def check(kube: KubeClient, namespace: str, backend: ChaosBackend, pools: Sequence[PoolTarget]) -> Findings:
    """Read the backend's truth first, then the IPAddresses and the claims (paginated, from the API server), and
    count what is wrong."""
    truth = await backend.truth()
    addresses, _ = await kube.list(ADDRESSES, namespace)
    claims, _ = await kube.list(CLAIMS, namespace)
    refs = {(pool.kind, pool.name): pool.ref for pool in pools}
    findings = Findings()
    _duplicates(findings, truth, addresses, refs)
    live = {claim["metadata"]["uid"] for claim in claims if not claim["metadata"].get("deletionTimestamp")}
    for record in truth:
        if record.claim_uid and record.claim_uid not in live:
            findings.leaks += 1
            text = f"{record.pool} {record.address} ({record.handle}) for gone claim {record.claim_uid}"
            findings.note("leaks", text)
    _unfulfilled(findings, claims, {a["metadata"]["name"] for a in addresses})
    held = {(r.pool, r.address, r.claim_uid) for r in truth}
    for address in addresses:
        pool, ip, owner = _address_key(address, refs)
        if (pool, ip, owner) not in held:
            findings.unrecorded += 1
            findings.note("unrecorded", f"IPAddress {address['metadata']['name']} {ip} of {pool} (claim {owner})")
    return findings


def _address_key(address: dict[str, Any], refs: dict[tuple[str, str], str]) -> tuple[str, str, str]:
    """(pool in TruthRecord form, address, owning claim uid) of an IPAddress."""
    ref = address["spec"].get("poolRef") or {}
    kind, name = ref.get("kind", ""), ref.get("name", "")
    pool = refs.get((kind, name), f"{kind}/{address['metadata'].get('namespace', '')}/{name}")
    owners = [o for o in address["metadata"].get("ownerReferences") or [] if o.get("kind") == CLAIMS.kind]
    return pool, str(address["spec"].get("address", "")), owners[0]["uid"] if owners else ""


def _duplicates(
    findings: Findings, truth: Sequence[TruthRecord], addresses: Sequence[dict[str, Any]], refs: dict[Any, str]
) -> None:
    by_records = collections.Counter((record.pool, record.address) for record in truth)
    by_addresses = collections.Counter(_address_key(address, refs)[:2] for address in addresses)
    for source, counts in (("backend records", by_records), ("IPAddresses", by_addresses)):
        for (pool, ip), count in sorted(counts.items()):
            if count > 1:
                findings.duplicates += count - 1
                findings.note("duplicates", f"{ip} held {count} times in {pool} ({source})")


def _unfulfilled(findings: Findings, claims: Sequence[dict[str, Any]], address_names: set[str]) -> None:
    for claim in claims:
        meta = claim["metadata"]
        name = ((claim.get("status") or {}).get("addressRef") or {}).get("name")
        if meta.get("deletionTimestamp"):
            findings.unfulfilled += 1
            text = f"claim {meta['name']} still terminating (finalizers {meta.get('finalizers')})"
            findings.note("unfulfilled", text)
        elif not name or name not in address_names:
            findings.unfulfilled += 1
            findings.note("unfulfilled", f"claim {meta['name']} has no IPAddress (addressRef {name!r})")
