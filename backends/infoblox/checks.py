"""The pool's grid check and usage counts, for its status.

Contract:
- `PoolChecks.check` asks the grid, once per pool generation and connection and again after
  `healthy_recheck_seconds` (`unhealthy_recheck_seconds` while failing), whether the pool's network view, subnets,
  ranges and extra extensible attributes exist; for a hostRecord pool also its DNS view, that the view belongs to
  the pool's network view, and (with configureForDNS) an authoritative zone for `dnsZone` or a parent of it.
  `DNS_REASONS` are the results that make allocations fail before any POST.
  An extensible attribute the grid would refuse on one of the pool's object types gives `ExtensibleAttributeNotAllowed`.
- `usage`: total = addresses the subnets and ranges can hand out (a range inside a subnet counted once), used = the
  pool's IPAddresses, free = the difference (the grid decides about objects others hold).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Sequence

from backends.infoblox.client import PAGE_SIZE, Failure, WapiClient, WapiError
from backends.infoblox.connections import BUILTIN_DNS_VIEW, INSTANCE_WIDE, Connection, GridHealth, Health, view_missing
from backends.infoblox.ledger import FIXED_V4, FIXED_V6, HOST, fixed_type, object_type
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import EA_POOL, HOST_RECORD, OPTIONAL_EAS, OWNERSHIP_EAS, Pool, Target
from ipam_provider.backend.contract import AddressCounts, Allocation, PoolRef

DNS_REASONS = frozenset({"DNSViewNotFound", "DNSZoneNotFound", "DNSViewNotInNetworkView"})
Verdict = tuple[bool, str, str]
NIOS_TYPE_NAMES = {FIXED_V4: "FixedAddress", FIXED_V6: "IPv6FixedAddress", HOST: "HostRecord"}


class PoolChecks:
    def __init__(self, grid: GridHealth, settings: InfobloxSettings) -> None:
        self._grid = grid
        self._settings = settings
        self._results: dict[PoolRef, tuple[tuple[int, tuple[str, ...]], Health]] = {}  # by the pool's generation

    def forget(self, ref: PoolRef) -> None:
        self._results.pop(ref, None)

    async def check(self, pool: Pool, connection: Connection, health: Health) -> Health:
        key = (pool.generation, connection.key)
        cached_key, cached = self._results.get(pool.ref, (None, None))
        if cached is not None and cached_key == key:
            wait = self._settings.healthy_recheck_seconds if cached.ready else self._settings.unhealthy_recheck_seconds
            if time.monotonic() - cached.checked_at < wait:
                return cached
        try:
            ready, reason, message = await self._ask(pool, connection, health)
        except WapiError as error:
            failed = await self._grid.failed(connection, error) if error.failure in INSTANCE_WIDE else None
            ready, reason = False, failed.reason if failed else "WAPIError"
            message = failed.message if failed else f"checking the pool on the grid failed: {error.detail}"
            if error.failure is Failure.VIEW_NOT_FOUND:  # a search named a view the grid does not have
                reason, message = view_missing(error.detail, "checking the pool")
        self._results[pool.ref] = key, Health(ready, reason, message, time.monotonic())
        return self._results[pool.ref][1]

    async def _ask(self, pool: Pool, connection: Connection, health: Health) -> Verdict:
        client = connection.client
        view = connection.network_view(pool)
        custom = view != connection.spec.default_network_view
        if custom and not await client.search("networkview", ["name"], {"name": view}):
            message = f"network view {view!r} does not exist on the grid; fix spec.networkView"
            return False, "NetworkViewNotFound", message
        for target in pool.targets:
            if (missing_target := await _missing_target(client, target, view)) is not None:
                return missing_target
        missing = sorted(name for name in pool.spec.extensible_attributes if name not in health.ea_names)
        if missing:
            names = ", ".join(missing)
            message = f"spec.extensibleAttributes names {names}, not defined on the grid; define them or remove them"
            return False, "ExtensibleAttributesMissing", message
        if (restricted := await restricted_attribute(pool, client)) is not None:
            return restricted
        dns = await _dns(pool, connection, health)
        if dns is not None and not dns[0]:
            return dns
        where = f"{len(pool.targets)} subnet(s)/range(s) found in network view {view!r}{dns[2] if dns else ''}"
        return True, "PoolReady", f"{where} of InfobloxInstance {connection.name}"


async def _dns(pool: Pool, connection: Connection, health: Health) -> Verdict | None:
    """A hostRecord pool's DNS view and zone (None in fixedAddress mode); when found, the message part says what."""
    settings = pool.spec.host_record
    if pool.spec.mode != HOST_RECORD or settings is None:
        return None
    view = connection.dns_view(pool)
    field = "spec.hostRecord.dnsView" if settings.dns_view else "the InfobloxInstance's spec.defaultDNSView"
    view_missing = False, "DNSViewNotFound", f"DNS view {view!r} does not exist on the grid; create it or fix {field}"
    checked_by_instance = view == connection.spec.default_dns_view and view != BUILTIN_DNS_VIEW
    bound: object = health.dns_view_network_view if checked_by_instance else None
    if not checked_by_instance:
        found = await connection.client.search("view", ["name", "network_view"], {"name": view})
        if not found:
            return view_missing
        bound = found[0].get("network_view")
    if (elsewhere := view_binding(view, bound, connection.network_view(pool), field)) is not None:
        return elsewhere
    if not settings.configure_for_dns:
        return True, "PoolReady", f", DNS view {view!r}"
    zone = settings.dns_zone.strip(".").lower()
    labels = zone.split(".")
    for candidate in (".".join(labels[i:]) for i in range(len(labels))):
        try:
            found = await connection.client.search("zone_auth", ["fqdn"], {"fqdn": candidate, "view": view})
        except WapiError as error:
            if error.failure is Failure.VIEW_NOT_FOUND:
                return view_missing
            raise
        if found:
            return True, "PoolReady", f", zone {candidate!r} in DNS view {view!r}"
    message = (
        f"DNS view {view!r} has no authoritative zone {zone!r} (nor one above it) for the host records; create the "
        "zone on the grid, fix spec.hostRecord.dnsZone, or set spec.hostRecord.configureForDNS to false"
    )
    return False, "DNSZoneNotFound", message


