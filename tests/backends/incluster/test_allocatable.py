"""Address entries of an in-cluster pool: parsing, validation messages and the allocatable set."""

from __future__ import annotations

import ipaddress
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.incluster.allocatable import (
    ADDRESSES_REQUIRED,
    DIFFERENT_SUBNET,
    EXCLUDED_MIXED_FAMILIES,
    GATEWAY_MIXED_FAMILIES,
    INVALID_ADDRESS,
    INVALID_GATEWAY,
    INVALID_PREFIX,
    MIXED_FAMILIES,
    build_allocatable_set,
    parse_address_entry,
)
from backends.incluster.intervals import IntervalSet, PoolAllocator, address_to_int, int_to_address
from backends.validation import PoolSpecError
from tests.support.properties import examples


def texts(allocatable: IntervalSet, family: int) -> list[str]:
    return [int_to_address(value, family) for start, end in allocatable for value in range(start, end + 1)]


def ip4(text: str) -> int:
    return address_to_int(text, 4)


# ------------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("entry", "family", "first", "last"),
    [
        ("10.0.0.5", 4, "10.0.0.5", "10.0.0.5"),
        ("10.0.0.10-10.0.0.20", 4, "10.0.0.10", "10.0.0.20"),
        ("10.0.0.7-10.0.0.7", 4, "10.0.0.7", "10.0.0.7"),
        ("10.0.0.0/24", 4, "10.0.0.0", "10.0.0.255"),
        ("10.0.0.77/24", 4, "10.0.0.0", "10.0.0.255"),  # host bits set: the whole network
        ("10.0.0.9/32", 4, "10.0.0.9", "10.0.0.9"),
        ("fd00::5", 6, "fd00::5", "fd00::5"),
        ("fd00::1-fd00::ff", 6, "fd00::1", "fd00::ff"),
        ("fd00:1::/48", 6, "fd00:1::", "fd00:1:0:ffff:ffff:ffff:ffff:ffff"),
    ],
)
def test_parse_address_entry(entry: str, family: int, first: str, last: str) -> None:
    parsed = parse_address_entry(entry)
    assert parsed.family == family
    assert (parsed.first, parsed.last) == (address_to_int(first), address_to_int(last))


@pytest.mark.parametrize(
    "entry",
    [
        "",
        "   ",
        "banana",
        "10.0.0.256",
        "010.0.0.1",
        "10.0.0.5-10.0.0.1",  # reversed range
        "10.0.0.1-fd00::1",  # mixed-family range
        "10.0.0.1-10.0.0.2-10.0.0.3",
        "10.0.0.1-",
        "10.0.0.0/33",
        "fd00::/129",
        "10.0.0.0/",
        "10.0.0.0/-1",
        "10.0.0.0/255.255.255.0",
        "10.0.0.0/24/24",
        "fe80::1%eth0",
        "fe80::%eth0/64",
        # blanks, which the Go provider v1.1.0's parsers (netip, netipx) refuse too
        " 10.0.0.1",
        "10.0.0.1 ",
        "10.0.0.1\n",
        "  10.0.0.5\t",
        " 10.0.0.10 - 10.0.0.20 ",
        "10.0.0.10 -10.0.0.20",
        "10.0.0.0/24 ",
        "10.0.0.0 /24",
    ],
)
def test_parse_address_entry_rejects(entry: str) -> None:
    with pytest.raises(PoolSpecError) as caught:
        parse_address_entry(entry)
    assert str(caught.value).startswith(INVALID_ADDRESS)


# ---------------------------------------------------------------------------------------------- validation

INVALID_SPECS = [
    pytest.param([], 24, None, [], ADDRESSES_REQUIRED, id="no-addresses"),
    pytest.param(["10.0.0.1", "nope"], 24, None, [], INVALID_ADDRESS, id="bad-address"),
    pytest.param(["10.0.0.1"], 24, None, ["10.0.0.300"], INVALID_ADDRESS, id="bad-excluded"),
    pytest.param(["10.0.0.1", "fd00::1"], 24, None, [], MIXED_FAMILIES, id="mixed-addresses"),
    pytest.param(["10.0.0.0/24"], 24, "fd00::1", [], GATEWAY_MIXED_FAMILIES, id="mixed-gateway"),
    pytest.param(["10.0.0.0/24"], 24, " 10.0.0.1", [], INVALID_GATEWAY, id="gateway-with-blanks"),
    pytest.param(["10.0.0.0/24"], 24, " ", [], INVALID_GATEWAY, id="blank-gateway"),
    pytest.param(["10.0.0.0/24"], 24, None, ["10.0.0.1 "], INVALID_ADDRESS, id="excluded-with-blanks"),
    pytest.param(["fd00::/120"], 120, None, ["10.0.0.1"], EXCLUDED_MIXED_FAMILIES, id="mixed-excluded"),
    pytest.param(["10.0.0.0/24"], 33, None, [], INVALID_PREFIX, id="prefix-over-32"),
    pytest.param(["fd00::/64"], 129, None, [], INVALID_PREFIX, id="prefix-over-128"),
    pytest.param(["10.0.0.0/24"], -1, None, [], INVALID_PREFIX, id="negative-prefix"),
    pytest.param(["10.0.0.0/24", "10.0.1.5"], 24, None, [], DIFFERENT_SUBNET, id="ip-other-subnet"),
    pytest.param(["10.0.0.250-10.0.1.5"], 24, None, [], DIFFERENT_SUBNET, id="range-leaves-subnet"),
    pytest.param(["10.0.0.0/16"], 24, None, [], DIFFERENT_SUBNET, id="cidr-wider-than-prefix"),
    pytest.param(["fd00::1", "fd01::1"], 64, None, [], DIFFERENT_SUBNET, id="ipv6-other-subnet"),
    pytest.param(["10.0.0.0/24"], 24, "10.0.0.x", [], INVALID_GATEWAY, id="bad-gateway"),
]


