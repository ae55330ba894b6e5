"""Specific addresses in the in-cluster pool index and spec, without a control plane: `take_specific`, pinned
addresses never chosen by dynamic allocation (the pool's allocation policy), `PreAllocations` and why an address is
not allocatable."""

from __future__ import annotations

import pytest

from backends.incluster.index import PoolIndex
from backends.incluster.intervals import address_to_int
from backends.incluster.reservations import Reservation
from backends.incluster.spec import (
    InClusterPoolSpec,
    PreAllocations,
    allocation_policy,
    parse_pool,
    why_not_allocatable,
)
from ipam_provider.backend.contract import (
    REQUESTED_ADDRESS_ANNOTATION,
    AllocationFailedError,
    ClaimContext,
    PoolRef,
)

REF = PoolRef("ipam.cluster.x-k8s.io", "InClusterIPPool", "ns", "net")
GLOBAL_REF = PoolRef("ipam.cluster.x-k8s.io", "GlobalInClusterIPPool", None, "net")


def ip(text: str) -> int:
    return address_to_int(text, 4)


def parsed(**spec: object) -> tuple[InClusterPoolSpec, PoolIndex, PreAllocations]:
    pool_spec, allocatable = parse_pool({"spec": {"addresses": ["10.0.0.0/28"], "prefix": 28, **spec}})
    pre = PreAllocations.of(REF, pool_spec.pre_allocations, allocatable)
    policy = allocation_policy(pool_spec, allocatable, pre)
    assert policy.pinned == allocation_policy(pool_spec, allocatable).pinned, "one pinned set, however derived"
    return pool_spec, PoolIndex.build(allocatable, [], policy), pre


def held(address: str, uid: str) -> Reservation:
    return Reservation(f"h.{address}", address, 28, None, uid, f"ns/{uid}", None, "1", f"uid-{address}")


def test_take_specific_takes_an_allocatable_address_that_is_neither_held_nor_pending() -> None:
    _, index, _ = parsed()
    index.hold(held("10.0.0.5", "a"))
    assert not index.take_specific(ip("10.0.0.5"), "b"), "held"
    assert not index.take_specific(ip("10.0.0.0"), "b"), "not allocatable: the network address"
    assert not index.take_specific(ip("10.0.1.1"), "b"), "not allocatable: outside"
    assert index.take_specific(ip("10.0.0.9"), "b")
    assert index.pending == {ip("10.0.0.9"): "b"}
    assert not index.take_specific(ip("10.0.0.9"), "c"), "pending for b"
    index.settle(ip("10.0.0.9"))  # its create failed: free again
    assert index.take_specific(ip("10.0.0.9"), "c")
    # Dynamic allocation never takes a specific address in flight.
    taken = {index.take_candidate(f"d{n}") for n in range(13)}
    assert ip("10.0.0.9") not in taken and ip("10.0.0.5") not in taken and None in taken


def test_dynamic_allocation_never_takes_pinned_addresses() -> None:
    _, index, pre = parsed(preAllocations={"vip": "10.0.0.1", "db": "10.0.0.3"})
    assert set(pre.pinned) == {ip("10.0.0.1"), ip("10.0.0.3")} and pre.problems == ()
    taken: list[int] = []
    while (value := index.take_candidate(f"c{len(taken)}")) is not None:
        taken.append(value)
    assert len(taken) == 14 - 2 and not set(taken) & set(pre.pinned)
    assert all(value not in index.pending for value in pre.pinned), "never candidates"
    assert index.take_specific(ip("10.0.0.1"), "vip-uid"), "the named claim still takes its address"


def test_pre_allocations_resolve_to_the_named_claim_only() -> None:
    entries = {"vip": "10.0.0.1", "a": "10.0.0.7", "b": "10.0.0.7", "far": "10.9.9.9", "x/y": "10.0.0.8"}
    spec, _, pre = parsed(preAllocations=entries)
    assert set(pre.pinned) == {ip("10.0.0.1"), ip("10.0.0.7"), ip("10.0.0.8")}
    assert any("x/y" in problem and "by name alone" in problem for problem in pre.problems)
    vip = ClaimContext("ns", "vip", "u1")
    assert pre.wanted(vip) == "10.0.0.1"
    assert pre.pinned_for_others(ip("10.0.0.1"), vip) == ()
    other = ClaimContext("ns", "other", "u2")
    assert pre.wanted(other) is None
    assert pre.pinned_for_others(ip("10.0.0.1"), other) == ("vip",)
    with pytest.raises(AllocationFailedError, match=r"more than one claim \(a, b\)"):
        pre.wanted(ClaimContext("ns", "a", "u3"))
    with pytest.raises(AllocationFailedError, match=r"preAllocations\[far\]: 10.9.9.9 is not an allocatable"):
        pre.wanted(ClaimContext("ns", "far", "u4"))
    asks_other = ClaimContext("ns", "vip", "u5", annotations={REQUESTED_ADDRESS_ANNOTATION: "10.0.0.2"})
    with pytest.raises(AllocationFailedError, match=r"pre-allocates 10\.0\.0\.1 to it"):
        pre.wanted(asks_other)
    same = ClaimContext("ns", "vip", "u6", annotations={REQUESTED_ADDRESS_ANNOTATION: "10.0.0.1"})
    assert pre.wanted(same) == "10.0.0.1"
    assert spec.pre_allocations == entries


