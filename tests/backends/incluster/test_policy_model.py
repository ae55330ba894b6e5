"""The pool index under an allocation policy (strategy, static band, pre-allocated addresses, grace period), against
a brute-force model.

The pool is a small IPv4 range with a gateway and exclusions; the policy pins some of its addresses and may reserve
the static band. Steps: dynamic allocations (`take_candidate`) and allocations by value (`take_specific`), whose
writes later succeed or fail; releases (a release record kept when the pool has a grace period or uses
LeastRecentlyReleased, else the reservation deleted); the clock advancing; restarts (the index rebuilt from the
reservations, as after a controller restart); and policy changes. Before each allocation the expired records are
deleted, as `indexes` does (never under LeastRecentlyReleased).

The model is plain sets and sorted lists. Checked at each decision: the candidate is never held, pending or pinned;
the band is entered only when nothing above it is eligible; LowestFree takes the model's lowest eligible address;
LeastRecentlyReleased takes never-used addresses lowest first, then the oldest expired record; Random takes one of
the model's eligible addresses; exhaustion happens exactly when the model has nothing eligible; `take_specific`
accepts exactly the allocatable addresses that are neither pending nor held (an expired record is not held),
pinned ones included (the named claim takes its pre-allocated address that way).
"""

from __future__ import annotations

import datetime
import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from backends.incluster.allocatable import AllocatableSet, build_allocatable_set
from backends.incluster.index import PoolIndex
from backends.incluster.intervals import address_to_int, int_to_address
from backends.incluster.policy import AllocationPolicy, AllocationStrategy, static_band_size
from backends.incluster.reservations import Reservation
from tests.support.properties import examples

FAMILY = 4
BASE = 0x0A000000  # 10.0.0.0
START = 1_800_000_000  # the model's clock, in epoch seconds
LRR = AllocationStrategy.LEAST_RECENTLY_RELEASED
offsets = st.integers(min_value=0, max_value=63)


