"""Seeding and inspection of the simulated grid, for tests and benchmarks.

Contract: :class:`SimulatorState` wraps the object store with thread-safe helpers.  Every ``add_*`` /
:meth:`SimulatorState.create` / :meth:`SimulatorState.update` goes through the same validation as a WAPI
POST/PUT (so seeded data obeys the same rules and a bad seed raises :class:`~.errors.WapiError`) and answers
the new object's reference.  Inspection helpers answer plain dicts rendered like a WAPI GET with every
readable field (fields without a value are left out), so tests can assert on what the backend wrote.
Extensible attributes may be given in WAPI form (``{"Name": {"value": v}}``) or plain (``{"Name": v}``).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from . import handlers
from .schema import SCHEMAS
from .store import ObjectStore, StoredObject


def _wapi_extattrs(fields: dict[str, Any]) -> dict[str, Any]:
    eas = fields.get("extattrs")
    if isinstance(eas, dict):
        fields = dict(fields)
        fields["extattrs"] = {
            name: value if isinstance(value, dict) and "value" in value else {"value": value}
            for name, value in eas.items()
        }
    return fields


class SimulatorState:
    """Thread-safe seeding and inspection of one simulator's data."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    # -- seeding -------------------------------------------------------------------------------------------

    def create(self, obj_type: str, **fields: Any) -> str:
        """Create any supported object from WAPI fields; answer its reference."""
        with self._store.lock:
            return handlers.create_object(self._store, obj_type, _wapi_extattrs(fields)).ref

    def update(self, ref: str, **fields: Any) -> str:
        """Update an object with WAPI fields (``extattrs+`` etc. allowed); answer its (new) reference."""
        with self._store.lock:
            return handlers.update_object(self._store, ref, _wapi_extattrs(fields)).ref

    def delete(self, ref: str) -> None:
        """Delete an object and its dependants."""
        with self._store.lock:
            handlers.delete_object(self._store, ref)

    def add_network_view(self, name: str, **fields: Any) -> str:
        """A ``networkview`` (its DNS view ``default.<name>`` comes with it)."""
        return self.create("networkview", name=name, **fields)

    def add_network(self, cidr: str, network_view: str = "default", **fields: Any) -> str:
        """A ``network`` or ``ipv6network``, by the CIDR's version."""
        obj_type = "ipv6network" if ipaddress.ip_network(cidr).version == 6 else "network"
        return self.create(obj_type, network=cidr, network_view=network_view, **fields)

    def add_range(self, start_addr: str, end_addr: str, network_view: str = "default", **fields: Any) -> str:
        """A DHCP ``range`` (IPv4)."""
        return self.create("range", start_addr=start_addr, end_addr=end_addr, network_view=network_view, **fields)

    def add_ea_definition(self, name: str, type: str = "STRING", **fields: Any) -> str:
        """An ``extensibleattributedef``."""
        return self.create("extensibleattributedef", name=name, type=type, **fields)

    def add_fixed_address(self, address: str, network_view: str = "default", **fields: Any) -> str:
        """A ``fixedaddress`` (MAC defaults to zeros) or ``ipv6fixedaddress`` (DUID defaults to zeros)."""
        if ipaddress.ip_address(address).version == 6:
            fields.setdefault("duid", "00:00:00:00:00:00:00:00:00:00")
            return self.create("ipv6fixedaddress", ipv6addr=address, network_view=network_view, **fields)
        fields.setdefault("mac", "00:00:00:00:00:00")
        return self.create("fixedaddress", ipv4addr=address, network_view=network_view, **fields)

    def add_host_record(
        self,
        name: str,
        addresses: list[str] | str,
        view: str = "default",
        configure_for_dns: bool = False,
        **fields: Any,
    ) -> str:
        """A ``record:host`` with the given IPv4/IPv6 addresses (``func:nextavailableip:...`` allowed)."""
        v4: list[dict[str, Any]] = []
        v6: list[dict[str, Any]] = []
        for address in [addresses] if isinstance(addresses, str) else addresses:
            is_v6 = ":" in address.removeprefix("func:nextavailableip:").split(",")[0]
            (v6 if is_v6 else v4).append({"ipv6addr" if is_v6 else "ipv4addr": address})
        if v4:
            fields["ipv4addrs"] = v4
        if v6:
            fields["ipv6addrs"] = v6
        return self.create("record:host", name=name, view=view, configure_for_dns=configure_for_dns, **fields)

    def add_dns_view(self, name: str, network_view: str = "default", **fields: Any) -> str:
        """A DNS ``view`` bound to ``network_view`` (read-only over WAPI, so seeded here)."""
        return self.create("view", name=name, network_view=network_view, **fields)

    def add_zone(self, fqdn: str, view: str = "default", **fields: Any) -> str:
        """An authoritative zone (``zone_auth``), needed by host records with ``configure_for_dns``."""
        return self.create("zone_auth", fqdn=fqdn, view=view, **fields)

    # -- inspection ----------------------------------------------------------------------------------------

    def _render(self, obj: StoredObject) -> dict[str, Any]:
        names = [name for name, spec in SCHEMAS[obj.obj_type].fields.items() if not spec.search_only]
        return handlers.render(self._store, obj, names)

    def get(self, ref: str) -> dict[str, Any] | None:
        """One object with every readable field, or ``None``."""
        with self._store.lock:
            obj = self._store.get(ref)
            return self._render(obj) if obj is not None else None

    def objects(self, obj_type: str) -> list[dict[str, Any]]:
        """Every object of one type, in creation order."""
        with self._store.lock:
            return [self._render(obj) for obj in self._store.of_type(obj_type)]

    def find(self, obj_type: str, **equals: Any) -> list[dict[str, Any]]:
        """Objects of one type whose rendered fields equal ``equals``."""
        return [o for o in self.objects(obj_type) if all(o.get(k) == v for k, v in equals.items())]

    def count(self, obj_type: str) -> int:
        """How many objects of one type exist."""
        with self._store.lock:
            return len(self._store.of_type(obj_type))

    def refs(self, obj_type: str) -> list[str]:
        """The references of every object of one type."""
        with self._store.lock:
            return [obj.ref for obj in self._store.of_type(obj_type)]

    def used_addresses(self, network_view: str = "default", version: int = 4) -> list[str]:
        """Addresses held by fixed addresses or host records in a network view, ascending."""
        with self._store.lock:
            return self._store.usage.used_addresses(network_view, version)

    def extattrs(self, ref: str) -> dict[str, Any]:
        """The extensible attributes of an object as ``{name: value}``."""
        obj = self.get(ref)
        if obj is None:
            raise KeyError(ref)
        return {name: entry["value"] for name, entry in obj.get("extattrs", {}).items()}
