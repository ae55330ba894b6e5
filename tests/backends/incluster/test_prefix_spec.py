"""A prefix pool's allocatable child numbers and its validation messages, against an oracle built with ipaddress."""

from __future__ import annotations

import ipaddress

import pytest

from backends.incluster.index import PoolIndex
from backends.incluster.prefix_spec import build_prefix_set, child_of
from backends.validation import PoolSpecError


def oracle(prefixes: list[str], length: int, excluded: list[str]) -> list[str]:
    """Every child of `length` in `prefixes` that overlaps no excluded network, enumerated one by one."""
    blocked = [ipaddress.ip_network(e if "/" in e else f"{e}/{32 if '.' in e else 128}") for e in excluded]
    children = {
        child
        for prefix in prefixes
        for child in ipaddress.ip_network(prefix).subnets(new_prefix=length)
        if not any(child.overlaps(b) for b in blocked)
    }
    return [str(child) for child in sorted(children)]


@pytest.mark.parametrize(
    ("prefixes", "length", "excluded"),
    [
        (["fd00::/56"], 64, ["fd00:0:0:3::/64", "fd00:0:0:7::1", "fd00:0:0:10::/60"]),
        (["fd00::/60", "fd00::/62", "fd01::/62"], 64, []),
        (["10.0.0.0/20"], 24, ["10.0.3.9", "10.0.8.0/23"]),
        (["10.0.0.0/28"], 32, ["10.0.0.4"]),
        (["fd00::/120"], 128, ["fd00::80/121"]),
    ],
)
def test_children_match_the_oracle(prefixes: list[str], length: int, excluded: list[str]) -> None:
    allocatable = build_prefix_set(prefixes, length, None, excluded)
    index = PoolIndex.build(allocatable, [])
    handed_out = []
    while (value := index.take_candidate("uid")) is not None:
        handed_out.append(f"{index.address_of(value)}/{length}")
    assert handed_out == oracle(prefixes, length, excluded)
    assert allocatable.addresses.size == len(handed_out)


def test_a_48_of_64s_and_a_32_of_64s_cost_one_interval() -> None:
    assert build_prefix_set(["fd00::/48"]).addresses.interval_count == 1
    huge = build_prefix_set(["2001:db8::/32"], 64, "2001:db8::1", ["2001:db8::/64"])
    assert huge.addresses.size == 2**32 - 1 and huge.addresses.interval_count == 1


def test_child_of_tells_allocatable_from_out_of_range() -> None:
    allocatable = build_prefix_set(["fd00::/48"], 64, None, ["fd00:0:0:1::/64"])
    assert child_of("fd00:0:0:2::", 64, allocatable) == child_of("fd00:0:0:2::9", 64, allocatable) is not None
    assert child_of("fd00:0:0:1::", 64, allocatable) is None  # excluded
    assert child_of("fd00:0:0:2::", 56, allocatable) is None  # another length
    assert child_of("fd01::", 64, allocatable) is None  # outside
    assert child_of("10.0.0.0", 64, allocatable) is None  # another family


@pytest.mark.parametrize(
    ("prefixes", "length", "gateway", "excluded", "message"),
    [
        ([], 64, None, [], "prefixes is required"),
        (["fd00::1"], 64, None, [], "provided entry is not a valid IPv6 CIDR: fd00::1"),
        (["10.0.0.1"], 24, None, [], "provided entry is not a valid IPv4 CIDR: 10.0.0.1"),
        (["fd00::1/64"], 64, None, [], "CIDR must be network-aligned: fd00::1/64"),
        (["fd00::/65"], 64, None, [], "CIDR prefix length must be <= allocationPrefixLength (64): fd00::/65"),
        (["fd00::/48"], 0, None, [], "allocationPrefixLength must be between 1 and 128"),
        (["10.0.0.0/16"], 64, None, [], "allocationPrefixLength must be between 1 and 32 for IPv4 prefixes"),
        (["10.0.0.0/16", "fd00::/48"], 64, None, [], "provided prefixes are of mixed IP families"),
        (["fd00::/48"], 64, "10.0.0.1", [], "provided gateway must be IPv6: 10.0.0.1"),
        (["10.0.0.0/16"], 24, "fd00::1", [], "provided gateway must be IPv4: fd00::1"),
        (["fd00::/48"], 64, "nope", [], "provided gateway is not a valid IP address: nope"),
        (["fd00::/48"], 64, None, ["10.0.0.1"], "only IPv6 excluded prefixes are supported: 10.0.0.1"),
        (["fd00::/48"], 64, None, ["x"], "provided entry is not a valid IP, range, nor CIDR: x"),
    ],
)
def test_invalid_specs_say_why(
    prefixes: list[str], length: int, gateway: str | None, excluded: list[str], message: str
) -> None:
    with pytest.raises(PoolSpecError) as refused:
        build_prefix_set(prefixes, length, gateway, excluded)
    assert refused.value.messages[0].startswith(message), refused.value.messages
