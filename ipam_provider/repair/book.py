"""The book of suspected leaks: which holdings stayed unaccounted for, since when, and for how many passes.

A suspect is keyed by its pool, its holding's handle and the holding's claim uid (a record re-used for another
claim is another suspect). Contract:
- `observe(pool, suspects, now)` is called once per completed pass of the pool with every holding the pass found
  unaccounted for; it answers the suspects seen for the first time. A suspect the pass did not find again is
  forgotten: only consecutive sightings count.
- `releasable(pool, now, grace)` answers the suspects seen in at least two consecutive passes whose first sighting
  is at least `grace` seconds old.
- A pool whose pass was skipped (its backend could not be used) keeps its suspects as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ipam_provider.backend.contract import PoolRef
from ipam_provider.backend.repair import Holding

SuspectKey = tuple[PoolRef, str, str]  # pool, holding handle, claim uid


@dataclass
class Suspect:
    holding: Holding
    first_seen: float
    passes: int = 1


def suspect_key(pool: PoolRef, holding: Holding) -> SuspectKey:
    return pool, holding.handle, holding.claim_uid


class SuspectedLeaks:
    def __init__(self) -> None:
        self._suspects: dict[SuspectKey, Suspect] = {}

    def __len__(self) -> int:
        return len(self._suspects)

    def observe(self, pool: PoolRef, suspects: Iterable[Holding], now: float) -> list[Holding]:
        """Record a completed pass of `pool` that found `suspects` unaccounted for; answer the new ones."""
        seen: dict[SuspectKey, Holding] = {suspect_key(pool, holding): holding for holding in suspects}
        for key in [key for key in self._suspects if key[0] == pool and key not in seen]:
            del self._suspects[key]  # accounted for again (or gone): it starts afresh if it comes back
        new: list[Holding] = []
        for key, holding in seen.items():
            known = self._suspects.get(key)
            if known is None:
                self._suspects[key] = Suspect(holding, now)
                new.append(holding)
            else:
                known.holding = holding
                known.passes += 1
        return new

    def releasable(self, pool: PoolRef, now: float, grace: float) -> list[Holding]:
        """The pool's suspects seen in two consecutive passes or more, first seen at least `grace` seconds ago."""
        return [
            suspect.holding
            for key, suspect in self._suspects.items()
            if key[0] == pool and suspect.passes >= 2 and now - suspect.first_seen >= grace
        ]

    def count(self, pool: PoolRef) -> int:
        return sum(1 for key in self._suspects if key[0] == pool)

    def forget(self, pool: PoolRef, holding: Holding) -> None:
        """The holding is no longer a suspect (released, or found accounted for by a fresh read)."""
        self._suspects.pop(suspect_key(pool, holding), None)

    def keep_only(self, pools: Sequence[PoolRef] | set[PoolRef]) -> None:
        """Forget the suspects of every pool not in `pools` (those that are gone)."""
        wanted = set(pools)
        self._suspects = {key: suspect for key, suspect in self._suspects.items() if key[0] in wanted}
