"""What the admission webhook refuses for an in-cluster pool, beyond what the CRD's OpenAPI and CEL rules check.

`pool_change_problems(old, new, in_use)` answers the reasons to refuse a CREATE (`old` None) or an UPDATE:

- a spec the backend cannot use (`parse_pool` fails: an address outside the subnet, a reversed range, ...), with
  the message the pool's Ready condition would carry;
- `spec.preAllocations` entries that do not parse, lie outside the pool's allocatable addresses or name one address
  for two claims (`pre_allocation_problems`), or name an address that a live IPAddress of another claim holds;
- on UPDATE, addresses in use that the new spec no longer contains: the Go provider's "pool addresses do not
  contain allocated addresses", followed by the IPAddresses that hold them. An address of the other IP family
  than the new spec's is not contained: switching a pool between IPv4 and IPv6 strands every address it held.

An UPDATE that leaves the spec as it is (finalizers, annotations, labels: the controller's own patches and
clusterctl move's) is never refused, and an UPDATE is refused only for problems the old spec did not have already,
so that a pool made before the webhook ran can still be repaired step by step. DELETE is checked by the core.
Cost: O(k log k) for k spec entries plus O(n log k) for n addresses in use; no request is made.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from backends.incluster.allocatable import AllocatableSet, PoolSpecError, pre_allocation_problems
from backends.incluster.intervals import address_to_int, int_to_address
from backends.incluster.pool_spec import first_line, parse_pool
from backends.incluster.preallocations import claim_key
from ipam_provider.backend.contract import AddressInUse, PoolRef
from ipam_provider.common import Object, normalized_address

STRANDED = "pool addresses do not contain allocated addresses"  # the Go provider's text
LISTED_HOLDERS = 10  # IPAddresses named in one message; the rest are counted


def pool_change_problems(old: Object | None, new: Object | None, in_use: Sequence[AddressInUse]) -> list[str]:
    """The reasons to refuse changing the pool `old` into `new` (see the module's docstring)."""
    if new is None:
        return []
    if old is not None and (old.get("spec") or {}) == (new.get("spec") or {}):
        return []
    try:
        _, allocatable = parse_pool(new)
    except (PoolSpecError, ValidationError, ValueError) as error:
        return [f"the pool's spec is invalid: {first_line(error)}"]
    problems = _pre_allocation_problems(new, allocatable, in_use)
    previous: AllocatableSet | None = None
    if old is not None:
        try:
            _, previous = parse_pool(old)
        except (PoolSpecError, ValidationError, ValueError):
            previous = None
        if previous is not None:
            known = set(_pre_allocation_problems(old, previous, in_use))
            problems = [problem for problem in problems if problem not in known]
        problems += _stranded(previous, allocatable, in_use)
    return problems


def _pre_allocation_problems(pool: Object, allocatable: AllocatableSet, in_use: Sequence[AddressInUse]) -> list[str]:
    raw: Any = (pool.get("spec") or {}).get("preAllocations")
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        return ["spec.preAllocations must map claim names to addresses"]
    entries = {str(name): str(address) for name, address in raw.items()}
    problems = pre_allocation_problems(entries, allocatable)
    holders: dict[str, list[AddressInUse]] = {}
    for address in in_use:
        holders.setdefault(normalized_address(address.address), []).append(address)
    ref = PoolRef.from_object(pool)
    for claim_name, text in sorted(entries.items()):
        for holder in holders.get(normalized_address(text), []):
            holder_namespace, _, holder_name = holder.claim.partition("/")
            if claim_key(ref, holder_namespace, holder_name) != claim_name:
                problems.append(
                    f"spec.preAllocations[{claim_name}]: {normalized_address(text)} is already held by claim "
                    f"{holder.claim} (IPAddress {holder}); pre-allocate another address or release that one first"
                )
    return problems


def _stranded(
    previous: AllocatableSet | None, allocatable: AllocatableSet, in_use: Sequence[AddressInUse]
) -> list[str]:
    """The Go provider's refusal for addresses in use that the new spec leaves out (and the old one held, when it
    could be parsed), as ranges per family, then the IPAddresses holding them. An address of the other family than
    the new spec's is left out by it: a pool switched between IPv4 and IPv6 strands every address it held."""
    values: set[tuple[int, int]] = set()
    holders: list[AddressInUse] = []
    for address in in_use:
        held = _family_value(address.address)
        if held is None or _contains(allocatable, held):
            continue
        if previous is not None and not _contains(previous, held):
            continue  # outside the pool already: this change does not strand it
        values.add(held)
        holders.append(address)
    if not values:
        return []
    ranges = " ".join(
        f"{int_to_address(first, family)}-{int_to_address(last, family)}"
        for family, first, last in _runs(sorted(values))
    )
    names = sorted(str(holder) for holder in holders)
    listed = ", ".join(names[:LISTED_HOLDERS])
    if len(names) > LISTED_HOLDERS:
        listed += f" and {len(names) - LISTED_HOLDERS} more"
    return [f"{STRANDED}: [{ranges}] (held by IPAddresses {listed}); keep them in the pool or release them first"]


def _contains(allocatable: AllocatableSet, held: tuple[int, int]) -> bool:
    family, value = held
    return family == allocatable.family and value in allocatable.addresses


def _runs(values: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Consecutive (family, value) pairs as (family, first, last)."""
    runs: list[tuple[int, int, int]] = []
    for family, value in values:
        if runs and runs[-1][0] == family and runs[-1][2] + 1 == value:
            runs[-1] = (family, runs[-1][1], value)
        else:
            runs.append((family, value, value))
    return runs


def _family_value(text: str) -> tuple[int, int] | None:
    """The IP family and integer of an IPAddress's `spec.address`, or None if it is not an address."""
    try:
        version = ipaddress.ip_address(text.split("/")[0].strip()).version
        return version, address_to_int(text.split("/")[0], version)
    except ValueError:  # not an address, or a scoped IPv6 one: no pool holds it
        return None
