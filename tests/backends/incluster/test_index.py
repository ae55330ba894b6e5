"""PoolIndex bookkeeping: released reservations are tracked apart, so that finding the ones whose reuse grace
period is over costs what was released, not what is allocated."""

from __future__ import annotations

import dataclasses
import ipaddress

from backends.incluster.allocatable import AllocatableSet
from backends.incluster.index import PoolIndex
from backends.incluster.intervals import IntervalSet
from backends.incluster.reservations import Reservation

BASE = int(ipaddress.ip_address("10.0.0.0"))


def reservation(offset: int, released_at: str | None = None) -> Reservation:
    address = str(ipaddress.ip_address(BASE + offset))
    return Reservation(
        name=f"pool.{address}",
        address=address,
        prefix=8,
        gateway=None,
        claim_uid="" if released_at else f"uid-{offset}",
        claim="ns/claim",
        released_at=released_at,
        resource_version="1",
        uid=f"r-{offset}",
    )


def test_only_released_reservations_are_examined_for_expiry() -> None:
    live = [reservation(i) for i in range(1, 20_001)]
    old = reservation(30_000, "2020-01-01T00:00:00Z")
    fresh = reservation(30_001, "2999-01-01T00:00:00Z")
    index = PoolIndex.build(AllocatableSet(IntervalSet([(BASE, BASE + 65_535)]), 4), [*live, old, fresh])
    assert set(index.released) == {BASE + 30_000, BASE + 30_001}
    assert index.expired_releases(60) == [old]
    index.drop(old)
    assert set(index.released) == {BASE + 30_001} and not index.allocator.is_used(BASE + 30_000)
    # The same address held again by a live claim is no longer a release.
    index.hold(dataclasses.replace(fresh, released_at=None, claim_uid="uid-new"))
    assert index.released == {} and index.expired_releases(0) == []
