"""The live IPAddresses and claims for one repair pass: as the watch caches show them (`cached_live`: for a pass to
look with, never to act on), or read fresh (`read_live`: page by page from the API server, one `pacer.wait()`
before each page, in every watched namespace). Claims are read without the watch filter, so that a claim this
controller does not serve still counts as existing; `Scope.serves` tells the served ones apart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ipam_provider.api.capi import LABEL_WATCH_FILTER
from ipam_provider.api.pools import KindLookup, referenced_pool
from ipam_provider.backend.contract import PoolRef
from ipam_provider.backend.repair import Pacer
from ipam_provider.common import Object, normalized_address
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import ADDRESSES, CLAIMS, Resource

PAGE_SIZE = 500
ClaimName = tuple[str, str]  # namespace, name


@dataclass(frozen=True)
class Scope:
    """Which claims the controller serves: those of `namespaces` (every namespace when empty) that carry the
    watch-filter label's value `watch_filter` (when set)."""

    namespaces: Sequence[str] = ()
    watch_filter: str | None = None

    def watches(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces

    def serves(self, claim: Object) -> bool:
        meta = claim["metadata"]
        if not self.watches(meta.get("namespace") or ""):
            return False
        labels = meta.get("labels") or {}
        return self.watch_filter is None or labels.get(LABEL_WATCH_FILTER) == self.watch_filter


@dataclass
class LiveState:
    """The live IPAddresses and claims, indexed for the comparison."""

    claims: dict[ClaimName, Object] = field(default_factory=dict)
    addresses_by_pool: dict[PoolRef, list[Object]] = field(default_factory=lambda: defaultdict(list))
    addresses_by_claim: dict[ClaimName, list[Object]] = field(default_factory=lambda: defaultdict(list))

    def add_claim(self, claim: Object) -> None:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = claim

    def add_address(self, address: Object, kind_of: KindLookup) -> None:
        ref = referenced_pool(address, kind_of)
        if ref is not None:
            self.addresses_by_pool[ref].append(address)
        self.addresses_by_claim[claim_of_address(address)].append(address)

    def addresses_of(self, pool: PoolRef) -> list[Object]:
        return self.addresses_by_pool.get(pool, [])

    def claim_addresses(self, claim: ClaimName) -> list[Object]:
        return self.addresses_by_claim.get(claim, [])


def cached_live(claims: Iterable[Object], addresses: Iterable[Object], kind_of: KindLookup) -> LiveState:
    """The live state as the watch caches show it (see the module's contract)."""
    live = LiveState()
    for address in addresses:
        live.add_address(address, kind_of)
    for claim in claims:
        live.add_claim(claim)
    return live


async def read_live(kube: KubeClient, scope: Scope, kind_of: KindLookup, pacer: Pacer) -> LiveState:
    """The live IPAddresses and claims of the watched namespaces, read fresh (see the module's contract)."""
    live = LiveState()
    for address in await _list(kube, ADDRESSES, scope, pacer):
        live.add_address(address, kind_of)
    for claim in await _list(kube, CLAIMS, scope, pacer):
        live.add_claim(claim)
    return live


async def _list(kube: KubeClient, resource: Resource, scope: Scope, pacer: Pacer) -> list[Object]:
    items: list[Object] = []
    namespaces: Sequence[str | None] = scope.namespaces or [None]
    for namespace in namespaces:
        async for page, _ in kube.list_pages(resource, namespace, limit=PAGE_SIZE, before_page=pacer.wait):
            items += page
    return items


def claim_of_address(address: Object) -> ClaimName:
    """The claim an IPAddress names: its namespace and `spec.claimRef.name` (its own name when it has none)."""
    meta = address["metadata"]
    name = ((address.get("spec") or {}).get("claimRef") or {}).get("name") or meta["name"]
    return meta.get("namespace") or "", name


def owner_claim_uid(address: Object) -> str:
    """The uid of the claim among the IPAddress's owner references (the controller one first), or ""."""
    owners = [ref for ref in address["metadata"].get("ownerReferences") or [] if ref.get("kind") == CLAIMS.kind]
    owners.sort(key=lambda ref: not ref.get("controller"))
    return str(owners[0].get("uid") or "") if owners else ""


def address_text(address: Object) -> str:
    """The IPAddress's address in canonical form."""
    return normalized_address(str((address.get("spec") or {}).get("address") or ""))


def deleting(obj: Object) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))
