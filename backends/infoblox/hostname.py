"""The host name of a host record: the claim's name, or the name of the Machine that owns the claim, found by
following ownerReferences breadth-first, controller references first, at most `depth` levels. An owner that is not a
Machine is read in the claim's namespace as the plural of its kind (the ClusterRole needs `get` on it); one that
cannot be read is skipped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from ipam_provider.backend.contract import ClaimContext
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import CLUSTER_GROUP, Resource

log = structlog.get_logger(__name__)

MAX_LABEL = 63  # RFC 1035: octets in one label
MAX_NAME = 253  # RFC 1035: 255 octets on the wire, which is 253 characters written out


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


async def machine_name(kube: KubeClient, claim: ClaimContext, depth: int) -> str:
    """The name of the Machine owning the claim, through at most `depth` ownerReferences."""
    level: list[Mapping[str, Any]] = _ordered(claim.owner_references)
    seen: set[tuple[str, str, str]] = set()
    for _ in range(depth):
        following: list[Mapping[str, Any]] = []
        for ref in level:
            api_version, kind, name = str(ref.get("apiVersion", "")), str(ref.get("kind", "")), str(ref.get("name"))
            group = api_version.split("/", 1)[0] if "/" in api_version else ""
            if kind == "Machine" and group == CLUSTER_GROUP:
                return name
            if (api_version, kind, name) in seen:
                continue
            seen.add((api_version, kind, name))
            owner_group, _, version = api_version.rpartition("/")
            resource = Resource(owner_group, version, plural(kind), kind, namespaced=True)
            try:
                owner = await kube.get(resource, name, claim.namespace)
            except ApiError as error:
                where = f"{kind}/{claim.namespace}/{name}"
                log.info("owner of a claim cannot be read", owner=where, status=error.status)
                continue
            if owner is not None:
                following.extend(_ordered(owner.get("metadata", {}).get("ownerReferences") or []))
        level = following
    raise HostnameError(
        f"no cluster.x-k8s.io Machine owns claim {claim} within {depth} ownerReferences; set "
        "spec.hostRecord.hostnameSource to claimName, or let the claim's owner chain reach its Machine"
    )


def _ordered(refs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(refs, key=lambda ref: not ref.get("controller"))


def plural(kind: str) -> str:
    """The resource name of a kind by the English rule Kubernetes code generators follow."""
    lower = kind.lower()
    if lower.endswith(("s", "x", "z", "ch", "sh")):
        return lower + "es"
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        return lower[:-1] + "ies"
    return lower + "s"
