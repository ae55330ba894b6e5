"""The SpecConsistent advisories of in-cluster pools: what the Go provider accepts but is most likely a mistake."""

from __future__ import annotations

import pytest

from backends.incluster.allocatable import build_allocatable_set
from backends.incluster.prefix_spec import build_prefix_set, prefix_pool_advisories
from backends.incluster.spec import (
    EXCLUSION_OUTSIDE,
    GATEWAY_OUTSIDE_SUBNET,
    NO_ALLOCATABLE,
    OVERLAPPING_ENTRIES,
    SPEC_CONSISTENT,
    address_pool_advisories,
    consistency_condition,
)


def advise(
    addresses: list[str],
    prefix: int = 24,
    gateway: str | None = None,
    excluded: tuple[str, ...] = (),
    allocate_reserved: bool = False,
) -> list[tuple[str, str]]:
    allocatable = build_allocatable_set(addresses, prefix, gateway, excluded, allocate_reserved)
    found = address_pool_advisories(addresses, prefix, gateway, excluded, allocate_reserved, allocatable)
    return [(advisory.reason, advisory.message) for advisory in found]


def test_a_sound_spec_has_none_and_its_condition_is_true_without_an_event() -> None:
    assert advise(["10.0.0.0/24"], gateway="10.0.0.1", excluded=("10.0.0.10-10.0.0.20",)) == []
    condition = consistency_condition([])
    assert (condition.type, condition.status, condition.reason, condition.warning) == (
        SPEC_CONSISTENT,
        True,
        SPEC_CONSISTENT,
        False,
    )


@pytest.mark.parametrize(
    ("addresses", "prefix", "gateway", "excluded", "reserved", "reason", "said"),
    [
        (["10.0.0.10-10.0.0.20"], 24, "10.0.1.1", (), False, GATEWAY_OUTSIDE_SUBNET, "spec.gateway 10.0.1.1 lies"),
        (["fd00::10-fd00::20"], 64, "fd00:1::1", (), False, GATEWAY_OUTSIDE_SUBNET, "subnet fd00::/64"),
        (["10.0.0.10-10.0.0.20"], 24, None, ("10.0.0.0/24",), False, NO_ALLOCATABLE, "spec.excludedAddresses leaves"),
        (["10.0.0.1"], 24, "10.0.0.1", (), False, NO_ALLOCATABLE, "spec.gateway leaves no address"),
        (["10.0.0.0"], 24, None, (), False, NO_ALLOCATABLE, "spec.allocateReservedIPAddresses is false"),
        (["10.0.0.0/24", "10.0.0.9-10.0.0.12"], 24, None, (), False, OVERLAPPING_ENTRIES, "spec.addresses[1] ("),
        (
            ["10.0.0.5-10.0.0.9", "10.0.0.1-10.0.0.5"],
            24,
            None,
            (),
            False,
            OVERLAPPING_ENTRIES,
            "overlaps spec.addresses[1]",
        ),
        (
            ["10.0.0.10-10.0.0.20"],
            24,
            None,
            ("10.0.0.15", "10.0.9.9"),
            False,
            EXCLUSION_OUTSIDE,
            "spec.excludedAddresses[1]",
        ),
    ],
)
def test_each_mistake_names_its_field(
    addresses: list[str],
    prefix: int,
    gateway: str | None,
    excluded: tuple[str, ...],
    reserved: bool,
    reason: str,
    said: str,
) -> None:
    ((found_reason, message),) = advise(addresses, prefix, gateway, excluded, reserved)
    assert found_reason == reason and said in message, message


def test_the_network_address_alone_is_fine_when_reserved_addresses_are_allowed() -> None:
    assert advise(["10.0.0.0"], allocate_reserved=True) == []


def test_several_mistakes_join_and_the_worst_gives_the_reason_with_a_warning() -> None:
    found = advise(["10.0.0.5", "10.0.0.5"], gateway="10.0.0.5", excluded=("10.9.0.0/24",))
    assert [reason for reason, _ in found] == [NO_ALLOCATABLE, OVERLAPPING_ENTRIES, EXCLUSION_OUTSIDE]
    allocatable = build_allocatable_set(["10.0.0.5", "10.0.0.5"], 24, "10.0.0.5", ["10.9.0.0/24"])
    advisories = address_pool_advisories(["10.0.0.5", "10.0.0.5"], 24, "10.0.0.5", ["10.9.0.0/24"], False, allocatable)
    condition = consistency_condition(advisories)
    assert (condition.status, condition.reason, condition.warning) == (False, NO_ALLOCATABLE, True)
    assert "spec.gateway leaves" in condition.message and "spec.excludedAddresses[0]" in condition.message


def test_a_prefix_pool_without_a_child_to_hand_out() -> None:
    (advisory,) = prefix_pool_advisories(build_prefix_set(["fd00::/62"], 64, None, ["fd00::/62"]))
    assert advisory.reason == NO_ALLOCATABLE and "spec.excludedPrefixes leaves no /64 child prefix" in advisory.message
    assert prefix_pool_advisories(build_prefix_set(["fd00::/62"], 64, None, ["fd00::/64"])) == []