def rfc3339(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reservation(value: int, claim_uid: str, serial: int, released_at: int | None = None) -> Reservation:
    address = int_to_address(value, FAMILY)
    return Reservation(
        name=f"pool.{address}",
        address=address,
        prefix=24,
        gateway=None,
        claim_uid="" if released_at is not None else claim_uid,
        claim=f"ns/{claim_uid}",
        released_at=rfc3339(released_at) if released_at is not None else None,
        resource_version=str(serial),
        uid=f"uid-{value}",
    )


@st.composite
def pools(draw: st.DrawFn) -> tuple[list[str], str | None, list[str]]:
    """A range inside 10.0.0.0/24, a gateway (maybe inside it) and a few exclusions."""
    low = draw(st.integers(min_value=0, max_value=8))
    high = draw(st.integers(min_value=low, max_value=low + 48))
    gateway = draw(st.none() | st.integers(min_value=low, max_value=high).map(lambda o: int_to_address(BASE + o, 4)))
    excluded = [
        f"{int_to_address(BASE + first, 4)}-{int_to_address(BASE + first + length, 4)}"
        for first, length in draw(st.lists(st.tuples(offsets, st.integers(0, 3)), max_size=3))
    ]
    return [f"{int_to_address(BASE + low, 4)}-{int_to_address(BASE + high, 4)}"], gateway, excluded


class AllocationPolicyMachine(RuleBasedStateMachine):
    in_flight = Bundle("in_flight")

    @initialize(
        pool=pools(),
        strategy=st.sampled_from(list(AllocationStrategy)),
        band=st.booleans(),
        grace=st.sampled_from([None, 0, 3]),
        data=st.data(),
    )
    def start(
        self,
        pool: tuple[list[str], str | None, list[str]],
        strategy: AllocationStrategy,
        band: bool,
        grace: int | None,
        data: st.DataObject,
    ) -> None:
        addresses, gateway, excluded = pool
        self.allocatable_set = build_allocatable_set(addresses, 24, gateway, excluded).addresses
        self.allocatable = sorted(v for start, end in self.allocatable_set for v in range(start, end + 1))
        pinned = data.draw(st.sets(st.sampled_from(self.allocatable), max_size=4)) if self.allocatable else set()
        self.policy = AllocationPolicy(strategy, band, frozenset(pinned))
        self.grace = grace
        self.now = START
        self.server: dict[int, Reservation] = {}  # the API server's reservations: address → reservation
        self.pending: dict[int, str] = {}  # in-flight writes: address → claim uid
        self.serial = 0
        self.index = self._build()

    def _build(self) -> PoolIndex:
        pending = self.index.pending if hasattr(self, "index") else None
        index = PoolIndex.build(
            AllocatableSet(self.allocatable_set, FAMILY),
            list(self.server.values()),
            self.policy,
            pending=pending,
            rng=random.Random(self.serial),
        )
        index.clock = lambda: float(self.now)
        index.reuse_grace_seconds = self.grace or 0
        return index

    def _next(self) -> int:
        self.serial += 1
        return self.serial

    # --- the model

    def _expired(self, value: int) -> bool:
        record = self.server[value]
        if record.released_at is None:
            return False
        released = int(datetime.datetime.fromisoformat(record.released_at.replace("Z", "+00:00")).timestamp())
        return not self.grace or self.now - released >= self.grace

    def _zones(self) -> list[list[int]]:
        size = static_band_size(len(self.allocatable)) if self.policy.static_band else 0
        return [self.allocatable[size:], self.allocatable[:size]]

    def _eligible(self) -> list[list[int]]:
        """Per zone (upper, then band), the addresses a dynamic allocation may take, in the strategy's order."""
        ordered = []
        for zone in self._zones():
            dynamic = [v for v in zone if v not in self.policy.pinned and v not in self.pending]
            never_used = [v for v in dynamic if v not in self.server]
            records: list[int] = []
            if self.policy.strategy is LRR:
                expired = [v for v in dynamic if v in self.server and self._expired(v)]
                records = sorted(expired, key=lambda v: (self.server[v].released_at or "", v))
            ordered.append(never_used + records)
        return ordered

    def _reclaim(self) -> None:
        """What `indexes` does before an allocation: delete the expired records (none under LRR)."""
        for record in self.index.expired_releases(self.grace or 0):
            value = address_to_int(record.address)
            assert self.server[value] is record and self._expired(value)
            del self.server[value]
            self.index.drop(record)
        if self.policy.strategy is not LRR:
            assert not any(self._expired(v) for v in self.server if v not in self.pending)

    # --- the steps

    @rule(target=in_flight)
    def allocate(self) -> tuple[int, str] | None:
        self._reclaim()
        claim_uid = f"claim-{self._next()}"
        upper, band = self._eligible()
        taken = self.index.take_candidate(claim_uid)
        if taken is None:
            assert not upper and not band, "exhausted while the model has an eligible address"
            return None
        assert taken not in self.pending and taken not in self.policy.pinned
        assert taken not in self.server or self._expired(taken), "a held address was offered"
        expected = upper or band
        if self.policy.strategy is AllocationStrategy.RANDOM:
            assert taken in expected, "Random took an address outside the eligible set (or entered the band early)"
        else:
            assert taken == expected[0], f"{self.policy.strategy} took {taken}, the model says {expected[0]}"
        self.pending[taken] = claim_uid
        return taken, claim_uid

    @rule(target=in_flight, offset=offsets)
    def take_specific(self, offset: int) -> tuple[int, str] | None:
        return self._take_specific(BASE + offset, f"claim-{self._next()}")

    @rule(target=in_flight, data=st.data())
    def take_pinned(self, data: st.DataObject) -> tuple[int, str] | None:
        """The claim a pre-allocation names takes its pinned address by value (the policy does not apply)."""
        if not self.policy.pinned:
            return None
        value = data.draw(st.sampled_from(sorted(self.policy.pinned)))
        return self._take_specific(value, f"named-{value}-{self._next()}")

    def _take_specific(self, value: int, claim_uid: str) -> tuple[int, str] | None:
        self._reclaim()
        free = value not in self.server or self._expired(value)
        expected = value in self.allocatable_set and value not in self.pending and free
        assert self.index.take_specific(value, claim_uid) == expected
        if not expected:
            return None
        self.pending[value] = claim_uid
        return value, claim_uid

    @rule(attempt=consumes(in_flight), succeeded=st.booleans())
    def answer(self, attempt: tuple[int, str] | None, succeeded: bool) -> None:
        """The write for a candidate answers: created (or a record taken over), or failed (nothing changed)."""
        if attempt is None:
            return
        value, claim_uid = attempt
        del self.pending[value]
        if succeeded:
            assert (value in self.index.released) == (value in self.server), "a record to take over is named"
            self.server[value] = reservation(value, claim_uid, self._next())
            self.index.hold(self.server[value])
        self.index.settle(value)

    @rule()
    def fill(self) -> None:
        """Allocate (dynamically, every write succeeding) until the pool is exhausted for dynamic allocations."""
        while (attempt := self.allocate()) is not None:
            self.answer(attempt, True)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        live = sorted(v for v, r in self.server.items() if r.released_at is None)
        if not live:
            return
        value = data.draw(st.sampled_from(live))
        old = self.server.pop(value)
        self.index.drop(old)
        if self.grace or self.policy.strategy is LRR:
            self.server[value] = reservation(value, old.claim_uid, self._next(), released_at=self.now)
            self.index.hold(self.server[value])

    @rule(seconds=st.integers(min_value=0, max_value=4))
    def advance(self, seconds: int) -> None:
        self.now += seconds

    @rule()
    def restart(self) -> None:
        """The index rebuilt from the API server's reservations (writes in flight stay pending)."""
        self.index = self._build()

    @rule(strategy=st.sampled_from(list(AllocationStrategy)), band=st.booleans(), in_place=st.booleans())
    def change_policy(self, strategy: AllocationStrategy, band: bool, in_place: bool) -> None:
        """The pool's spec changes its policy: a new index over the same holdings, or the same one re-chosen."""
        self.policy = AllocationPolicy(strategy, band, self.policy.pinned)
        clock, rng = self.index.clock, self.index.chooser.rng
        if in_place:
            self.index.set_policy(self.policy)
        else:
            self.index = self.index.with_allocatable(AllocatableSet(self.allocatable_set, FAMILY), self.policy)
        # The pool's own generator stays (a process-wide one would make Random's choices differ between runs).
        assert self.index.chooser.rng is rng
        assert self.index.clock is clock and self.index.reuse_grace_seconds == (self.grace or 0)

    # --- what always holds

    @invariant()
    def the_index_knows_exactly_the_reservations_and_the_writes_in_flight(self) -> None:
        assert set(self.index.pending) == set(self.pending)
        assert set(self.index.by_address) == set(self.server)
        assert set(self.index.released) == {v for v, r in self.server.items() if r.released_at is not None}

    @invariant()
    def the_records_in_their_grace_period_are_known_with_when_it_ends(self) -> None:
        waiting = {v for v, r in self.server.items() if r.released_at is not None and not self._expired(v)}
        in_grace = waiting & set(self.allocatable)
        ends = [self.server[v].released_epoch + (self.grace or 0) - self.now for v in in_grace]
        assert self.index.in_grace() == (frozenset(in_grace), min(ends, default=None))

    @invariant()
    def free_count_matches(self) -> None:
        used = (set(self.server) | set(self.pending)) & set(self.allocatable)
        allocator = self.index.allocator
        in_use = allocator.used_set().intersection(allocator.allocatable).size
        assert allocator.total - in_use == len(self.allocatable) - len(used)


TestAllocationPolicyModel = AllocationPolicyMachine.TestCase
TestAllocationPolicyModel.settings = settings(max_examples=examples(300), stateful_step_count=50, deadline=None)
