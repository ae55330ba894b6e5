"""`PoolIndex`, one pool's reservations in memory: a *hint*, never the arbiter.

Each allocation takes its candidate with `take_candidate` (by policy) or `take_specific` (by value), marked pending
in the same step, so two allocations of this process never try one address; `settle` ends the mark. An own release
record candidate is taken over; a domain's other pools' records are held, never candidates. A prefix pool's
integers are child numbers.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.intervals import PoolAllocator, address_to_int, address_value, int_to_address
from backends.incluster.policy import AllocationPolicy, AllocationStrategy, Chooser, Releases, grace_over
from backends.incluster.reservations import Reservation


@dataclass
class PoolIndex:
    allocatable: AllocatableSet
    allocator: PoolAllocator
    chooser: Chooser
    policy: AllocationPolicy = field(default_factory=AllocationPolicy)
    by_claim: dict[str, Reservation] = field(default_factory=dict)
    by_address: dict[int, Reservation] = field(default_factory=dict)
    released: dict[int, Reservation] = field(default_factory=dict)  # the release records of by_address
    doubly_held: set[str] = field(default_factory=set)  # claims seen holding more than one reservation
    pending: dict[int, str] = field(default_factory=dict)  # candidates whose write is in flight → their claim uid
    built_at: float = field(default_factory=time.monotonic)
    generation: int = 0  # the pool's metadata.generation the allocatable set was taken from
    scanned: bool = False  # whether the scan (see the module) has run
    reuse_grace_seconds: int = 0  # the pool's addressReuseGracePeriodSeconds (None is 0)
    clock: Callable[[], float] = time.time  # wall-clock seconds, compared with releasedAt
    # The pool label of its own reservations (only they name its claims, only its records are candidates); None: all.
    own_label: str | None = None
    pool_uid: str = ""  # the uid of the pool object the index was built for (a re-created pool is another pool)
    _releases: Releases = field(default_factory=Releases)  # the own release records' releasedAt

    @classmethod
    def build(
        cls,
        allocatable: AllocatableSet,
        reservations: list[Reservation],
        policy: AllocationPolicy = AllocationPolicy(),  # noqa: B008 - frozen, so one shared default is safe
        *,
        pending: dict[int, str] | None = None,
        rng: random.Random | None = None,
        own_label: str | None = None,
    ) -> PoolIndex:
        """An index of `reservations`; `pending` (shared, not copied) are the in-flight candidates it inherits.
        Cost: O(n log n) for n reservations, the allocator and the chooser being built in bulk."""
        valued = [(value, r) for r in reservations if (value := _index_value(allocatable, r.address)) is not None]
        pending = pending if pending is not None else {}
        allocator = PoolAllocator(allocatable.addresses, [*(value for value, _ in valued), *pending])
        index = cls(allocatable, allocator, Chooser(policy, allocator, rng), policy, pending=pending)
        index.own_label = own_label
        for value, reservation in valued:
            index._hold(value, reservation, marked=True)
        return index

    def with_allocatable(self, allocatable: AllocatableSet, policy: AllocationPolicy) -> PoolIndex:
        """The same holdings and pending candidates over a new allocatable set and policy (the spec changed)."""
        held = list(self.by_address.values())
        index = PoolIndex.build(
            allocatable, held, policy, pending=self.pending, rng=self.chooser.rng, own_label=self.own_label
        )
        index.reuse_grace_seconds, index.clock, index.pool_uid = self.reuse_grace_seconds, self.clock, self.pool_uid
        return index

    def value_of(self, address: str) -> int:
        """The index's integer for an address of the pool's family (ValueError for another family or no IP)."""
        return address_to_int(address, self.allocatable.family) >> self.allocatable.host_bits

    def address_of(self, value: int) -> str:
        """The address an integer of the index stands for (for a prefix pool, its child prefix's first address)."""
        return int_to_address(value << self.allocatable.host_bits, self.allocatable.family)

    def owns(self, reservation: Reservation) -> bool:
        """Whether the reservation is the pool's own (not another pool's of its uniqueness domain)."""
        return self.own_label is None or reservation.pool_label == self.own_label

    def set_policy(self, policy: AllocationPolicy) -> None:
        """Choose by `policy` from now on, over the same holdings: O(r) for r runs of used addresses and records."""
        self.policy = policy
        self.chooser = Chooser(policy, self.allocator, self.chooser.rng)
        for value, released_at in self._releases.at.items():
            if value not in self.pending:
                self.chooser.record(value, released_at)

    def take_candidate(self, claim_uid: str) -> int | None:
        """The next address under the policy (never a pinned one, the band last), now marked pending for
        `claim_uid`, in the same step (no await); None if nothing is eligible. A release record chosen stays in
        `released`: take it over."""
        value = self.chooser.choose(self.allocator, self.clock(), self.reuse_grace_seconds)
        if value is not None:
            self._mark_pending(value, claim_uid)
        return value

    def take_specific(self, value: int, claim_uid: str) -> bool:
        """Mark `value` pending for `claim_uid` and return True if it is allocatable, not pending, and held by no
        reservation but an own release record whose grace period is over (then in `released`: take it over); else
        False. The policy does not apply: pinned and band addresses may be taken this way."""
        if value not in self.allocatable.addresses or value in self.pending:
            return False
        if value in self.by_address:
            released_at = self._releases.at.get(value)
            if released_at is None or not grace_over(released_at, self.clock(), self.reuse_grace_seconds):
                return False
        elif self.allocator.is_used(value):
            return False
        self._mark_pending(value, claim_uid)
        return True

    def _mark_pending(self, value: int, claim_uid: str) -> None:
        self._use(value)
        self.chooser.unrecord(value)
        self.pending[value] = claim_uid

    def settle(self, value: int) -> None:
        """The write for the pending candidate `value` has answered: unmark it, and free it unless a reservation for
        it is now known (`hold` it first when the answer named one)."""
        self.pending.pop(value, None)
        if value not in self.by_address:
            self._free(value)
        elif value in self._releases.at:
            self.chooser.record(value, self._releases.at[value])

    def hold(self, reservation: Reservation) -> None:
        value = _index_value(self.allocatable, reservation.address)
        if value is not None:
            self._hold(value, reservation)

    def _hold(self, value: int, reservation: Reservation, marked: bool = False) -> None:
        """Record `reservation` as the holder of `value`; `marked`: the allocator and chooser count it already."""
        self.by_address[value] = reservation
        self._releases.discard(value)
        self.chooser.unrecord(value)
        if reservation.released_at is None:
            self.released.pop(value, None)
        else:
            self.released[value] = reservation
            if self.owns(reservation):  # another pool's record of the domain is held, never taken over from here
                self._releases.add(value, reservation.released_epoch)
                if value not in self.pending:
                    self.chooser.record(value, self._releases.at[value])
        if reservation.claim_uid and self.owns(reservation):
            known = self.by_claim.get(reservation.claim_uid)
            if known is not None and known.name != reservation.name:
                self.doubly_held.add(reservation.claim_uid)
            self.by_claim[reservation.claim_uid] = reservation
        if not marked:
            self._use(value)

    def drop(self, reservation: Reservation) -> None:
        value = _index_value(self.allocatable, reservation.address)
        if value is None:
            return
        known = self.by_address.get(value, reservation)
        if known.name == reservation.name and known.uid == reservation.uid:
            self.by_address.pop(value, None)
            self.released.pop(value, None)
            self._releases.discard(value)
            self.chooser.unrecord(value)
            if value not in self.pending:
                self._free(value)
        if self.by_claim.get(reservation.claim_uid) == reservation:
            del self.by_claim[reservation.claim_uid]

    def held_alone(self, claim_uid: str, value: int) -> None:
        """The claim holds `value` and no other address of the pool now (its other reservations are deleted)."""
        self.doubly_held.discard(claim_uid)
        held = self.by_address.get(value)
        if held is not None and self.owns(held):
            self.by_claim[claim_uid] = held

    def _use(self, value: int) -> None:
        if self.allocator.mark_used(value):
            self.chooser.used(value)

    def _free(self, value: int) -> None:
        if self.allocator.mark_free(value):
            self.chooser.freed(value)

    def in_grace(self) -> tuple[frozenset[int], float | None]:
        """The pool's own release records not reusable yet (in the allocatable set, their reuse grace period not
        over), and the seconds until the first of them is; (empty, None) when there is none. O(k + log n) for k
        records released within the grace period of n."""
        if self.reuse_grace_seconds <= 0:
            return frozenset(), None
        now, grace, order = self.clock(), self.reuse_grace_seconds, self._releases.order
        left = {
            value: released_at + grace - now
            for released_at, value in order.islice(order.bisect_right((now - grace, math.inf)))
            if value in self.allocatable.addresses and not grace_over(released_at, now, grace)
        }
        return frozenset(left), min(left.values(), default=None)

    def expired_releases(self, grace_seconds: int) -> list[Reservation]:
        """Release records to delete, their reuse grace period being over: the pool's own by `grace_seconds` (none
        under LeastRecentlyReleased, whose records are the reuse order); another pool's of the domain by the grace
        period recorded on it (never when none is recorded, see `domains`)."""
        keep_own = self.policy.strategy is AllocationStrategy.LEAST_RECENTLY_RELEASED
        now = self.clock()
        expired = []
        for value, record in self.released.items():
            if value in self.pending:
                continue
            if value in self._releases.at:
                if not keep_own and grace_over(self._releases.at[value], now, grace_seconds):
                    expired.append(record)
            elif record.grace_seconds is not None and grace_over(record.released_epoch, now, record.grace_seconds):
                expired.append(record)
        return expired


def _index_value(allocatable: AllocatableSet, address: str) -> int | None:
    """`PoolIndex.value_of(address)`; None for another family (which cannot collide with the pool's addresses)."""
    value = address_value(address, allocatable.family)
    return None if value is None else value >> allocatable.host_bits
