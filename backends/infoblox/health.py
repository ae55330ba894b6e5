"""The grid check of an InfobloxInstance's connection, and the instance's `Ready` condition it decides.

Contract:
- `health(connection)` checks the grid (reachability, TLS, credentials, the default network view, a default DNS
  view other than NIOS's built-in one, the ownership extensible-attribute definitions, created when missing if the
  instance allows it; so is the optional CAPI-Cluster-Identity, whose absence is no failure: `Health.ea_names`
  says whether it is defined) and writes the instance's `Ready` condition when it changes (see `status`). Results are
  cached on the connection: long when healthy, short when not. A grid that refuses the credentials is asked again
  later and later (the short wait doubling, up to `auth_failed_max_recheck_seconds`), since a real grid may lock
  the account; a changed Secret builds a new connection, which is checked at once.
- `refused(connection)` answers that cached refusal while it stands, so that other paths (releases) do not ask the
  grid with credentials it refused either.
- `failed(connection, error)` records a call's failure that concerns the whole instance (`INSTANCE_WIDE`:
  credentials, TLS, reachability) as the connection's result and the instance's condition.
"""

from __future__ import annotations

import contextlib
import time

import structlog

from backends.infoblox.client import Problem, WapiError
from backends.infoblox.connections import Connection, Health
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import OPTIONAL_EAS, OWNERSHIP_EAS
from backends.infoblox.status import InstanceStatus

log = structlog.get_logger(__name__)
BUILTIN_DNS_VIEW = "default"
AUTH_FAILED = Problem.AUTH.value  # the Health reason of refused credentials
EA_COMMENT = "Written by the Cluster API IPAM provider (capi-ipam-provider-py) on the objects it owns"
INSTANCE_WIDE = frozenset({Problem.AUTH, Problem.TLS, Problem.UNREACHABLE})


