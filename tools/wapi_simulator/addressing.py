"""Address arithmetic for the simulator: usage tracking and next-available-address search.

Contract:

* :class:`IntervalSet` holds a set of integers as merged, sorted closed intervals; :meth:`IntervalSet.next_free`
  answers the smallest integer >= x that is not in the set in O(log n), so filling a large network address by
  address stays fast;
* :class:`AddressUsage` counts, per ``(network view, IP version)``, which objects claim each address (fixed
  addresses and host-record addresses) and whether the claim is a DHCP one (a fixed address, or a host address
  with ``configure_for_dhcp``).  Non-DHCP claims may share an address; a DHCP claim may not share it with
  another DHCP claim (the caller enforces that with :meth:`AddressUsage.dhcp_owners`);
* :func:`lowest_free` picks the lowest address of ``[lo, hi]`` that is neither used, nor inside a blocked
  interval, nor in an exclusion set -- the ``func:nextavailableip`` rule;
* :func:`usable_bounds` gives the allocatable span of a network: IPv4 networks larger than /31 lose their
  network and broadcast addresses, IPv6 networks larger than /127 lose the subnet-router anycast address
  (the first one); /31, /32, /127 and /128 use every address.
"""

from __future__ import annotations

import ipaddress
from bisect import bisect_right
from dataclasses import dataclass, field

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

NEXT_AVAILABLE_PREFIX = "func:nextavailableip:"


