"""In-memory object storage with the indexes the WAPI semantics need.

Contract:

* :class:`ObjectStore` keeps every object as a :class:`StoredObject` (type + stored field values) under its
  reference, which is derived from the object's natural key (see :mod:`.refs`);
* it keeps a natural-key index (``(type, key) -> ref``) so uniqueness checks and lookups by key are O(1), an
  :class:`~.addressing.AddressUsage` so next-available searches are fast, and the networks of each view sorted
  by address so that an overlap check costs O(log n), not a parse of every network;
* DNS views (``view``, each bound to a network view) and authoritative zones (``zone_auth``) are stored objects
  like any other; :meth:`ObjectStore.dns_view_network_view` and :meth:`ObjectStore.zone_for` answer from the
  natural-key index, so a host record's view and zone are found in O(labels);
* it applies no WAPI rule: validation, conflicts and cascades live in :mod:`.handlers`.  It is not thread-safe
  by itself: every caller holds :attr:`ObjectStore.lock` (a re-entrant lock) around a whole operation, which
  is what makes one ``func:nextavailableip`` allocation atomic.
"""

from __future__ import annotations

import bisect
import ipaddress
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .addressing import AddressUsage, IPAddress
from .refs import make_ref

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
NetworkSpan = tuple[int, int, str]


@dataclass
class StoredObject:
    """One object: its WAPI type, its stored fields, and its current reference."""

    obj_type: str
    fields: dict[str, Any]
    ref: str = ""

    def get(self, name: str, default: Any = None) -> Any:
        """A stored field value."""
        return self.fields.get(name, default)


def natural_key(obj_type: str, fields: dict[str, Any]) -> tuple[str, list[str]]:
    """The natural key of an object and the readable parts of its reference."""
    if obj_type in ("network", "ipv6network"):
        return f"{fields['network']}/{fields['network_view']}", [fields["network"], fields["network_view"]]
    if obj_type in ("fixedaddress", "ipv6fixedaddress"):
        address = fields["ipv4addr" if obj_type == "fixedaddress" else "ipv6addr"]
        return f"{address}/{fields['network_view']}", [address, fields["network_view"]]
    if obj_type == "record:host":
        return f"{fields['view']}/{fields['name'].lower()}", [fields["name"], fields["view"]]
    if obj_type in ("networkview", "view"):
        return fields["name"], [fields["name"], "true" if fields.get("is_default") else "false"]
    if obj_type == "zone_auth":
        return f"{fields['view']}/{fields['fqdn'].lower()}", [fields["fqdn"], fields["view"]]
    if obj_type == "extensibleattributedef":
        return fields["name"], [fields["name"]]
    if obj_type == "range":
        key = f"{fields['start_addr']}-{fields['end_addr']}/{fields['network_view']}"
        return key, [fields["start_addr"], fields["end_addr"], fields["network_view"]]
    raise ValueError(f"no natural key for {obj_type}")


def ref_id(ref: str) -> str:
    """``<type>/<opaque id>``: the part of a reference that identifies the object."""
    obj_type, _, rest = ref.partition("/")
    return f"{obj_type}/{rest.split(':', 1)[0]}"


def host_address_ref(version: int, address: str, host_name: str, view: str) -> str:
    """The reference of one address of a host record (``record:host_ipv4addr`` / ``record:host_ipv6addr``)."""
    obj_type = "record:host_ipv4addr" if version == 4 else "record:host_ipv6addr"
    return make_ref(obj_type, f"{view}/{host_name.lower()}/{address}", [address, host_name, view])


