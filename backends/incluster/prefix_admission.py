"""What the admission webhook refuses for a prefix pool, beyond what the CRD's OpenAPI and CEL rules check.

`prefix_pool_change_problems(old, new, in_use)` answers the reasons to refuse a CREATE (`old` None) or an UPDATE:

- a spec the backend cannot use (`parse_prefix_pool` fails where CEL let it through: a reversed range in
  `excludedPrefixes`, ...), with the backend's message; on UPDATE only the messages the old spec did not have;
- on UPDATE, child prefixes in use that the new spec would no longer hand out (outside `prefixes`, overlapping an
  `excludedPrefixes` entry, or of another length than `allocationPrefixLength`) while the old spec would: the Go
  provider's "existing allocations become non-allocatable" with the IPAddresses' addresses, then their names.

An UPDATE that leaves the spec as it is (finalizers, annotations, labels) is never refused. A changed
`allocationPrefixLength` is refused by the CRD's own rule; should one get through, every child in use is stranded
and refused here. DELETE is checked by the core. Cost: O(k log k) for k spec entries plus O(n log k) for n
IPAddresses in use; no request is made.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from backends.incluster.allocatable import ADDRESS_BITS, AllocatableSet, PoolSpecError, without_field
from backends.incluster.pool_spec import parse_prefix_pool
from backends.incluster.prefix_allocatable import child_of
from backends.validation import spec_error
from ipam_provider.backend.contract import AddressInUse
from ipam_provider.common import Object

STRANDED = "existing allocations become non-allocatable"  # the Go provider's text
LISTED = 10  # addresses and IPAddresses named in one message; the rest are counted


def prefix_pool_change_problems(old: Object | None, new: Object | None, in_use: Sequence[AddressInUse]) -> list[str]:
    """The reasons to refuse changing the prefix pool `old` into `new` (see the module's docstring)."""
    if new is None:
        return []
    if old is not None and (old.get("spec") or {}) == (new.get("spec") or {}):
        return []
    allocatable, problems = _parsed(new)
    previous, known = _parsed(old) if old is not None else (None, [])
    known = [without_field(problem) for problem in known]
    problems = [problem for problem in problems if without_field(problem) not in known]
    if problems:
        return [f"the pool's spec is invalid: {'; '.join(problems)}"]
    if old is None or allocatable is None:
        return []
    return _stranded(previous, allocatable, in_use)


def _parsed(pool: Object) -> tuple[AllocatableSet | None, list[str]]:
    """The pool's allocatable children, or None and the backend's messages for a spec it cannot use."""
    try:
        _, allocatable = parse_prefix_pool(pool)
    except PoolSpecError as error:
        return None, list(error.messages)
    except ValidationError as error:
        return None, [spec_error(error)]
    except ValueError as error:
        return None, [str(error).splitlines()[0]]
    return allocatable, []


def _stranded(
    previous: AllocatableSet | None, allocatable: AllocatableSet, in_use: Sequence[AddressInUse]
) -> list[str]:
    """The Go provider's refusal for IPAddresses whose child prefix the new spec would not hand out and the old one
    would (any, when the old spec could not be parsed), with the addresses as the Go provider lists them."""
    holders = [
        address
        for address in in_use
        if not _allocatable(address, allocatable) and (previous is None or _allocatable(address, previous))
    ]
    if not holders:
        return []
    addresses = sorted(address.address for address in holders)
    names = sorted(str(address) for address in holders)
    return [
        f"{STRANDED}: [{' '.join(addresses[:LISTED])}]{_more(addresses)} (held by IPAddresses "
        f"{', '.join(names[:LISTED])}{_more(names)}); keep their prefixes in the pool or release them first"
    ]


def _allocatable(address: AddressInUse, allocatable: AllocatableSet) -> bool:
    """Whether the pool could hand out the IPAddress's prefix now; an IPAddress without a prefix is taken to carry
    the pool's allocation length."""
    length = ADDRESS_BITS[allocatable.family] - allocatable.host_bits
    prefix = address.prefix if address.prefix is not None else length
    return child_of(address.address, prefix, allocatable) is not None


def _more(items: Sequence[str]) -> str:
    return f" and {len(items) - LISTED} more" if len(items) > LISTED else ""
