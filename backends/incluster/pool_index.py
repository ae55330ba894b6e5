"""The in-memory view of one pool's reservations: an allocator plus who holds what. A *hint* that makes allocation
cheap: the API server's create-uniqueness decides (see `reservations`); the `ledger` keeps it in step.

Allocations of the pool run at once: each takes its candidate with `take_candidate` (by the pool's policy) or
`take_specific` (by value), marking it pending in the same step, so two allocations of this process never try one
address; `settle` ends the mark when the write answered. Pending marks move to every index replacing this one. A
candidate may be an own release record (`released[value]`), taken over instead of created; the records of a
domain's other pools are held, never candidates. A prefix pool's integers are child numbers (`value_of`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.intervals import PoolAllocator, address_to_int, int_to_address
from backends.incluster.policy import AllocationPolicy, AllocationStrategy, Chooser, grace_over
from backends.incluster.reservations import Reservation


@dataclass
class PoolIndex:
    allocatable: AllocatableSet
    allocator: PoolAllocator
    chooser: Chooser
    policy: AllocationPolicy = field(default_factory=AllocationPolicy)
    by_claim: dict[str, Reservation] = field(default_factory=dict)
    by_address: dict[int, Reservation] = field(default_factory=dict)
    # The release records (a subset of by_address): finding the expired ones costs what was released.
    released: dict[int, Reservation] = field(default_factory=dict)
    # Claims seen holding more than one reservation (a race lost by some process, or a crash before cleanup).
    doubly_held: set[str] = field(default_factory=set)
    # Candidates whose reservation write is in flight → the claim uid it is for.
    pending: dict[int, str] = field(default_factory=dict)
    built_at: float = field(default_factory=time.monotonic)
    generation: int = 0  # the pool's metadata.generation the allocatable set was taken from
    # Whether IPAddresses naming the pool without a reservation have been given one (see `ledger`).
    scanned: bool = False
    reuse_grace_seconds: int = 0  # the pool's addressReuseGracePeriodSeconds (None is 0)
    clock: Callable[[], float] = time.time  # wall-clock seconds, compared with releasedAt
    # The pool label of the pool's own reservations: only they name its claims and only its release records are
    # candidates; those of the other pools of its uniqueness domain hold addresses only. None: all are its own.
    own_label: str | None = None
    pool_uid: str = ""  # the uid of the pool object the index was built for (a re-created pool is another pool)
    _released_at: dict[int, float] = field(default_factory=dict)  # the own release records' releasedAt (epoch)

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
        valued: list[tuple[int, Reservation]] = []
        for reservation in reservations:
            try:
                value = address_to_int(reservation.address, allocatable.family) >> allocatable.host_bits
            except ValueError:
                continue  # another family: cannot collide with this pool's addresses
            valued.append((value, reservation))
        return cls._build(allocatable, valued, policy, pending if pending is not None else {}, rng, own_label)

    @classmethod
    def _build(
        cls,
        allocatable: AllocatableSet,
        valued: list[tuple[int, Reservation]],
        policy: AllocationPolicy,
        pending: dict[int, str],
        rng: random.Random | None,
        own_label: str | None,
    ) -> PoolIndex:
        allocator = PoolAllocator(allocatable.addresses, [*(value for value, _ in valued), *pending])
        index = cls(allocatable, allocator, Chooser(policy, allocator, rng), policy, pending=pending)
        index.own_label = own_label
        for value, reservation in valued:
            index._hold(value, reservation, marked=True)
        return index

    def with_allocatable(self, allocatable: AllocatableSet, policy: AllocationPolicy) -> PoolIndex:
        """The same holdings and pending candidates over a new allocatable set and policy (the spec changed)."""
        held = list(self.by_address.items())
        index = PoolIndex._build(allocatable, held, policy, self.pending, None, self.own_label)
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
        """Choose by `policy` from now on, over the same holdings. Cost: O(r) for r runs of used addresses, plus
        the release records; no reservation is parsed again."""
        self.policy = policy
        self.chooser = Chooser(policy, self.allocator)
        for value, released_at in self._released_at.items():
            if value not in self.pending:
                self.chooser.record(value, released_at)

    def take_candidate(self, claim_uid: str) -> int | None:
        """The next address under the policy (never a pinned one, the band last), now marked pending for
        `claim_uid`; None if nothing is eligible. Choosing and marking happen in one step (no await), so concurrent
        allocations get distinct candidates. A release record chosen stays in `released`: take it over."""
        value = self.chooser.choose(self.allocator, self.clock(), self.reuse_grace_seconds)
        if value is not None:
            self._mark_pending(value, claim_uid)
        return value

    def take_specific(self, value: int, claim_uid: str) -> bool:
        """Mark `value` pending for `claim_uid` and return True if it is allocatable, not pending, and held by no
        reservation but an own release record whose grace period is over (then in `released`: take it over); else
        False. The policy does not apply: pinned and band addresses may be taken this way."""
        if not self.allocator.is_allocatable(value) or value in self.pending:
            return False
        if value in self.by_address:
            released_at = self._released_at.get(value)
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
        elif value in self._released_at:
            self.chooser.record(value, self._released_at[value])

    def hold(self, reservation: Reservation) -> None:
        try:
            value = self.value_of(reservation.address)
        except ValueError:
            return  # another family: cannot collide with this pool's addresses
        self._hold(value, reservation)

    def _hold(self, value: int, reservation: Reservation, marked: bool = False) -> None:
        """Record `reservation` as the holder of `value`; `marked`: the allocator and chooser count it already."""
        self.by_address[value] = reservation
        self._released_at.pop(value, None)
        self.chooser.unrecord(value)
        if reservation.released_at is None:
            self.released.pop(value, None)
        else:
            self.released[value] = reservation
            if self.owns(reservation):  # another pool's record of the domain is held, never taken over from here
                self._released_at[value] = reservation.released_epoch
                if value not in self.pending:
                    self.chooser.record(value, self._released_at[value])
        if reservation.claim_uid and self.owns(reservation):
            known = self.by_claim.get(reservation.claim_uid)
            if known is not None and known.name != reservation.name:
                self.doubly_held.add(reservation.claim_uid)
            self.by_claim[reservation.claim_uid] = reservation
        if not marked:
            self._use(value)

    def drop(self, reservation: Reservation) -> None:
        try:
            value = self.value_of(reservation.address)
        except ValueError:
            return
        known = self.by_address.get(value, reservation)
        if known.name == reservation.name and known.uid == reservation.uid:
            self.by_address.pop(value, None)
            self.released.pop(value, None)
            self._released_at.pop(value, None)
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
            if value in self._released_at:
                if not keep_own and grace_over(self._released_at[value], now, grace_seconds):
                    expired.append(record)
            elif record.grace_seconds is not None and grace_over(record.released_epoch, now, record.grace_seconds):
                expired.append(record)
        return expired