class ObjectStore:
    """All simulated grid data. Callers hold :attr:`lock` for the duration of each operation."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.usage = AddressUsage()
        self._objects: dict[str, StoredObject] = {}
        self._by_type: dict[str, dict[str, StoredObject]] = {}
        self._keys: dict[tuple[str, str], str] = {}
        self._by_id: dict[str, str] = {}
        self._networks: dict[tuple[str, str], list[NetworkSpan]] = {}  # (type, view) -> spans sorted by address
        self.insert(StoredObject("networkview", {"name": "default", "is_default": True}))
        self.insert(StoredObject("view", {"name": "default", "network_view": "default", "is_default": True}))

    # -- lookups -------------------------------------------------------------------------------------------

    def get(self, ref: str) -> StoredObject | None:
        """The object a reference names, matched on ``<type>/<opaque id>`` only (the name part is informational,
        so a name part with or without percent-encoding finds the same object)."""
        current = self._by_id.get(ref_id(ref))
        return self._objects.get(current) if current is not None else None

    def by_key(self, obj_type: str, key: str) -> StoredObject | None:
        """The object of ``obj_type`` whose natural key is ``key``."""
        ref = self._keys.get((obj_type, key))
        return self._objects[ref] if ref is not None else None

    def of_type(self, obj_type: str) -> list[StoredObject]:
        """Every object of one type, in creation order."""
        return list(self._by_type.get(obj_type, {}).values())

    def all_objects(self) -> Iterator[StoredObject]:
        """Every object."""
        return iter(list(self._objects.values()))

    def network_view_exists(self, name: str) -> bool:
        """Whether a network view called ``name`` exists."""
        return (("networkview", name)) in self._keys

    def containing_network(self, network_view: str, address: IPAddress) -> StoredObject | None:
        """The (smallest) network of ``network_view`` that contains ``address``."""
        obj_type = "network" if address.version == 4 else "ipv6network"
        best: StoredObject | None = None
        best_len = -1
        for candidate in self.of_type(obj_type):
            if candidate.get("network_view") != network_view:
                continue
            network = ipaddress.ip_network(candidate.get("network"))
            if address in network and network.prefixlen > best_len:
                best, best_len = candidate, network.prefixlen
        return best

    def overlaps_network(self, obj_type: str, network_view: str, network: IPNetwork) -> bool:
        """Whether a network of ``obj_type`` in ``network_view`` overlaps ``network``.

        The networks of a view never overlap one another (the rules refuse it), so only the one that starts last
        at or before ``network`` ends can overlap it."""
        spans = self._networks.get((obj_type, network_view), [])
        first, last = int(network.network_address), int(network.broadcast_address)
        before = bisect.bisect_right(spans, last, key=lambda span: span[0])
        return before > 0 and spans[before - 1][1] >= first

    def ranges_in(self, network_view: str) -> list[StoredObject]:
        """The DHCP ranges of one network view."""
        return [r for r in self.of_type("range") if r.get("network_view") == network_view]

    def dns_view_network_view(self, view: str) -> str | None:
        """The network view a DNS view belongs to, or ``None`` if the DNS view does not exist."""
        found = self.by_key("view", view)
        return str(found.get("network_view")) if found is not None else None

    def dns_views_of(self, network_view: str) -> list[str]:
        """The names of the DNS views bound to ``network_view``, sorted."""
        return sorted(str(v.get("name")) for v in self.of_type("view") if v.get("network_view") == network_view)

    def zone_for(self, view: str, fqdn: str) -> str | None:
        """The longest authoritative zone of ``view`` that is a proper parent of ``fqdn``."""
        labels = fqdn.lower().rstrip(".").split(".")
        for i in range(1, len(labels)):
            candidate = ".".join(labels[i:])
            if ("zone_auth", f"{view}/{candidate}") in self._keys:
                return candidate
        return None

    # -- mutations -----------------------------------------------------------------------------------------

    def insert(self, obj: StoredObject) -> str:
        """Store a new object (its natural key must be free); answer its reference."""
        key, parts = natural_key(obj.obj_type, obj.fields)
        obj.ref = make_ref(obj.obj_type, key, parts)
        self._objects[obj.ref] = obj
        self._by_type.setdefault(obj.obj_type, {})[obj.ref] = obj
        self._keys[(obj.obj_type, key)] = obj.ref
        self._by_id[ref_id(obj.ref)] = obj.ref
        for network_view, address, dhcp in claims_of(obj):
            self.usage.claim(network_view, address, obj.ref, dhcp)
        span = network_span(obj)
        if span is not None:
            bisect.insort(self._networks.setdefault(span[0], []), span[1])
        return obj.ref

    def remove(self, ref: str) -> StoredObject | None:
        """Forget the object ``ref``; answer it (or ``None`` if it did not exist)."""
        obj = self._objects.pop(ref, None)
        if obj is None:
            return None
        del self._by_type[obj.obj_type][ref]
        key, _ = natural_key(obj.obj_type, obj.fields)
        self._keys.pop((obj.obj_type, key), None)
        self._by_id.pop(ref_id(ref), None)
        for network_view, address, _dhcp in claims_of(obj):
            self.usage.release(network_view, address, ref)
        span = network_span(obj)
        if span is not None:
            self._networks[span[0]].remove(span[1])
        return obj

    def replace(self, old_ref: str, obj: StoredObject) -> str:
        """Swap the object ``old_ref`` for ``obj`` (same type); answer the (possibly new) reference."""
        self.remove(old_ref)
        return self.insert(obj)


def network_span(obj: StoredObject) -> tuple[tuple[str, str], NetworkSpan] | None:
    """A network's ``((type, view), (first address, last address, ref))``; ``None`` for other objects."""
    if obj.obj_type not in ("network", "ipv6network"):
        return None
    network = ipaddress.ip_network(obj.fields["network"], strict=False)
    span = (int(network.network_address), int(network.broadcast_address), obj.ref)
    return (obj.obj_type, obj.fields["network_view"]), span


def claims_of(obj: StoredObject) -> list[tuple[str, IPAddress, bool]]:
    """The ``(network view, address, is DHCP)`` claims an object makes on the address space."""
    if obj.obj_type in ("fixedaddress", "ipv6fixedaddress"):
        field_name = "ipv4addr" if obj.obj_type == "fixedaddress" else "ipv6addr"
        return [(obj.fields["network_view"], ipaddress.ip_address(obj.fields[field_name]), True)]
    if obj.obj_type == "record:host":
        claims: list[tuple[str, IPAddress, bool]] = []
        for list_name, field_name in (("ipv4addrs", "ipv4addr"), ("ipv6addrs", "ipv6addr")):
            for entry in obj.fields.get(list_name) or []:
                address = ipaddress.ip_address(entry[field_name])
                claims.append((entry["network_view"], address, bool(entry.get("configure_for_dhcp"))))
        return claims
    return []