def usage(pool: Pool | None, addresses: Sequence[Allocation]) -> AddressCounts:
    """A range inside one of the pool's subnets is counted once (nextavailableip on a network skips DHCP ranges)."""
    targets = pool.targets if pool is not None else ()
    total = sum(t.usable for t in targets)
    for target in (t for t in targets if t.kind == "range"):
        first, last = (ipaddress.ip_address(part) for part in target.argument.split("-"))
        if any(n.kind == "network" and n.contains(first) and n.contains(last) for n in targets):
            total -= target.usable
    return AddressCounts(total=total, used=len(addresses), free=max(total - len(addresses), 0))


async def _missing_target(client: WapiClient, target: Target, view: str) -> Verdict | None:
    """The verdict on a subnet or range the pool names that the network view lacks; None when it exists."""
    if target.kind == "network":
        obj_type, query = "network" if target.version == 4 else "ipv6network", {"network": target.argument}
        where, reason, field = f"network {target.argument}", "NetworkNotFound", "spec.subnets"
    else:
        first, last = target.argument.split("-")
        obj_type, query = "range", {"start_addr": first, "end_addr": last}
        where, reason, field = f"DHCP range {target.argument}", "RangeNotFound", "spec.ranges"
    if await client.search(obj_type, [next(iter(query))], {**query, "network_view": view}):
        return None
    return False, reason, f"{where} does not exist in network view {view!r}; create it on the grid or fix {field}"


async def restricted_attribute(pool: Pool, client: WapiClient) -> Verdict | None:
    """`ExtensibleAttributeNotAllowed` for the first attribute the grid would refuse on one of the pool's objects."""
    definitions = await client.search("extensibleattributedef", ["name", "allowed_object_types"], page_size=PAGE_SIZE)
    restricted = {
        str(definition.get("name")): [str(kind) for kind in allowed]
        for definition in definitions
        if isinstance(allowed := definition.get("allowed_object_types"), list) and allowed
    }
    # Each attribute the backend may write for the pool, with the object types it writes it on.
    written = {name: {object_type(pool)} for name in (*OWNERSHIP_EAS, *OPTIONAL_EAS, *pool.spec.extensible_attributes)}
    if any(target.gateway is not None for target in pool.targets):
        written[EA_POOL].add(fixed_type(pool.version))
    for name, types in sorted(written.items()):
        allowed = restricted.get(name, [])
        lowered = {kind.lower() for kind in allowed}
        refused = sorted(NIOS_TYPE_NAMES[t] for t in types if allowed and NIOS_TYPE_NAMES[t].lower() not in lowered)
        if not refused:
            continue
        own = " or remove it from spec.extensibleAttributes," if name in pool.spec.extensible_attributes else ""
        message = (
            f"the grid's definition of extensible attribute {name} allows it only on {', '.join(allowed)} "
            f"(allowed_object_types), but this pool writes it on {', '.join(refused)} objects, which the grid "
            f"refuses; add {' and '.join(refused)} to the definition's allowed object types in Grid Manager "
            f"(Administration > Extensible Attributes),{own} or clear the restriction"
        )
        return False, "ExtensibleAttributeNotAllowed", message
    return None


def view_binding(view: str, bound: object, network_view: str, field: str) -> Verdict | None:
    """`DNSViewNotInNetworkView` when DNS view `view`, which belongs to network view `bound`, is not in the pool's
    network view `network_view`."""
    if not isinstance(bound, str) or not bound or bound == network_view:
        return None
    own_view = "default" if network_view == "default" else f"default.{network_view}"
    message = (
        f"DNS view {view!r} belongs to network view {bound!r}, not to the pool's network view {network_view!r}, "
        f"and a host record takes its addresses from its DNS view's network view; set {field} to a DNS view "
        f"of network view {network_view!r} (such as {own_view!r}, which NIOS creates with it), or fix spec.networkView"
    )
    return False, "DNSViewNotInNetworkView", message
