"""The live IPAddresses and claims of a repair pass, and their comparison with one pool's holdings (no I/O; the
rules are docs/repair.md's table). The watch caches' live state (`cached_live`) is for a pass to look with, never
to act on. Claims are read without the watch filter, so that a claim this controller does not serve still counts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ipam_provider.api.capi import ADDRESSES, ANNOTATION_PAUSED, CLAIMS, LABEL_WATCH_FILTER, KindLookup, referenced_pool
from ipam_provider.backend.contract import PoolRef
from ipam_provider.backend.repair import Holding, Pacer
from ipam_provider.common import Object, normalized_address
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource

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

    def addresses_of(self, pool: PoolRef) -> list[Object]:
        return self.addresses_by_pool.get(pool, [])

    def claim_addresses(self, claim: ClaimName) -> list[Object]:
        return self.addresses_by_claim.get(claim, [])


def cached_live(claims: Iterable[Object], addresses: Iterable[Object], kind_of: KindLookup) -> LiveState:
    """The live state of `claims` and `addresses`."""
    live = LiveState()
    for address in addresses:
        ref = referenced_pool(address, kind_of)
        if ref is not None:
            live.addresses_by_pool[ref].append(address)
        live.addresses_by_claim[claim_of_address(address)].append(address)
    for claim in claims:
        live.claims[(claim["metadata"]["namespace"], claim["metadata"]["name"])] = claim
    return live


async def read_live(kube: KubeClient, scope: Scope, kind_of: KindLookup, pacer: Pacer) -> LiveState:
    """The live IPAddresses, then claims, of the watched namespaces, read fresh: one `pacer.wait()` a page."""
    addresses = await _list(kube, ADDRESSES, scope, pacer)
    return cached_live(await _list(kube, CLAIMS, scope, pacer), addresses, kind_of)


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


def object_name(obj: Object) -> str:
    return f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"


def deleting(obj: Object) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


@dataclass(frozen=True)
class Unrecorded:
    """A live IPAddress whose address the backend does not hold for its claim, with that claim."""

    address: Object
    claim: Object

    @property
    def name(self) -> str:
        return object_name(self.address)


@dataclass(frozen=True)
class Sharer:
    """A live claim that names a shared address: through its IPAddress (`address`), or through a holding of the
    backend (`address` None: the claim has no IPAddress yet)."""

    claim: Object
    address: Object | None = None

    @property
    def claim_name(self) -> str:
        return object_name(self.claim)


@dataclass
class PoolComparison:
    suspected: list[Holding] = field(default_factory=list)
    unrecorded: list[Unrecorded] = field(default_factory=list)
    in_use: list[str] = field(default_factory=list)  # addresses of the pool's live IPAddresses (canonical, unique)
    shared: dict[str, list[Sharer]] = field(default_factory=dict)  # canonical address → the claims naming it
    foreign: int = 0  # a namespaced pool's holdings for claims of other namespaces: counted, never looked up


def own_holdings(pool: PoolRef, holdings: Sequence[Holding]) -> list[Holding]:
    """The holdings a pool may account for: a namespaced pool's backend (which its namespace chose, and may control)
    records claims of its own namespace only; a record naming another namespace's claim is never followed there."""
    if pool.namespace is None:
        return list(holdings)
    return [holding for holding in holdings if holding.claim_namespace in ("", pool.namespace)]


def compare_pool(pool: PoolRef, all_holdings: Sequence[Holding], live: LiveState, scope: Scope) -> PoolComparison:
    holdings = own_holdings(pool, all_holdings)
    addresses = [(address, address_text(address)) for address in live.addresses_of(pool)]
    by_name: set[tuple[str, str]] = set()
    by_uid: set[tuple[str, str]] = set()
    for address, text in addresses:
        namespace, name = claim_of_address(address)
        by_name.add((text, f"{namespace}/{name}"))
        uid = owner_claim_uid(address)
        if uid:
            by_uid.add((text, uid))
    result = PoolComparison(foreign=len(all_holdings) - len(holdings))
    held: set[tuple[str, str]] = set()
    for holding in holdings:
        text = normalized_address(holding.address)
        held.add((text, holding.claim_uid))
        if not holding.claim_uid or (text, holding.claim) in by_name or (text, holding.claim_uid) in by_uid:
            continue
        if leak_suspected(holding, text, live, scope):
            result.suspected.append(holding)
    result.shared = shared_addresses(addresses, holdings, live)
    in_use: set[str] = set()
    for address, text in addresses:
        if deleting(address):
            continue
        in_use.add(text)
        if text in result.shared:
            continue
        claim = restorable_claim(address, live, scope)
        if claim is not None and (text, claim["metadata"].get("uid")) not in held:
            result.unrecorded.append(Unrecorded(address, claim))
    result.in_use = sorted(in_use)
    return result


def shared_addresses(
    addresses: Sequence[tuple[Object, str]], holdings: Sequence[Holding], live: LiveState
) -> dict[str, list[Sharer]]:
    """The addresses (canonical) that more than one distinct live claim names (see the module's contract)."""
    naming: dict[str, dict[str, Sharer]] = {}
    for address, text in addresses:
        claim = live.claims.get(claim_of_address(address))
        owner = owner_claim_uid(address)
        if deleting(address) or claim is None or (owner and owner != claim["metadata"].get("uid")):
            continue
        naming.setdefault(text, {}).setdefault(str(claim["metadata"].get("uid")), Sharer(claim, address))
    for holding in holdings:
        namespace, _, name = holding.claim.partition("/")
        claim = live.claims.get((namespace, name)) if holding.claim_uid else None
        if (
            claim is None
            or claim["metadata"].get("uid") != holding.claim_uid
            or live.claim_addresses((namespace, name))
        ):
            continue
        naming.setdefault(normalized_address(holding.address), {}).setdefault(holding.claim_uid, Sharer(claim))
    return {
        text: sorted(sharers.values(), key=lambda sharer: sharer.claim_name)
        for text, sharers in naming.items()
        if len(sharers) > 1
    }


def leak_suspected(holding: Holding, text: str, live: LiveState, scope: Scope) -> bool:
    """Whether an unaccounted holding (at canonical address `text`) is a suspected leak."""
    namespace = holding.claim_namespace
    if not namespace or not scope.watches(namespace):
        return False
    name = holding.claim.partition("/")[2]
    own = live.claim_addresses((namespace, name))
    if any(address_text(address) == text for address in own):
        return False  # its claim's IPAddress (of any pool) names the address: a re-key may be pending
    claim = live.claims.get((namespace, name))
    if claim is None or claim["metadata"].get("uid") != holding.claim_uid:
        return True  # the claim is gone (or another claim has its name now)
    return scope.serves(claim) and bool(own)  # no IPAddress yet: an allocation under way


def restorable_claim(address: Object, live: LiveState, scope: Scope) -> Object | None:
    """The live, served, unpaused claim of the IPAddress, when the IPAddress is the claim's; else None."""
    claim = live.claims.get(claim_of_address(address))
    if claim is None or deleting(claim) or not scope.serves(claim):
        return None
    if ANNOTATION_PAUSED in (claim["metadata"].get("annotations") or {}):
        return None
    owner = owner_claim_uid(address)
    if owner and owner != claim["metadata"].get("uid"):
        return None
    return claim
