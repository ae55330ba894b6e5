"""`spec.preAllocations` of an in-cluster pool: claim → the address it gets. An `InClusterIPPool` names claims of its
namespace by name, a `GlobalInClusterIPPool` as `namespace/name`.

An entry whose address is allocatable *pins* it: no dynamic allocation takes it, and only the named claim may
request it; that claim gets exactly it. Wrong entries (`problems`) make the pool Ready=False, the others keep
serving; a claim whose own entry is wrong, or whose address is named twice, gets AllocationFailed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.incluster.allocatable import AllocatableSet, pre_allocation_problems
from backends.incluster.intervals import address_value, int_to_address
from backends.incluster.reservations import Reservation, ReservationClient
from ipam_provider.api.pools import names_pool
from ipam_provider.backend.contract import (
    REQUESTED_ADDRESS_ANNOTATION,
    Allocation,
    AllocationFailedError,
    ClaimContext,
    PoolRef,
)
from ipam_provider.common import Object, normalized_address

NAMESPACED_KEY = "an InClusterIPPool names claims of its own namespace by name alone"
GLOBAL_KEY = "a GlobalInClusterIPPool names claims as namespace/name"


def claim_key(ref: PoolRef, namespace: str, name: str) -> str:
    """The preAllocations key that names the claim `namespace/name` in the pool `ref`."""
    return name if ref.namespace is not None else f"{namespace}/{name}"


def pinned_values(entries: Mapping[str, Any], allocatable: AllocatableSet) -> frozenset[int]:
    """The allocatable addresses that string entries of `preAllocations` name: the keys of `PreAllocations.pinned`."""
    values = (address_value(text, allocatable.family) for text in entries.values() if isinstance(text, str))
    return frozenset(value for value in values if value is not None and value in allocatable.addresses)


def _key_problem(ref: PoolRef, key: str) -> str | None:
    if ref.namespace is not None:
        return None if "/" not in key else f"spec.preAllocations[{key}]: {NAMESPACED_KEY}"
    namespace, slash, name = key.partition("/")
    return None if slash and namespace and name and "/" not in name else f"spec.preAllocations[{key}]: {GLOBAL_KEY}"


@dataclass(frozen=True)
class PreAllocations:
    """A pool's preAllocations: `entries` as written (a value not a string is a problem of its entry alone), each
    allocatable address named → the keys naming it (`pinned`), and what is wrong with the entries on their own."""

    ref: PoolRef
    family: int
    entries: Mapping[str, Any]
    pinned: Mapping[int, tuple[str, ...]]
    problems: tuple[str, ...]

    @classmethod
    def of(cls, ref: PoolRef, entries: Mapping[str, Any], allocatable: AllocatableSet) -> PreAllocations:
        texts = {key: text for key, text in entries.items() if isinstance(text, str)}
        pinned: dict[int, tuple[str, ...]] = {}
        for key, text in sorted(texts.items()):
            value = address_value(text, allocatable.family)
            if value is not None and value in allocatable.addresses:
                pinned[value] = (*pinned.get(value, ()), key)
        problems = [
            f"spec.preAllocations[{key}]: {entries[key]!r} is not a string"
            for key in sorted(entries)
            if key not in texts
        ]
        problems += pre_allocation_problems(texts, allocatable)
        problems += [problem for key in sorted(entries) if (problem := _key_problem(ref, key)) is not None]
        return cls(ref, allocatable.family, dict(entries), pinned, tuple(problems))

    def wanted(self, claim: ClaimContext) -> str | None:
        """The address the claim must get: its pre-allocated one, else the one it requests, else None (any).
        Raises AllocationFailedError for a non-IP annotation, a wrong entry of its own, or the two disagreeing."""
        requested = claim.requested_address
        pre_allocated = self.address_of(claim)
        if pre_allocated is None or requested in (None, pre_allocated):
            return requested if pre_allocated is None else pre_allocated
        raise AllocationFailedError(
            f"claim {claim} requests {requested} with annotation {REQUESTED_ADDRESS_ANNOTATION}, but {self.ref} "
            f"pre-allocates {pre_allocated} to it in spec.preAllocations; remove the annotation or change the pool"
        )

    def address_of(self, claim: ClaimContext) -> str | None:
        """The canonical address pre-allocated to the claim, or None when no entry names it. Raises
        AllocationFailedError when its entry is wrong or its address is pre-allocated to another claim too."""
        key = claim_key(self.ref, claim.namespace, claim.name)
        text = self.entries.get(key)
        if text is None:
            return None
        value = address_value(text, self.family) if isinstance(text, str) else None
        if value is None or value not in self.pinned:
            own = [p for p in self.problems if p.startswith(f"spec.preAllocations[{key}]")]
            detail = "; ".join(own) or f"spec.preAllocations[{key}]: {text!r} is not usable"
            raise AllocationFailedError(
                f"{self.ref} pre-allocates an address to this claim, but {detail}; fix the pool"
            )
        address = int_to_address(value, self.family)
        if len(self.pinned[value]) > 1:
            keys = ", ".join(self.pinned[value])
            raise AllocationFailedError(
                f"{self.ref} pre-allocates {address} to more than one claim ({keys}); fix spec.preAllocations"
            )
        return address

    def pinned_for_others(self, value: int, claim: ClaimContext) -> tuple[str, ...]:
        """The keys `value` is pre-allocated to, when none of them is the claim; else ()."""
        keys = self.pinned.get(value, ())
        return () if claim_key(self.ref, claim.namespace, claim.name) in keys else keys

    def held_by_named(self, value: int, holder: str) -> bool:
        """Whether `holder` (namespace/name) is a claim that `value` is pre-allocated to."""
        namespace, _, name = holder.partition("/")
        return claim_key(self.ref, namespace, name) in self.pinned.get(value, ())

    def pins(self, reservation: Reservation) -> bool:
        """Whether the reservation's address is pre-allocated to the reservation's claim."""
        value = address_value(reservation.address, self.family)
        return value is not None and self.held_by_named(value, reservation.claim)

    def named_claim(self, value: int) -> tuple[str, str] | None:
        """(namespace, name) of the one claim `value` is pre-allocated to; None when it is not pinned, is pinned to
        several keys, or its key has the wrong form for the pool (such entries are problems, see `problems`)."""
        keys = self.pinned.get(value, ())
        if len(keys) != 1 or _key_problem(self.ref, keys[0]) is not None:
            return None
        if self.ref.namespace is not None:
            return self.ref.namespace, keys[0]
        namespace, _, name = keys[0].partition("/")
        return namespace, name


async def collisions(
    pre: PreAllocations,
    addresses: Sequence[Allocation],
    cached: Sequence[Object] | None,
    reservations: ReservationClient,
) -> tuple[list[str], int]:
    """The pre-allocated addresses already held by a claim they are not pre-allocated to (as problems), and how
    many pinned addresses no IPAddress names yet. Holders come from the pool's cached IPAddresses, else (the cache
    cannot answer for the pool) from one list of the pool's reservations."""
    used = {normalized_address(allocation.address) for allocation in addresses}
    taken = {value: int_to_address(value, pre.family) for value in pre.pinned}
    taken = {value: text for value, text in taken.items() if text in used}
    problems: list[str] = []
    if taken:
        holders = _holders(pre.ref, cached) if cached is not None else await _reserved_by(pre.ref, reservations)
        for value, text in sorted(taken.items()):
            holder = holders.get(text)
            if holder is not None and not pre.held_by_named(value, holder):
                keys = ", ".join(pre.pinned[value])
                problems.append(f"spec.preAllocations[{keys}]: {text} is already held by claim {holder}")
    return problems, len(pre.pinned) - len(taken)


async def _reserved_by(ref: PoolRef, reservations: ReservationClient) -> dict[str, str]:
    """Address → namespace/name of the claim of each live reservation of the pool."""
    listed = await reservations.list_pool(ref)
    return {normalized_address(r.address): r.claim for r in listed if not r.released_at}


def _holders(ref: PoolRef, cached: Sequence[Object]) -> dict[str, str]:
    """Address → namespace/name of the claim of each cached IPAddress naming the pool."""
    holders: dict[str, str] = {}
    for address in cached:
        if names_pool(address, ref):
            spec, meta = address.get("spec") or {}, address["metadata"]
            claim_name = (spec.get("claimRef") or {}).get("name") or meta["name"]
            holders[normalized_address(str(spec.get("address", "")))] = f"{meta.get('namespace', '')}/{claim_name}"
    return holders
