"""The host name of a host record: the claim's name, or the name of the Machine that owns the claim.

The Machine is found by following ownerReferences breadth-first, controller references first, through the
infrastructure kinds known to own claims (`OWNER_KINDS`: CAPV's VSphereVM and VSphereMachine, CAPMOX's
ProxmoxMachine, CAPM3's Metal3Data, Metal3DataClaim and Metal3Machine), each read in the claim's namespace (the
ClusterRole grants `get` on these). Bounds: `depth` levels, `reads` reads, `seconds` in all. A Machine owner is read
too, and its uid must be the ownerReference's. Owners of other kinds are not read. When no Machine is found, or a
known owner cannot be read (forbidden, not found, another uid, a malformed name) or a bound is reached,
HostnameError says why: a host name is never guessed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ipam_provider.api.capi import CLUSTER_GROUP
from ipam_provider.backend.contract import ClaimContext
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource, subdomain_problem

MAX_LABEL = 63  # RFC 1035: octets in one label
MAX_NAME = 253  # RFC 1035: 255 octets on the wire, which is 253 characters written out
INFRASTRUCTURE_GROUP = "infrastructure.cluster.x-k8s.io"
MACHINE = (CLUSTER_GROUP, "Machine")
OWNER_KINDS: Mapping[tuple[str, str], str] = {
    MACHINE: "machines",
    (INFRASTRUCTURE_GROUP, "VSphereVM"): "vspherevms",
    (INFRASTRUCTURE_GROUP, "VSphereMachine"): "vspheremachines",
    (INFRASTRUCTURE_GROUP, "ProxmoxMachine"): "proxmoxmachines",
    (INFRASTRUCTURE_GROUP, "Metal3Data"): "metal3datas",
    (INFRASTRUCTURE_GROUP, "Metal3DataClaim"): "metal3dataclaims",
    (INFRASTRUCTURE_GROUP, "Metal3Machine"): "metal3machines",
}
"""The kinds the owner walk reads, (group, kind) -> resource: a Machine, and the infrastructure objects between a
claim and its Machine."""
_VERSION = re.compile(r"^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$")


class HostnameError(Exception):
    """No host name can be had for the claim; the message says why."""


def host_fqdn(name: str, zone: str, claim: ClaimContext, source: str) -> str:
    """`name` in `zone`, lower-cased as NIOS stores it. HostnameError, naming the claim and the limit, when a label
    is over 63 characters or the name over 253; a name is never shortened (it could be another machine's)."""
    fqdn = f"{name}.{zone.strip('.')}".lower()
    fix = f"use a shorter {source} or spec.hostRecord.dnsZone"
    if len(fqdn) > MAX_NAME:
        raise HostnameError(
            f"host name {fqdn!r} of claim {claim} is {len(fqdn)} characters, over the {MAX_NAME}-character limit "
            f"of a DNS name; {fix}"
        )
    for label in fqdn.split("."):
        if not 0 < len(label) <= MAX_LABEL:
            raise HostnameError(
                f"host name {fqdn!r} of claim {claim} has a label of {len(label)} characters ({label[:20]}...); a "
                f"DNS label is 1 to {MAX_LABEL} characters; {fix}"
            )
    return fqdn


@dataclass(frozen=True)
class OwnerBounds:
    depth: int = 5
    reads: int = 12
    seconds: float = 20.0


async def machine_name(kube: KubeClient, claim: ClaimContext, bounds: OwnerBounds) -> str:
    """The name of the Machine owning the claim (see the module's docstring); HostnameError says why there is none."""
    walk = _OwnerWalk(kube, claim, bounds)
    try:
        async with asyncio.timeout(bounds.seconds):
            return await walk.run()
    except TimeoutError:
        raise HostnameError(
            f"reading the owners of claim {claim} took over {bounds.seconds:g} s; the Machine that owns it is not "
            "known yet (retried)"
        ) from None


@dataclass
class _OwnerWalk:
    kube: KubeClient
    claim: ClaimContext
    bounds: OwnerBounds
    reads: int = 0
    seen: set[tuple[str, str, str]] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)  # owners of kinds not read, for the message

    async def run(self) -> str:
        level = _ordered(self.claim.owner_references)
        for _ in range(self.bounds.depth):
            following: list[Mapping[str, Any]] = []
            for ref in level:
                owner = await self.read(ref)
                if owner is None:
                    continue
                if _key(ref)[:2] == MACHINE:
                    return str(ref.get("name"))
                following.extend(_ordered((owner.get("metadata") or {}).get("ownerReferences") or []))
            if not following:
                break
            level = following
        else:
            raise self.error(f"no Machine within {self.bounds.depth} ownerReferences")
        skipped = f" (not followed: {', '.join(self.skipped[:5])})" if self.skipped else ""
        raise self.error(f"no {CLUSTER_GROUP} Machine among its owners{skipped}")

    async def read(self, ref: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The owner `ref` names, if of a known kind and not read yet (else None); HostnameError when it cannot be
        read, is not the object the reference names, or the read bound is reached."""
        group, kind, version, name = _key(ref)
        plural = OWNER_KINDS.get((group, kind))
        if plural is None:
            self.skipped.append(f"{kind or '?'} {name[:63]!r} of an unknown kind")
            return None
        if (group, kind, name) in self.seen:
            return None
        self.seen.add((group, kind, name))
        where = f"{kind} {self.claim.namespace}/{name[:63]}"
        if subdomain_problem(name) or not _VERSION.match(version):
            raise self.error(f"its owner reference to {where} ({ref.get('apiVersion')!r}) is malformed")
        if self.reads >= self.bounds.reads:
            raise self.error(f"more than {self.bounds.reads} owners would have to be read")
        self.reads += 1
        try:
            owner = await self.kube.get(
                Resource(group, version, plural, kind, namespaced=True), name, self.claim.namespace
            )
        except ApiError as error:
            raise self.error(f"{where} cannot be read ({error.status} {error.reason})") from error
        if owner is None:
            raise self.error(f"{where} was not found")
        if str((owner.get("metadata") or {}).get("uid")) != str(ref.get("uid")):
            raise self.error(f"{where} is not the object its owner reference names (another uid)")
        return owner

    def error(self, why: str) -> HostnameError:
        return HostnameError(
            f"the Machine owning claim {self.claim} cannot be found: {why}; set spec.hostRecord.hostnameSource to "
            "claimName, or let the claim's owner chain reach its Machine"
        )


def _key(ref: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(group, kind, version, name) of an ownerReference."""
    group, _, version = str(ref.get("apiVersion", "")).rpartition("/")
    return group, str(ref.get("kind", "")), version, str(ref.get("name", ""))


def _ordered(refs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted((ref for ref in refs if isinstance(ref, Mapping)), key=lambda ref: not ref.get("controller"))