@pytest.mark.parametrize(("addresses", "prefix", "gateway", "excluded", "message"), INVALID_SPECS)
def test_validation_messages(
    addresses: list[str], prefix: int, gateway: str | None, excluded: list[str], message: str
) -> None:
    with pytest.raises(PoolSpecError) as caught:
        build_allocatable_set(addresses, prefix, gateway, excluded)
    assert str(caught.value).startswith(message)
    assert all(line.startswith(message) for line in caught.value.messages)
    with pytest.raises(PoolSpecError):
        build_allocatable_set(addresses, prefix, gateway, excluded)


def test_go_message_texts_are_exact() -> None:
    assert ADDRESSES_REQUIRED == "addresses is required"
    assert INVALID_ADDRESS == "provided address is not a valid IP, range, nor CIDR"
    assert MIXED_FAMILIES == "provided addresses are of mixed IP families"
    assert GATEWAY_MIXED_FAMILIES == "provided gateway and addresses are of mixed IP families"
    assert EXCLUDED_MIXED_FAMILIES == "addresses and excluded addresses are of mixed IP families"
    assert INVALID_PREFIX == "provided prefix is not valid"
    assert DIFFERENT_SUBNET == "provided address belongs to a different subnet than others"


def test_validation_reports_every_bad_entry_and_is_a_value_error() -> None:
    with pytest.raises(ValueError) as caught:
        build_allocatable_set(["x", "10.0.0.1", "y"], 24)
    assert isinstance(caught.value, PoolSpecError)
    assert caught.value.messages == (
        f"{INVALID_ADDRESS}: x (spec.addresses[0])",
        f"{INVALID_ADDRESS}: y (spec.addresses[2])",
    )


def test_valid_specs_pass() -> None:
    build_allocatable_set(["10.0.0.0/24"], 24, "10.0.0.1", ["10.0.0.5"])
    build_allocatable_set(["10.0.0.0/24"], 24, "", [])  # a blank gateway means none
    build_allocatable_set(["10.0.0.0/24"], 24, "192.168.0.1", ["172.16.0.0/12"])  # outside the subnet is fine
    build_allocatable_set(["0.0.0.0/0"], 0)
    build_allocatable_set(["fd00::1"], 128)


# ------------------------------------------------------------------------------------------ allocatable set


def test_ipv4_reserved_addresses_and_gateway_are_removed() -> None:
    pool = build_allocatable_set(["10.0.0.0/29"], 29, gateway="10.0.0.1")
    assert pool.family == 4
    assert texts(pool.addresses, 4) == [f"10.0.0.{host}" for host in range(2, 7)]
    assert (pool.subnet_first, pool.subnet_last) == (ip4("10.0.0.0"), ip4("10.0.0.7"))


def test_allocate_reserved_keeps_network_and_broadcast_but_never_the_gateway() -> None:
    pool = build_allocatable_set(["10.0.0.0/29"], 29, gateway="10.0.0.1", allocate_reserved=True)
    assert texts(pool.addresses, 4) == ["10.0.0.0", *(f"10.0.0.{host}" for host in range(2, 8))]


def test_ipv6_removes_only_the_subnet_router_anycast_address() -> None:
    pool = build_allocatable_set(["fd00::/125"], 125)
    assert pool.family == 6
    assert texts(pool.addresses, 6) == [f"fd00::{host}" for host in range(1, 8)]
    reserved_kept = build_allocatable_set(["fd00::/125"], 125, allocate_reserved=True)
    assert reserved_kept.addresses.size == 8


