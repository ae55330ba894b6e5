"""Pin reservations: `spec.preAllocations` enforced by the API server, not only by the pool spec a process has cached.

Every valid pre-allocation whose address is free gets a reservation held for the named claim before that claim
exists: its `claim` is the named claim's namespace/name with an empty uid ("pinned, not yet taken"). A claim that
tries the address from a stale pool spec (dynamically, or by requesting it) fails to create its own reservation
(AlreadyExists) and learns that the address is held; the named claim takes the pin reservation over by patching its
uid, guarded by the reservation's resourceVersion (`ReservationClient.reassign`).

Contract of `enforce_pins` (called from each reconcile of the pool, with the IPAddresses naming it):
- Creates the pin reservation of each address pinned to exactly one well-formed key that no IPAddress names and no
  reservation known to the pool's index holds. A reservation found in its place (AlreadyExists) is only learned.
- Deletes each reservation of the pool's own (not another pool's of its uniqueness domain) with an empty claim
  uid, not released, whose address is no longer pinned to its claim, that no IPAddress names (by the given list,
  then by a fresh read): a removed pin frees its address again.
  Reservations with an empty uid made for an existing IPAddress (see `existing`) are kept while it exists.
- Does nothing when the caller read an older pool spec than the index was built from.
- Deletion uses the uid and resourceVersion preconditions: a reservation taken over meanwhile is kept.

Releasing the named claim gives its reservation back to the pin (uid "" again) while the spec still names the
address for that claim, so the address stays pinned (see `release`).

What remains: another claim created in the same apply as a pin can be given the pinned address by a process that
has not seen the pin yet, before a pool reconcile creates the pin reservation; the pool then reports the collision
(Ready=False). The admission webhook refuses pins that collide with addresses already held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.indexes import PoolIndexes
from backends.incluster.intervals import address_to_int, int_to_address
from backends.incluster.orphans import still_named
from backends.incluster.policy import AllocationPolicy
from backends.incluster.pool_index import PoolIndex
from backends.incluster.preallocations import PreAllocations
from backends.incluster.released import reserve_or_take_over
from backends.incluster.reservations import Reservation
from ipam_provider.backend.contract import Allocation, PoolRef
from ipam_provider.common import normalized_address

if TYPE_CHECKING:
    from backends.incluster.pool_spec import InClusterPoolSpec

log = structlog.get_logger(__name__)


async def enforce_pool_pins(
    indexes: PoolIndexes,
    generation: int,
    allocatable: AllocatableSet,
    spec: InClusterPoolSpec,
    policy: AllocationPolicy,
    pre: PreAllocations,
    addresses: Sequence[Allocation],
    *,
    uid: str = "",
) -> None:
    """`enforce_pins` for a pool reconcile that read the pool object `uid`'s spec at `generation`, over the pool's
    index. A pool without pins whose index (for that object) is not built has no pin reservations this process
    knows of: nothing to do."""
    if pre.pinned:
        index = await indexes.index(pre.ref, allocatable, generation, spec.reuse_grace_seconds, policy, uid)
    else:
        found = indexes.get(pre.ref)
        if found is None or found.pool_uid != uid:
            return
        index = found
    if index.generation > generation:
        return  # this reconcile read an older spec than the index's: the newer one decides
    await enforce_pins(indexes, index, pre, spec.prefix, spec.gateway, addresses)


async def enforce_pins(
    indexes: PoolIndexes,
    index: PoolIndex,
    pre: PreAllocations,
    prefix: int,
    gateway: str | None,
    addresses: Sequence[Allocation],
) -> None:
    """Create the missing pin reservations of the pool and delete those of removed pins (see the module)."""
    backed = {normalized_address(allocation.address) for allocation in addresses}
    for value in sorted(pre.pinned):
        named = pre.named_claim(value)
        text = int_to_address(value, pre.family)
        if named is not None and text not in backed:
            await _pin(indexes, index, pre.ref, value, text, prefix, gateway, named)
    await _unpin_removed(indexes, index, pre, backed)


async def _pin(
    indexes: PoolIndexes,
    index: PoolIndex,
    ref: PoolRef,
    value: int,
    text: str,
    prefix: int,
    gateway: str | None,
    named: tuple[str, str],
) -> None:
    index = indexes.current(ref, index)
    if not index.take_specific(value, ""):
        return  # held (by the pin, its claim or another one: `collisions` tells) or being reserved right now
    record = index.released.get(value)  # the pool's own release record, its grace period over: taken over
    learned: Reservation | None = None
    try:
        claim = (named[0], named[1], "")
        learned = await reserve_or_take_over(indexes.reservations, ref, record, text, prefix, gateway, claim)
        if learned is not None and learned.claim == "/".join(named) and not (learned.claim_uid or learned.released_at):
            log.info("pre-allocated address pinned", pool=str(ref), address=text, claim="/".join(named))
    finally:
        current = indexes.current(ref, index)
        if learned is not None:
            current.hold(learned)
        elif record is not None:
            current.drop(record)
        current.settle(value)


async def _unpin_removed(indexes: PoolIndexes, index: PoolIndex, pre: PreAllocations, backed: set[str]) -> None:
    current = indexes.current(pre.ref, index)
    for reservation in list(current.by_address.values()):
        if reservation.claim_uid or reservation.released_at or normalized_address(reservation.address) in backed:
            continue
        if not current.owns(reservation):
            continue  # another pool's of the uniqueness domain: its pins are its own
        try:
            value = address_to_int(reservation.address, pre.family)
        except ValueError:
            continue
        if pre.held_by_named(value, reservation.claim) or await still_named(indexes.kube, reservation, pre.ref):
            continue
        await indexes.reservations.delete(reservation)
        indexes.current(pre.ref, index).drop(reservation)
        log.info("pin removed", pool=str(pre.ref), address=reservation.address, claim=reservation.claim)
