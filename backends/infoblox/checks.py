"""The pool's grid check and usage counts, for its status.

Contract:
- `PoolChecks.check` asks the grid, once per pool generation and instance connection and then again after
  `healthy_recheck_seconds` (`unhealthy_recheck_seconds` while failing), whether the pool's network view, each
  subnet (`network` / `ipv6network`) and each range exists, and whether its extra extensible attributes are defined;
  one search per item, each answering [] when missing. `forget` drops a cached result (after an allocation found
  the pool's configuration wrong).
- `usage` counts from the pool's spec and its IPAddresses: total = addresses the subnets and ranges can hand out
  (network, broadcast, subnet-router anycast and gateway excluded; a range inside a subnet counted once), used =
  IPAddresses of the pool, free = the difference. Objects others hold in the same networks are not subtracted:
  the grid, not this count, decides.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backends.infoblox.api import Pool
from backends.infoblox.instances import INSTANCE_WIDE, Connection, Health, Instances
from backends.infoblox.settings import Settings
from backends.infoblox.wapi import WapiError
from backends.protocol import Allocation, PoolRef

INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class CheckResult:
    ready: bool
    reason: str
    message: str
    key: tuple[Any, ...]
    checked_at: float


class PoolChecks:
    def __init__(self, instances: Instances, settings: Settings) -> None:
        self._instances = instances
        self._settings = settings
        self._results: dict[PoolRef, CheckResult] = {}

    def forget(self, ref: PoolRef) -> None:
        self._results.pop(ref, None)

    async def check(self, pool: Pool, generation: int, connection: Connection, health: Health) -> CheckResult:
        key = (generation, connection.key)
        cached = self._results.get(pool.ref)
        if cached is not None and cached.key == key:
            wait = self._settings.healthy_recheck_seconds if cached.ready else self._settings.unhealthy_recheck_seconds
            if time.monotonic() - cached.checked_at < wait:
                return cached
        try:
            ready, reason, message = await self._ask(pool, connection, health)
        except WapiError as error:
            failed = await self._instances.failed(connection, error) if error.problem in INSTANCE_WIDE else None
            ready, reason = False, failed.reason if failed else "WAPIError"
            message = failed.message if failed else f"checking the pool on the grid failed: {error.detail}"
        result = CheckResult(ready, reason, message, key, time.monotonic())
        self._results[pool.ref] = result
        return result

    async def _ask(self, pool: Pool, connection: Connection, health: Health) -> tuple[bool, str, str]:
        client = connection.client
        view = pool.spec.network_view or connection.spec.default_network_view
        if view != connection.spec.default_network_view and not await client.search(
            "networkview", ["name"], {"name": view}
        ):
            return (
                False,
                "NetworkViewNotFound",
                f"network view {view!r} does not exist on the grid; fix spec.networkView",
            )
        for target in pool.targets:
            if target.kind == "network":
                obj_type = "network" if target.version == 4 else "ipv6network"
                found = await client.search(obj_type, ["network"], {"network": target.argument, "network_view": view})
                if not found:
                    return (
                        False,
                        "NetworkNotFound",
                        (
                            f"network {target.argument} does not exist in network view {view!r}; create it on the grid "
                            "or fix spec.subnets"
                        ),
                    )
            else:
                first, last = target.argument.split("-")
                params = {"start_addr": first, "end_addr": last, "network_view": view}
                if not await client.search("range", ["start_addr"], params):
                    return (
                        False,
                        "RangeNotFound",
                        (
                            f"DHCP range {target.argument} does not exist in network view {view!r}; create it on the "
                            "grid or fix spec.ranges"
                        ),
                    )
        missing = sorted(name for name in pool.spec.extensible_attributes if name not in health.ea_names)
        if missing:
            return (
                False,
                "ExtensibleAttributesMissing",
                (
                    f"spec.extensibleAttributes names {', '.join(missing)}, not defined on the grid; define them or "
                    "remove them"
                ),
            )
        kinds = f"{len(pool.targets)} subnet(s)/range(s)"
        return True, "PoolReady", f"{kinds} found in network view {view!r} of InfobloxInstance {connection.name}"


def usage(pool: Pool | None, addresses: Sequence[Allocation]) -> dict[str, Any]:
    total = _total(pool) if pool is not None else 0
    used = len(addresses)
    return {"ipAddresses": {"total": min(total, INT64_MAX), "used": used, "free": min(max(total - used, 0), INT64_MAX)}}


def _total(pool: Pool) -> int:
    """Addresses the pool can hand out; a range inside one of the pool's subnets is counted once (nextavailableip
    on a network skips the addresses of DHCP ranges)."""
    total = sum(t.usable for t in pool.targets)
    networks = [ipaddress.ip_network(t.argument) for t in pool.targets if t.kind == "network"]
    for target in pool.targets:
        if target.kind == "range":
            first, last = (ipaddress.ip_address(part) for part in target.argument.split("-"))
            if any(first in network and last in network for network in networks):
                total -= target.usable
    return total