def test_exclusions_single_ips_ranges_and_entries_out_of_order() -> None:
    pool = build_allocatable_set(
        ["10.0.0.20-10.0.0.25", "10.0.0.3", "10.0.0.8/30", "10.0.0.255"],
        24,
        gateway="10.0.0.9",
        excluded_addresses=["10.0.0.22-10.0.0.23", "10.0.0.3", "10.0.0.10/31"],
    )
    expected = ["10.0.0.8", "10.0.0.20", "10.0.0.21", "10.0.0.24", "10.0.0.25"]
    assert texts(pool.addresses, 4) == expected  # .255 is the broadcast, .9 the gateway


def test_subnet_comes_from_the_first_entry() -> None:
    pool = build_allocatable_set(["10.0.0.130-10.0.0.140", "10.0.0.128"], 25)
    assert pool.subnet_first == ip4("10.0.0.128")
    assert "10.0.0.128" not in texts(pool.addresses, 4)
    with pytest.raises(PoolSpecError, match=DIFFERENT_SUBNET):
        build_allocatable_set(["10.0.0.130", "10.0.0.5"], 25)


def test_allocatable_set_and_allocation_order() -> None:
    pool = build_allocatable_set(["10.0.0.0/24"], 24, gateway="10.0.0.1", excluded_addresses=["10.0.0.3"])
    allocator = PoolAllocator(pool.addresses)
    allocated = [int_to_address(allocator.allocate() or 0, 4) for _ in range(3)]
    assert allocated == ["10.0.0.2", "10.0.0.4", "10.0.0.5"]
    assert allocator.total == 256 - 3 - 1


def test_huge_pools_are_built_and_allocated_from_quickly() -> None:
    started = time.perf_counter()
    ipv4 = build_allocatable_set(["10.1.0.0/16"], 16, gateway="10.1.0.1")
    ipv6 = build_allocatable_set(["fd00:abcd:1::/48"], 48, gateway="fd00:abcd:1::1")
    allocators = [PoolAllocator(ipv4.addresses), PoolAllocator(ipv6.addresses)]
    for allocator in allocators:
        for _ in range(1000):
            allocator.allocate()
    elapsed = time.perf_counter() - started
    assert ipv4.addresses.size == 2**16 - 3
    assert ipv6.addresses.size == 2**80 - 2
    assert allocators[0].lowest_free() == ip4("10.1.3.234")  # .0.0 and .0.1 skipped, .0.2-.3.233 used
    assert all(allocator.used_set().interval_count == 1 for allocator in allocators)
    assert elapsed < 0.5


# ------------------------------------------------------------------------------------- brute-force model

SUBNET = ipaddress.ip_network("10.0.0.0/27")
host_numbers = st.integers(min_value=0, max_value=31)


@st.composite
def entries(draw: st.DrawFn) -> str:
    """A single IP, range or CIDR inside 10.0.0.0/27, in any of the three syntaxes."""
    kind = draw(st.sampled_from(["ip", "range", "cidr"]))
    if kind == "ip":
        return str(SUBNET[draw(host_numbers)])
    if kind == "range":
        low, high = sorted((draw(host_numbers), draw(host_numbers)))
        return f"{SUBNET[low]}-{SUBNET[high]}"
    length = draw(st.integers(min_value=27, max_value=32))
    return f"{SUBNET[draw(host_numbers)]}/{length}"


def brute_force(entry: str) -> set[int]:
    if "/" in entry:
        return {int(address) for address in ipaddress.ip_network(entry, strict=False)}
    low, _, high = entry.partition("-")
    return set(range(ip4(low), ip4(high or low) + 1))


@settings(max_examples=examples(300), deadline=None)
@given(
    addresses=st.lists(entries(), min_size=1, max_size=5),
    excluded=st.lists(entries(), max_size=4),
    gateway=st.none() | host_numbers.map(lambda host: str(SUBNET[host])),
    allocate_reserved=st.booleans(),
)
def test_allocatable_set_matches_brute_force(
    addresses: list[str], excluded: list[str], gateway: str | None, allocate_reserved: bool
) -> None:
    expected = set().union(*map(brute_force, addresses)) - set().union(set(), *map(brute_force, excluded))
    if not allocate_reserved:
        expected -= {int(SUBNET.network_address), int(SUBNET.broadcast_address)}
    if gateway is not None:
        expected.discard(ip4(gateway))
    pool = build_allocatable_set(addresses, SUBNET.prefixlen, gateway, excluded, allocate_reserved)
    assert pool.addresses == IntervalSet.from_points(expected)


def test_an_empty_gateway_is_no_gateway() -> None:
    """`gateway: ""` passes the Go webhook (it checks only a non-empty gateway): the pool has no gateway."""
    from backends.incluster.spec import parse_pool

    spec, allocatable = parse_pool({"spec": {"addresses": ["10.0.0.0/30"], "prefix": 30, "gateway": ""}})
    assert spec.gateway is None
    assert allocatable.addresses.size == 2  # .1 and .2: only the network and broadcast addresses are left out
