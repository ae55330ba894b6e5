"""``func:nextavailableip`` and the ``next_available_ip`` function.

Contract:

* :func:`allocate` resolves one ``func:nextavailableip:<target>[,<network view>]`` value to the lowest free
  address of the target: a network (by CIDR or reference) or a DHCP range (by ``<first>-<last>`` or
  reference) that must exist in that network view.  A missing target is refused with
  ``<argument> does not match any unique networks/ranges (<field>)`` (400 ``Client.Ibap.Proto``); a target
  with no free address with ``Cannot find 1 available IP address(es) in this network.`` (400
  ``Client.Ibap.Data``);
* in a network the network and broadcast addresses (IPv4) or the subnet-router anycast address (IPv6) are
  skipped, as are addresses inside the network view's DHCP ranges; in a range the range's exclusions are
  skipped; everywhere addresses used by fixed addresses and host records of the network view are skipped;
* ``pending`` carries addresses already picked earlier in the same request (a host record with several
  ``func:`` addresses), so one request never gets the same address twice.  Nothing is claimed here: the
  caller stores the object, which claims its addresses, while still holding the store lock.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from . import errors
from .addressing import (
    IPNetwork,
    NextAvailableTarget,
    lowest_free,
    parse_address,
    parse_network,
    usable_bounds,
)
from .store import ObjectStore, StoredObject

Pending = dict[tuple[str, int], set[int]]


def _find_target(store: ObjectStore, target: NextAvailableTarget, version: int) -> StoredObject | None:
    network_type = "network" if version == 4 else "ipv6network"
    if target.ref is not None:
        obj = store.get(target.ref)
        if obj is None or obj.obj_type not in (network_type, "range"):
            return None
        if obj.obj_type == "range" and version != 4:
            return None
        return obj
    if target.span is not None:
        first, last = (parse_address(part, version) for part in target.span)
        if first is None or last is None or version != 4:
            return None
        return store.by_key("range", f"{first}-{last}/{target.network_view}")
    network = parse_network(target.cidr or "", version)
    if network is None:
        return None
    return store.by_key(network_type, f"{network}/{target.network_view}")


def _span_of(store: ObjectStore, obj: StoredObject) -> tuple[int, int, list[tuple[int, int]]]:
    """``(lo, hi, blocked intervals)`` to search in a network or a range."""
    network_view = obj.get("network_view")
    if obj.obj_type == "range":
        lo = int(ipaddress.ip_address(obj.get("start_addr")))
        hi = int(ipaddress.ip_address(obj.get("end_addr")))
        blocked = [
            (int(ipaddress.ip_address(ex["start_address"])), int(ipaddress.ip_address(ex["end_address"])))
            for ex in obj.get("exclude") or []
        ]
        return lo, hi, blocked
    network: IPNetwork = ipaddress.ip_network(obj.get("network"))
    lo, hi = usable_bounds(network)
    blocked = []
    if network.version == 4:
        for dhcp_range in store.ranges_in(network_view):
            r_lo = int(ipaddress.ip_address(dhcp_range.get("start_addr")))
            r_hi = int(ipaddress.ip_address(dhcp_range.get("end_addr")))
            if r_hi >= lo and r_lo <= hi:
                blocked.append((r_lo, r_hi))
    return lo, hi, blocked


def pick(
    store: ObjectStore,
    obj: StoredObject,
    version: int,
    count: int,
    exclude: set[int],
) -> list[str]:
    """The ``count`` lowest free addresses of a network or range object, skipping ``exclude``."""
    lo, hi, blocked = _span_of(store, obj)
    used = store.usage.used(obj.get("network_view"), version)
    make = ipaddress.IPv4Address if version == 4 else ipaddress.IPv6Address
    skip = set(exclude)
    found: list[str] = []
    while len(found) < count:
        value = lowest_free(lo, hi, used, blocked, skip)
        if value is None:
            raise errors.no_free_address(count)
        skip.add(value)
        found.append(str(make(value)))
    return found


def allocate(
    store: ObjectStore,
    target: NextAvailableTarget,
    version: int,
    field_name: str,
    pending: Pending,
) -> tuple[str, str]:
    """Resolve one ``func:nextavailableip`` value; answer ``(address, network view)``."""
    obj = _find_target(store, target, version)
    if obj is None:
        raise errors.proto(f"{target.argument} does not match any unique networks/ranges ({field_name})")
    network_view: str = obj.get("network_view")
    taken = pending.setdefault((network_view, version), set())
    address = pick(store, obj, version, 1, taken)[0]
    taken.add(int(ipaddress.ip_address(address)))
    return address, network_view


def next_available_ip_function(store: ObjectStore, obj: StoredObject, body: dict[str, Any]) -> dict[str, Any]:
    """``POST <network|ipv6network|range ref>?_function=next_available_ip``: list free addresses, reserve none."""
    allowed = {"num", "exclude"}
    for name in body:
        if name not in allowed:
            raise errors.unknown_field(name)
    num = body.get("num", 1)
    if isinstance(num, bool) or not isinstance(num, int) or not 1 <= num <= 1000:
        raise errors.invalid_value("num", num, "Must be an integer between 1 and 1000")
    version = 6 if obj.obj_type == "ipv6network" else 4
    exclude: set[int] = set()
    for item in body.get("exclude") or []:
        address = parse_address(item, version) if isinstance(item, str) else None
        if address is None:
            raise errors.invalid_value("exclude", item, f"Invalid IPv{version} address")
        exclude.add(int(address))
    return {"ips": pick(store, obj, version, num, exclude)}