def test_global_pools_name_claims_as_namespace_slash_name() -> None:
    pool_spec, allocatable = parse_pool({"spec": {"addresses": ["10.0.0.0/28"], "prefix": 28}})
    pre = PreAllocations.of(GLOBAL_REF, {"team-a/vip": "10.0.0.1", "vip": "10.0.0.2"}, allocatable)
    assert pre.wanted(ClaimContext("team-a", "vip", "u1")) == "10.0.0.1"
    assert pre.wanted(ClaimContext("team-b", "vip", "u2")) is None
    assert pre.pinned_for_others(ip("10.0.0.1"), ClaimContext("team-b", "vip", "u2")) == ("team-a/vip",)
    assert pre.problems == ("spec.preAllocations[vip]: a GlobalInClusterIPPool names claims as namespace/name",)
    assert pool_spec.pre_allocations == {}


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("10.0.0.5", None),
        ("10.0.1.5", "it is not in spec.addresses"),
        ("fd00::5", "it is not an IPv4 address, as spec.addresses are"),
        ("10.0.0.1", "it is the pool's gateway, spec.gateway"),
        ("10.0.0.0", "it is the subnet's network address, reserved unless spec.allocateReservedIPAddresses is true"),
        ("10.0.0.15", "it is the subnet's broadcast address, reserved unless spec.allocateReservedIPAddresses is true"),
        ("10.0.0.12", "it is in spec.excludedAddresses"),
    ],
)
def test_why_an_address_is_not_allocatable(address: str, why: str | None) -> None:
    spec = {"addresses": ["10.0.0.0/28"], "prefix": 28, "gateway": "10.0.0.1", "excludedAddresses": ["10.0.0.12"]}
    pool_spec, allocatable = parse_pool({"spec": spec})
    assert why_not_allocatable(pool_spec, allocatable, address) == why
    reserved_ok, allocatable = parse_pool({"spec": {**spec, "allocateReservedIPAddresses": True}})
    if why is not None and "reserved" in why:
        assert why_not_allocatable(reserved_ok, allocatable, address) is None


def test_an_entry_that_is_not_a_string_is_a_problem_of_its_own_not_of_the_whole_pool() -> None:
    _, _, pre = parsed(preAllocations={"bad": 5, "list": ["10.0.0.3"], "good": "10.0.0.2"})
    assert pre.pinned == {ip("10.0.0.2"): ("good",)}
    assert "spec.preAllocations[bad]: 5 is not a string" in pre.problems
    assert "spec.preAllocations[list]: ['10.0.0.3'] is not a string" in pre.problems
    with pytest.raises(AllocationFailedError, match=r"preAllocations\[bad\]: 5 is not a string"):
        pre.address_of(ClaimContext("ns", "bad", "uid-bad"))
    assert pre.address_of(ClaimContext("ns", "good", "uid-good")) == "10.0.0.2"


def test_the_named_claim_of_a_pin_is_known_only_for_one_well_formed_key() -> None:
    _, _, pre = parsed(preAllocations={"a": "10.0.0.2", "b": "10.0.0.3", "c": "10.0.0.3"})
    assert pre.named_claim(ip("10.0.0.2")) == ("ns", "a")
    assert pre.named_claim(ip("10.0.0.3")) is None
    assert pre.named_claim(ip("10.0.0.4")) is None
    _, allocatable = parse_pool({"spec": {"addresses": ["10.0.0.0/28"], "prefix": 28}})
    global_pre = PreAllocations.of(GLOBAL_REF, {"team-a/vip": "10.0.0.1", "vip": "10.0.0.2"}, allocatable)
    assert global_pre.named_claim(ip("10.0.0.1")) == ("team-a", "vip")
    assert global_pre.named_claim(ip("10.0.0.2")) is None
