"""Uniqueness domains: in-cluster pools that never hand out one address twice between them, although their
addresses overlap.

A pool joins a domain with `spec.uniquenessDomain: <name>`. Domain names are cluster-wide: namespaced and global
pools of any namespace that name the same domain share it. The field cannot change once set, nor be set later
(a CEL rule of the CRDs): a pool's reservations are named by its domain, so a change would strand them.

Contract:
- A domain pool's reservations are named `<domain hash>.<address>` (see `reservations`), so the API server's
  create-uniqueness decides between every pool of the domain, across processes and restarts.
- A domain pool's index is built from every reservation of the domain (listed by the domain's label): addresses
  held by the domain's other pools are used for it too. Each reservation keeps its own pool's label, so a pool's
  own accounting (its claims, their release, its holdings for the repair loop, the sweep of deleted pools) sees only its
  own reservations.
- A released reservation records its pool's reuse grace period; any pool of the domain deletes it once that is
  over (`PoolIndex.expired_releases`), so that a pool which no longer allocates does not keep its released
  addresses from the others. A pool's own releases expire by its current grace period (none: at once), except under
  LeastRecentlyReleased, whose release records are never deleted for expiry: such a pool records no grace period
  on them, so the domain's other pools never delete them either (see `released`).
- Before a domain pool's index serves its first allocation, the IPAddresses of every pool of the domain
  (`domain_pools`) without a reservation get one (see `indexes`, `existing`).
- A reservation held by another pool of the domain is never taken over by a claim of this pool (see `adoption`),
  nor is its release record (see `pool_index`).
- `held_elsewhere` gives the addresses of a pool held by the other pools of its domain, for its free count.
- A domain name is a DNS label (`DOMAIN_PATTERN`, at most 63 characters), as the CRDs say; the controller checks
  it too (it is a label value and part of label selectors): a pool with another name is InvalidConfiguration.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence

from backends.incluster.intervals import IntervalSet, address_value, int_to_address
from backends.incluster.orphans import pool_resource
from ipam_provider.backend.contract import PoolKind, PoolRef
from ipam_provider.common import Object, normalized_address
from ipam_provider.runtime.kube.client import KubeClient

DOMAIN_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # the CRDs' pattern for spec.uniquenessDomain
DOMAIN_MAX_LENGTH = 63


def domain_problem(domain: str) -> str | None:
    """Why `domain` is not a valid uniqueness domain name, or None when it is one."""
    if len(domain) > DOMAIN_MAX_LENGTH or re.fullmatch(DOMAIN_PATTERN[1:-1], domain) is None:
        return (
            f"uniquenessDomain {domain[: DOMAIN_MAX_LENGTH + 1]!r} is not a DNS label (at most {DOMAIN_MAX_LENGTH} "
            "lower-case letters, digits and '-', starting and ending with a letter or digit)"
        )
    return None


async def domain_pools(
    kube: KubeClient,
    kinds: Sequence[PoolKind],
    cached_pools: Callable[[PoolKind], Sequence[Object] | None],
    domain: str,
) -> list[PoolRef]:
    """The pools of `kinds` whose spec names `domain` (invalid ones too: their IPAddresses still hold addresses),
    from the controller's pool caches, else (not synced) from a LIST."""
    found: list[PoolRef] = []
    for kind in kinds:
        pools = cached_pools(kind)
        if pools is None:
            pools, _ = await kube.list(pool_resource(kind))
        for pool in pools:
            meta = pool["metadata"]
            if (pool.get("spec") or {}).get("uniquenessDomain") == domain:
                found.append(kind.ref(meta.get("namespace") if kind.namespaced else None, meta["name"]))
    return found


def held_elsewhere(
    allocatable: IntervalSet, family: int, own: Sequence[str], others: Iterable[Sequence[Object] | None]
) -> frozenset[int]:
    """The pool's allocatable addresses that the IPAddresses of the domain's other pools (`others`, one sequence
    per pool; None where it is not known) hold, but not the pool's own IPAddresses (`own`, their addresses)."""
    mine = {address_value(address, family) for address in own}
    elsewhere: set[int] = set()
    for items in others:
        for item in items or ():
            value = address_value(str((item.get("spec") or {}).get("address", "")), family)
            if value is not None and value in allocatable and value not in mine:
                elsewhere.add(value)
    return frozenset(elsewhere)


def unheld_pinned(pinned: Collection[int], family: int, own: Sequence[str]) -> frozenset[int]:
    """The pre-allocated addresses (`pinned`) that none of the pool's own IPAddresses (`own`) holds yet."""
    used = {normalized_address(address) for address in own}
    return frozenset(value for value in pinned if int_to_address(value, family) not in used)
