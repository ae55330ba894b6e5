"""The in-memory view of one pool's reservations: an allocator plus who holds what.

It is a *hint* that makes allocation cheap; correctness never depends on it. It is built from a fresh
(consistent) list of the pool's reservations the first time the pool is used by this process, rebuilt when the
pool looks exhausted or is older than the resync period, and updated by this process's own reservations. A
reservation made by another process is discovered when creating it fails with AlreadyExists.

Allocations for several claims of the pool run at once. Each takes its candidate with `take_candidate` (chosen by
the pool's `AllocationPolicy`, see `strategies`) or `take_specific` (an address named by value), which marks it
pending (used, in memory) in the same step as choosing it, so two allocations of this process never try the same
address; `settle` ends the pending mark once the reservation's write has answered. Pending marks move to every
index that replaces this one (rebuild, spec change), because their writes are still in flight.

A candidate may be a *release record* (a released reservation kept under LeastRecentlyReleased, or one whose
grace period is over, see `released`): `released[value]` then names it, and the caller takes it over instead of
creating a reservation. Only the pool's own records are candidates: in a uniqueness domain the index also holds
the records of the domain's other pools, which stay theirs (they expire by their recorded grace, see `domains`).

Prefix pools: the index's integers are child prefix numbers (`host_bits`, `value_of`, `address_of`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from backends.incluster.intervals import IntervalSet, PoolAllocator, address_to_int, int_to_address
from backends.incluster.policy import AllocationPolicy, AllocationStrategy
from backends.incluster.released import released_epoch
from backends.incluster.reservations import Reservation
from backends.incluster.strategies import Chooser, grace_over


@dataclass
class PoolIndex:
    allocator: PoolAllocator
    family: int
    chooser: Chooser
    policy: AllocationPolicy = field(default_factory=AllocationPolicy)
    by_claim: dict[str, Reservation] = field(default_factory=dict)
    by_address: dict[int, Reservation] = field(default_factory=dict)
    # The release records (a subset of by_address), so that finding the expired ones costs what was released, not
    # what is allocated.
    released: dict[int, Reservation] = field(default_factory=dict)
    # Claims seen holding more than one reservation (a race lost by some process, or a crash before cleanup).
    doubly_held: set[str] = field(default_factory=set)
    # Candidates whose reservation write is in flight → the claim uid it is for.
    pending: dict[int, str] = field(default_factory=dict)
    built_at: float = field(default_factory=time.monotonic)
    spec_key: object = None
    generation: int = 0  # the pool's metadata.generation the allocatable set was taken from
    # Whether IPAddresses naming the pool without a reservation have been given one (see `existing`); an index
    # prepared at start, before the IPAddress cache synced, is not, until its first allocation.
    scanned: bool = False
    reuse_grace_seconds: int = 0  # the pool's addressReuseGracePeriodSeconds (None is 0)
    clock: Callable[[], float] = time.time  # wall-clock seconds, compared with releasedAt
    # Prefix pools: the index's values are child prefix numbers, a reservation's address shifted right by this.
    host_bits: int = 0
    # The pool's own reservations carry this pool label (see `reservations.pool_hash`); only they name its claims
    # (by_claim, doubly_held) and only its release records are candidates. Those of the other pools of its
    # uniqueness domain hold addresses only. None: every reservation is its own.
    own_label: str | None = None
    pool_uid: str = ""  # the uid of the pool object the index was built for (a re-created pool is another pool)
    # The epoch `releasedAt` of the pool's own release records: the candidates for a take-over.
    _released_at: dict[int, float] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        allocatable: IntervalSet,
        family: int,
        reservations: list[Reservation],
        spec_key: object,
        pending: dict[int, str] | None = None,
        policy: AllocationPolicy = AllocationPolicy(),  # noqa: B008 - frozen, so one shared default is safe
        rng: random.Random | None = None,
        *,
        host_bits: int = 0,
        own_label: str | None = None,
    ) -> PoolIndex:
        """An index of `reservations`; `pending` (shared, not copied) are the in-flight candidates it inherits.
        Cost: O(n log n) for n reservations, the allocator and the chooser being built in bulk."""
        valued: list[tuple[int, Reservation]] = []
        for reservation in reservations:
            try:
                valued.append((address_to_int(reservation.address, family) >> host_bits, reservation))
            except ValueError:
                continue  # another family: cannot collide with this pool's addresses
        return cls._build(allocatable, family, valued, spec_key, pending, policy, rng, host_bits, own_label)

    @classmethod
    def _build(
        cls,
        allocatable: IntervalSet,
        family: int,
        valued: list[tuple[int, Reservation]],
        spec_key: object,
        pending: dict[int, str] | None,
        policy: AllocationPolicy,
        rng: random.Random | None = None,
        host_bits: int = 0,
        own_label: str | None = None,
    ) -> PoolIndex:
        pending = pending if pending is not None else {}
        allocator = PoolAllocator(allocatable, [*(value for value, _ in valued), *pending])
        index = cls(
            allocator,
            family,
            Chooser(policy, allocator, rng),
            policy,
            spec_key=spec_key,
            pending=pending,
            host_bits=host_bits,
            own_label=own_label,
        )
        for value, reservation in valued:
            index._hold(value, reservation, marked=True)
        return index

    def with_allocatable(
        self,
        allocatable: IntervalSet,
        spec_key: object,
        policy: AllocationPolicy = AllocationPolicy(),  # noqa: B008 - frozen, so one shared default is safe
    ) -> PoolIndex:
        """The same holdings and pending candidates over a new allocatable set and policy (the pool's spec
        changed)."""
        held = list(self.by_address.items())
        index = PoolIndex._build(
            allocatable, self.family, held, spec_key, self.pending, policy, None, self.host_bits, self.own_label
        )
        index.reuse_grace_seconds, index.clock = self.reuse_grace_seconds, self.clock
        index.pool_uid = self.pool_uid
        return index

    def value_of(self, address: str) -> int:
        """The index's integer for an address of the pool's family (ValueError for another family or no IP)."""
        return address_to_int(address, self.family) >> self.host_bits

    def address_of(self, value: int) -> str:
        """The address an integer of the index stands for (for a prefix pool, its child prefix's first address)."""
        return int_to_address(value << self.host_bits, self.family)

    def owns(self, reservation: Reservation) -> bool:
        """Whether the reservation is the pool's own (not another pool's of its uniqueness domain)."""
        return self.own_label is None or reservation.pool_label == self.own_label

    def set_policy(self, policy: AllocationPolicy) -> None:
        """Choose by `policy` from now on, over the same holdings (the pool's spec changed its policy alone).
        Cost: O(r) for r runs of used addresses, plus the release records; no reservation is parsed again."""
        self.policy = policy
        self.chooser = Chooser(policy, self.allocator)
        for value, released_at in self._released_at.items():
            if value not in self.pending:
                self.chooser.record(value, released_at)

    def take_candidate(self, claim_uid: str) -> int | None:
        """The next address under the policy (never a pinned one, the band last), now marked pending for
        `claim_uid`; None if nothing is eligible. Choosing and marking happen in one step (no await), so concurrent
        allocations get distinct candidates. A release record chosen (always the pool's own) stays in `released`:
        take it over."""
        value = self.chooser.choose(self.allocator, self.clock(), self.reuse_grace_seconds)
        if value is not None:
            self._mark_pending(value, claim_uid)
        return value

    def take_specific(self, value: int, claim_uid: str) -> bool:
        """Mark `value` pending for `claim_uid` and return True if it is allocatable, not pending, and held by no
        reservation but a release record of the pool's own whose grace period is over (then in `released`: take it
        over); else False. The policy does not apply: pinned and band addresses may be taken this way."""
        if not self.allocator.is_allocatable(value) or value in self.pending:
            return False
        if value in self.by_address:
            if value not in self.released or not self._reusable(value):
                return False
        elif self.allocator.is_used(value):
            return False
        self._mark_pending(value, claim_uid)
        return True

    def _mark_pending(self, value: int, claim_uid: str) -> None:
        self._use(value)
        self.chooser.unrecord(value)
        self.pending[value] = claim_uid

    def _reusable(self, value: int) -> bool:
        released_at = self._released_at.get(value)
        return released_at is not None and grace_over(released_at, self.clock(), self.reuse_grace_seconds)

    def settle(self, value: int) -> None:
        """The write for the pending candidate `value` has answered: unmark it, and free it unless a
        reservation for it is now known (call `hold` first when the answer named one)."""
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
        if reservation.released_at is not None:
            self.released[value] = reservation
            if self.owns(reservation):
                self._released_at[value] = released_epoch(reservation)
                if value not in self.pending:
                    self.chooser.record(value, self._released_at[value])
            else:  # another pool's record of the domain: held, never taken over from here
                self._released_at.pop(value, None)
                self.chooser.unrecord(value)
        else:
            self.released.pop(value, None)
            self._released_at.pop(value, None)
            self.chooser.unrecord(value)
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

    def _use(self, value: int) -> None:
        if self.allocator.mark_used(value):
            self.chooser.used(value)

    def _free(self, value: int) -> None:
        if self.allocator.mark_free(value):
            self.chooser.freed(value)

    def expired_releases(self, grace_seconds: int) -> list[Reservation]:
        """Release records to delete, their reuse grace period being over: the pool's own by `grace_seconds` (none
        under LeastRecentlyReleased, whose records are the reuse order: they are taken over instead); another
        pool's of the domain by the grace period recorded on it (never when none is recorded, see `domains`)."""
        keep_own = self.policy.strategy is AllocationStrategy.LEAST_RECENTLY_RELEASED
        now = self.clock()
        expired = []
        for value, record in self.released.items():
            if value in self.pending:
                continue
            if value in self._released_at:
                if not keep_own and grace_over(self._released_at[value], now, grace_seconds):
                    expired.append(record)
            elif record.grace_seconds is not None and grace_over(released_epoch(record), now, record.grace_seconds):
                expired.append(record)
        return expired
