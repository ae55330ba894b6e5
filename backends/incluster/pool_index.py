"""The in-memory view of one pool's reservations: an allocator plus who holds what.

It is a *hint* that makes allocation cheap; correctness never depends on it. It is built from a fresh
(consistent) list of the pool's reservations the first time the pool is used by this process, rebuilt when the
pool looks exhausted or is older than the resync period, and updated by this process's own reservations. A
reservation made by another process is discovered when creating it fails with AlreadyExists.

Allocations for several claims of the pool run at once. Each takes its candidate with `take_candidate`, which
marks it pending (used, in memory) in the same step as choosing it, so two allocations of this process never try
the same address; `settle` ends the pending mark once the reservation's create has answered. Pending marks move
to every index that replaces this one (rebuild, spec change), because their creates are still in flight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from backends.incluster.intervals import IntervalSet, PoolAllocator, address_to_int, int_to_address
from backends.incluster.reservations import Reservation, age_seconds


@dataclass
class PoolIndex:
    allocator: PoolAllocator
    family: int
    by_claim: dict[str, Reservation] = field(default_factory=dict)
    by_address: dict[int, Reservation] = field(default_factory=dict)
    # The released reservations still held for the pool's reuse grace period (a subset of by_address), so that
    # finding the expired ones costs what was released, not what is allocated.
    released: dict[int, Reservation] = field(default_factory=dict)
    # Claims seen holding more than one reservation (a race lost by some process, or a crash before cleanup).
    doubly_held: set[str] = field(default_factory=set)
    # Candidates whose reservation create is in flight → the claim uid it is for.
    pending: dict[int, str] = field(default_factory=dict)
    built_at: float = field(default_factory=time.monotonic)
    spec_key: object = None
    generation: int = 0  # the pool's metadata.generation the allocatable set was taken from
    # Whether IPAddresses naming the pool without a reservation have been given one (see `existing`); an index
    # prepared at start, before the IPAddress cache synced, is not, until its first allocation.
    scanned: bool = False
    # Prefix pools: the index's values are child prefix numbers, a reservation's address shifted right by this.
    host_bits: int = 0
    # The pool's own reservations carry this pool label (see `reservations.pool_hash`); only they name its claims
    # (by_claim, doubly_held). Those of the other pools of its uniqueness domain hold addresses only. None: all.
    own_label: str | None = None
    pool_uid: str = ""  # the uid of the pool object the index was built for (a re-created pool is another pool)

    @classmethod
    def build(
        cls,
        allocatable: IntervalSet,
        family: int,
        reservations: list[Reservation],
        spec_key: object,
        pending: dict[int, str] | None = None,
        host_bits: int = 0,
        own_label: str | None = None,
    ) -> PoolIndex:
        """An index of `reservations`; `pending` (shared, not copied) are the in-flight candidates it inherits."""
        index = cls(PoolAllocator(allocatable), family, spec_key=spec_key, host_bits=host_bits, own_label=own_label)
        for reservation in reservations:
            index.hold(reservation)
        if pending is not None:
            index.pending = pending
            for value in pending:
                index.allocator.mark_used(value)
        return index

    def with_allocatable(self, allocatable: IntervalSet, spec_key: object) -> PoolIndex:
        """The same holdings and pending candidates over a new allocatable set (the pool's spec changed)."""
        index = PoolIndex.build(
            allocatable,
            self.family,
            list(self.by_address.values()),
            spec_key,
            self.pending,
            self.host_bits,
            self.own_label,
        )
        index.pool_uid = self.pool_uid
        return index

    def value_of(self, address: str) -> int:
        """The index's integer for an address of the pool's family (ValueError for another family or no IP)."""
        return address_to_int(address, self.family) >> self.host_bits

    def address_of(self, value: int) -> str:
        """The address an integer of the index stands for (for a prefix pool, its child prefix's first address)."""
        return int_to_address(value << self.host_bits, self.family)

    def take_candidate(self, claim_uid: str) -> int | None:
        """The lowest address neither held nor pending, now marked pending for `claim_uid`; None if there is none.
        Choosing and marking happen in one step (no await), so concurrent allocations get distinct candidates."""
        value = self.allocator.lowest_free()
        if value is None:
            return None
        self.allocator.mark_used(value)
        self.pending[value] = claim_uid
        return value

    def settle(self, value: int) -> None:
        """The create for the pending candidate `value` has answered: unmark it, and free it unless a
        reservation for it is now known (call `hold` first when the answer named one)."""
        self.pending.pop(value, None)
        if value not in self.by_address:
            self.allocator.mark_free(value)

    def hold(self, reservation: Reservation) -> None:
        try:
            value = self.value_of(reservation.address)
        except ValueError:
            return  # another family: cannot collide with this pool's addresses
        self.by_address[value] = reservation
        if reservation.released_at is not None:
            self.released[value] = reservation
        else:
            self.released.pop(value, None)
        if reservation.claim_uid and self.owns(reservation):
            known = self.by_claim.get(reservation.claim_uid)
            if known is not None and known.name != reservation.name:
                self.doubly_held.add(reservation.claim_uid)
            self.by_claim[reservation.claim_uid] = reservation
        self.allocator.mark_used(value)

    def owns(self, reservation: Reservation) -> bool:
        """Whether the reservation is the pool's own (not another pool's of its uniqueness domain)."""
        return self.own_label is None or reservation.pool_label == self.own_label

    def drop(self, reservation: Reservation) -> None:
        try:
            value = self.value_of(reservation.address)
        except ValueError:
            return
        known = self.by_address.get(value, reservation)
        if known.name == reservation.name and known.uid == reservation.uid:
            self.by_address.pop(value, None)
            self.released.pop(value, None)
            if value not in self.pending:
                self.allocator.mark_free(value)
        if self.by_claim.get(reservation.claim_uid) == reservation:
            del self.by_claim[reservation.claim_uid]

    def expired_releases(self, grace_seconds: int) -> list[Reservation]:
        """Released reservations whose reuse grace period is over."""
        return [r for r in self.released.values() if age_seconds(r.released_at or "") >= grace_seconds]

    def take_specific(self, value: int, claim_uid: str) -> bool:
        """Mark the address `value` pending for `claim_uid` and return True when it is allocatable and neither held
        (by any reservation, released ones in their grace period included) nor pending; else change nothing and
        return False. For requested and pre-allocated addresses: the allocation policy does not apply."""
        if value in self.by_address or value in self.pending or not self.allocator.is_allocatable(value):
            return False
        self.allocator.mark_used(value)
        self.pending[value] = claim_uid
        return True
