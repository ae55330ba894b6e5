"""The pool index under concurrent allocations, against a brute-force model.

Allocations of one pool interleave: each takes a candidate (`take_candidate`), and later its reservation's create
answers — created for it, already held by another process, released in between, or failed — and the candidate is
settled. Meanwhile claims are released and the index is rebuilt from the reservations that exist. The model is
plain sets: the addresses held by reservations (which the API server keeps unique) and the candidates in flight.
Properties: no two in-flight allocations ever try the same address; a candidate is never an address the index
knows to be held; each decision takes the lowest allocatable address neither known held nor pending at that
moment; and the index's free count is exactly what the model says.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.index import PoolIndex
from backends.incluster.intervals import IntervalSet, int_to_address
from backends.incluster.reservations import Reservation
from tests.support.properties import examples

FAMILY = 4
BASE = 0x0A000000  # 10.0.0.0
UNIVERSE = 24
values = st.integers(min_value=0, max_value=UNIVERSE - 1)


def reservation(value: int, claim_uid: str, serial: int) -> Reservation:
    address = int_to_address(BASE + value, FAMILY)
    return Reservation(
        name=f"pool.{address}",
        address=address,
        prefix=24,
        gateway=None,
        claim_uid=claim_uid,
        claim=f"ns/{claim_uid}",
        released_at=None,
        resource_version=str(serial),
        uid=f"uid-{serial}",
    )


class ConcurrentIndexMachine(RuleBasedStateMachine):
    in_flight = Bundle("in_flight")

    @initialize(allocatable=st.sets(values, min_size=1))
    def start(self, allocatable: set[int]) -> None:
        self.allocatable = allocatable
        self.intervals = IntervalSet.from_points(BASE + value for value in allocatable)
        self.index = PoolIndex.build(AllocatableSet(self.intervals, FAMILY), [])
        self.held: dict[int, Reservation] = {}  # what the API server holds: address value → reservation
        self.pending: dict[int, str] = {}  # in-flight candidates → claim uid
        self.serial = 0

    def _next(self) -> int:
        self.serial += 1
        return self.serial

    @rule(target=in_flight)
    def take_candidate(self) -> tuple[int, str] | None:
        claim_uid = f"claim-{self._next()}"
        free = sorted(self.allocatable - self._known() - set(self.pending))
        taken = self.index.take_candidate(claim_uid)
        if taken is None:
            assert not free, "a free address was not offered"
            return None
        value = taken - BASE
        assert value == free[0], "each decision takes the lowest address neither held nor pending"
        self.pending[value] = claim_uid
        return value, claim_uid

    @rule(attempt=consumes(in_flight), outcome=st.sampled_from(["created", "lost", "released", "failed"]))
    def answer(self, attempt: tuple[int, str] | None, outcome: str) -> None:
        if attempt is None:
            return
        value, claim_uid = attempt
        del self.pending[value]
        if value in self.held:  # reserved by a process this index did not know of: AlreadyExists, then learned
            self.index.hold(self.held[value])
        elif outcome in ("created", "lost"):
            owner = claim_uid if outcome == "created" else f"elsewhere-{self._next()}"
            held = reservation(value, owner, self._next())
            self.held[value] = held
            self.index.hold(held)
        self.index.settle(BASE + value)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        if not self.held:
            return
        value = data.draw(st.sampled_from(sorted(self.held)))
        self.index.drop(self.held.pop(value))

    @rule(value=values)
    def held_by_another_process(self, value: int) -> None:
        """Another process reserves an address this index does not know of (it learns on its next rebuild)."""
        if value not in self.held and value not in self.pending:
            self.held[value] = reservation(value, f"other-{self._next()}", self._next())

    @rule()
    def rebuild(self) -> None:
        self.index = PoolIndex.build(
            AllocatableSet(self.intervals, FAMILY), list(self.held.values()), pending=self.index.pending
        )

    def _known(self) -> set[int]:
        """The held addresses the index knows of."""
        return {value for value, held in self.held.items() if self.index.by_address.get(BASE + value) is held}

    @invariant()
    def the_index_tracks_exactly_the_candidates_in_flight(self) -> None:
        # A rebuild may learn that a candidate in flight is held elsewhere: its create will answer AlreadyExists.
        assert {value - BASE for value in self.index.pending} == set(self.pending)

    @invariant()
    def the_index_knows_no_reservation_that_does_not_exist(self) -> None:
        assert {value - BASE for value in self.index.by_address} <= set(self.held)

    @invariant()
    def free_count_matches(self) -> None:
        used = (self._known() | set(self.pending)) & self.allocatable
        allocator = self.index.allocator
        in_use = allocator.used_set().intersection(allocator.allocatable).size
        assert allocator.total - in_use == len(self.allocatable) - len(used)


TestConcurrentIndex = ConcurrentIndexMachine.TestCase
TestConcurrentIndex.settings = settings(max_examples=examples(300), stateful_step_count=40, deadline=None)