class GridHealth:
    """The grid checks of every connection, and the conditions they decide."""

    def __init__(self, settings: InfobloxSettings, status: InstanceStatus) -> None:
        self._settings = settings
        self._status = status

    async def health(self, connection: Connection) -> Health:
        """The grid check's result, re-run when its cached result is too old."""
        async with connection.check_lock:
            current = connection.health
            if current is not None and time.monotonic() - current.checked_at < self._recheck_wait(connection):
                return current
            result = connection.health = await self._check(connection)
            connection.auth_failures = connection.auth_failures + 1 if result.reason == AUTH_FAILED else 0
        await self._status.publish(connection.name, result.ready, result.reason, result.message)
        return result

    def _recheck_wait(self, connection: Connection) -> float:
        """How long the connection's last grid check stands: long when it passed, short when it failed, and
        doubling with each refusal of the same credentials in a row."""
        health = connection.health
        if health is not None and health.ready:
            return self._settings.healthy_recheck_seconds
        wait = self._settings.unhealthy_recheck_seconds
        if health is None or health.reason != AUTH_FAILED:
            return wait
        doubled = wait * 2.0 ** min(max(connection.auth_failures - 1, 0), 32)
        return max(wait, min(doubled, self._settings.auth_failed_max_recheck_seconds))

    def refused(self, connection: Connection) -> Health | None:
        """The connection's cached AuthenticationFailed result while its re-check is not due yet, else None."""
        health = connection.health
        if health is None or health.reason != AUTH_FAILED:
            return None
        return health if time.monotonic() - health.checked_at < self._recheck_wait(connection) else None

    async def failed(self, connection: Connection, error: WapiError) -> Health:
        """Record that a call failed in a way that concerns the whole instance (credentials, TLS, reachability)."""
        reason, message = problem_condition(connection, error)
        if error.problem is Problem.AUTH:
            connection.read_at = 0.0  # read the Secret again on the next call: it may have been fixed
            previous = connection.health
            if previous is None or previous.reason != AUTH_FAILED:
                connection.auth_failures = max(connection.auth_failures, 1)
            elif self.refused(connection) is None:
                # The wait was over and this call (a release) asked the grid again: the wait doubles, as after a
                # grid check. Calls that were under way when the first refusal came back do not count.
                connection.auth_failures += 1
        health = Health(False, reason, message, time.monotonic())
        connection.health = health
        await self._status.publish(connection.name, False, reason, message)
        return health

    async def _check(self, connection: Connection) -> Health:
        spec, client = connection.spec, connection.client
        now = time.monotonic()
        try:
            if not await client.search("networkview", ["name"], {"name": spec.default_network_view}):
                message = f"network view {spec.default_network_view!r} does not exist on the grid; create it or fix "
                return Health(False, "NetworkViewNotFound", message + "spec.defaultNetworkView", now)
            # NIOS's built-in DNS view "default" is not asked for here, so that an API user without DNS
            # permissions (fixedAddress pools only) is not refused; hostRecord pools check their view themselves.
            custom_view = spec.default_dns_view != BUILTIN_DNS_VIEW
            dns_views = (
                await client.search("view", ["name", "network_view"], {"name": spec.default_dns_view})
                if custom_view
                else []
            )
            if custom_view and not dns_views:
                message = f"DNS view {spec.default_dns_view!r} does not exist on the grid; create it or fix "
                return Health(False, "DNSViewNotFound", message + "spec.defaultDNSView", now)
            bound = dns_views[0].get("network_view") if dns_views else None
            names = {str(d.get("name")) for d in await client.search("extensibleattributedef", ["name"], paging=True)}
            missing = [name for name in OWNERSHIP_EAS if name not in names]
            absent = missing + [name for name in OPTIONAL_EAS if name not in names]
            if absent and spec.manage_ea_definitions:
                for name in absent:
                    with contextlib.suppress(WapiError):
                        payload = {"name": name, "type": "STRING", "comment": EA_COMMENT}
                        await client.create("extensibleattributedef", payload, ["name"])
                        names.add(name)
                        log.info("extensible attribute definition created", instance=connection.name, ea=name)
                missing = [name for name in OWNERSHIP_EAS if name not in names]
        except WapiError as error:
            return Health(False, *problem_condition(connection, error), now)
        if missing:
            how = "the API user could not create them" if spec.manage_ea_definitions else "their creation is off"
            message = (
                f"the grid lacks the STRING extensible attribute definitions {', '.join(missing)} ({how}); create "
                "them in Grid Manager (Administration > Extensible Attributes) or let the provider's API user create "
                "extensible attribute definitions"
            )
            return Health(False, "ExtensibleAttributesMissing", message, now)
        views = f"network view {spec.default_network_view!r}" + (
            f" and DNS view {spec.default_dns_view!r} exist" if custom_view else " exists"
        )
        message = f"WAPI {spec.wapi_version} at {spec.netloc} answers; {views}"
        bound_view = bound if isinstance(bound, str) else None
        return Health(True, "Connected", message, now, frozenset(names), bound_view)


def problem_condition(connection: Connection, error: WapiError) -> tuple[str, str]:
    """The condition reason and message for an instance-wide failure."""
    where = f"WAPI {connection.spec.wapi_version} at {connection.spec.netloc}"
    if error.problem is Problem.AUTH:
        return AUTH_FAILED, (
            f"{where} refused the credentials of Secret {connection.secret} (HTTP 401); fix the Secret"
        )
    if error.problem is Problem.TLS:
        return "TLSVerificationFailed", (
            f"{where}: {error.detail}; set spec.caBundle or spec.caBundleSecretRef to the CA that signed it"
        )
    if error.problem in (Problem.UNREACHABLE, Problem.UNKNOWN_OUTCOME):
        return "Unreachable", f"{where} did not answer: {error.detail}; check spec.host, spec.port and the network"
    if error.problem is Problem.UNAVAILABLE:
        return "GridUnavailable", f"{where}: {error.detail}"
    if error.problem is Problem.VIEW_NOT_FOUND:
        return "NetworkViewNotFound", f"{where}: {error.detail}"
    return "WAPIError", f"{where}: {error.detail}"