class IntervalSet:
    """A set of integers stored as disjoint, non-adjacent, sorted closed intervals."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __contains__(self, value: int) -> bool:
        i = bisect_right(self._starts, value) - 1
        return i >= 0 and self._ends[i] >= value

    def __len__(self) -> int:
        return sum(end - start + 1 for start, end in zip(self._starts, self._ends, strict=True))

    def add(self, value: int) -> None:
        """Insert ``value``, merging with neighbouring intervals."""
        i = bisect_right(self._starts, value) - 1
        if i >= 0 and self._ends[i] >= value:
            return
        merge_left = i >= 0 and self._ends[i] == value - 1
        merge_right = i + 1 < len(self._starts) and self._starts[i + 1] == value + 1
        if merge_left and merge_right:
            self._ends[i] = self._ends[i + 1]
            del self._starts[i + 1]
            del self._ends[i + 1]
        elif merge_left:
            self._ends[i] = value
        elif merge_right:
            self._starts[i + 1] = value
        else:
            self._starts.insert(i + 1, value)
            self._ends.insert(i + 1, value)

    def remove(self, value: int) -> None:
        """Remove ``value`` if present, splitting its interval when needed."""
        i = bisect_right(self._starts, value) - 1
        if i < 0 or self._ends[i] < value:
            return
        start, end = self._starts[i], self._ends[i]
        if start == end:
            del self._starts[i]
            del self._ends[i]
        elif value == start:
            self._starts[i] = value + 1
        elif value == end:
            self._ends[i] = value - 1
        else:
            self._ends[i] = value - 1
            self._starts.insert(i + 1, value + 1)
            self._ends.insert(i + 1, end)

    def next_free(self, value: int) -> int:
        """The smallest integer >= ``value`` that is not in the set."""
        i = bisect_right(self._starts, value) - 1
        if i >= 0 and self._ends[i] >= value:
            return self._ends[i] + 1
        return value


@dataclass
class _Pool:
    used: IntervalSet = field(default_factory=IntervalSet)
    claims: dict[int, list[tuple[str, bool]]] = field(default_factory=dict)


class AddressUsage:
    """Which objects claim which addresses, per network view and IP version. Not thread-safe by itself."""

    def __init__(self) -> None:
        self._pools: dict[tuple[str, int], _Pool] = {}

    def _pool(self, network_view: str, version: int) -> _Pool:
        return self._pools.setdefault((network_view, version), _Pool())

    def claim(self, network_view: str, address: IPAddress, owner: str, dhcp: bool) -> None:
        """Record that ``owner`` (a reference) uses ``address``."""
        pool = self._pool(network_view, address.version)
        value = int(address)
        pool.claims.setdefault(value, []).append((owner, dhcp))
        pool.used.add(value)

    def release(self, network_view: str, address: IPAddress, owner: str) -> None:
        """Forget every claim of ``owner`` on ``address``."""
        pool = self._pool(network_view, address.version)
        value = int(address)
        remaining = [claim for claim in pool.claims.get(value, []) if claim[0] != owner]
        if remaining:
            pool.claims[value] = remaining
        else:
            pool.claims.pop(value, None)
            pool.used.remove(value)

    def owners(self, network_view: str, address: IPAddress) -> list[tuple[str, bool]]:
        """All ``(owner reference, is DHCP claim)`` pairs on ``address``."""
        return list(self._pool(network_view, address.version).claims.get(int(address), []))

    def dhcp_owners(self, network_view: str, address: IPAddress) -> list[str]:
        """The owners holding a DHCP claim on ``address``."""
        return [owner for owner, dhcp in self.owners(network_view, address) if dhcp]

    def used(self, network_view: str, version: int) -> IntervalSet:
        """The set of used addresses (as integers) of one network view and IP version."""
        return self._pool(network_view, version).used

    def used_addresses(self, network_view: str, version: int) -> list[str]:
        """Every used address of one network view and IP version, in ascending order (for inspection)."""
        make = ipaddress.IPv4Address if version == 4 else ipaddress.IPv6Address
        return [str(make(value)) for value in sorted(self._pool(network_view, version).claims)]


def usable_bounds(network: IPNetwork) -> tuple[int, int]:
    """First and last allocatable address (as integers) of ``network``."""
    first, last = int(network.network_address), int(network.broadcast_address)
    if network.version == 4 and network.prefixlen < 31:
        return first + 1, last - 1
    if network.version == 6 and network.prefixlen < 127:
        return first + 1, last
    return first, last


def lowest_free(
    lo: int,
    hi: int,
    used: IntervalSet,
    blocked: list[tuple[int, int]],
    exclude: set[int],
) -> int | None:
    """The lowest integer of ``[lo, hi]`` not in ``used``, not in any ``blocked`` interval, not in ``exclude``."""
    candidate = lo
    while candidate <= hi:
        after_used = used.next_free(candidate)
        if after_used != candidate:
            candidate = after_used
            continue
        hit = next(((b_lo, b_hi) for b_lo, b_hi in blocked if b_lo <= candidate <= b_hi), None)
        if hit is not None:
            candidate = hit[1] + 1
            continue
        if candidate in exclude:
            candidate += 1
            continue
        return candidate
    return None


@dataclass(frozen=True)
class NextAvailableTarget:
    """A parsed ``func:nextavailableip:`` argument.

    Exactly one of ``ref``, ``cidr`` and ``span`` is set; ``argument`` is the text after the prefix (used in
    error messages, as NIOS quotes it).
    """

    argument: str
    network_view: str
    ref: str | None = None
    cidr: str | None = None
    span: tuple[str, str] | None = None


def parse_next_available(value: str) -> NextAvailableTarget | None:
    """Parse ``func:nextavailableip:<target>[,<network view>]``; ``None`` if ``value`` is not that function.

    ``<target>`` is a network or range reference, a CIDR, or ``<first>-<last>`` (a DHCP range lookup).  The
    network view defaults to ``default``.  The target is not validated here.
    """
    if not value.startswith(NEXT_AVAILABLE_PREFIX):
        return None
    argument = value[len(NEXT_AVAILABLE_PREFIX) :]
    target, _, view = argument.partition(",")
    view = view or "default"
    head = target.split("/", 1)[0]
    if head in ("network", "ipv6network", "range") and ":" in target:
        return NextAvailableTarget(argument, view, ref=target)
    if "-" in target and "/" not in target:
        first, _, last = target.partition("-")
        return NextAvailableTarget(argument, view, span=(first.strip(), last.strip()))
    return NextAvailableTarget(argument, view, cidr=target)


def parse_address(text: str, version: int | None = None) -> IPAddress | None:
    """``text`` as an address of the given version (any version if ``None``), or ``None`` if it is not one."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if version is not None and address.version != version:
        return None
    return address


def parse_network(text: str, version: int | None = None) -> IPNetwork | None:
    """``text`` as a CIDR network with no host bits set, or ``None``."""
    try:
        network = ipaddress.ip_network(text, strict=True)
    except ValueError:
        return None
    if version is not None and network.version != version:
        return None
    return network
