"""InfobloxInstances: reading them and their Secrets, one cached connection each, the grid check, and the
instance's `Ready` condition.

Contract:
- `connect(name)` answers the instance's `Connection`, reading the InfobloxInstance and its Secrets at most once
  per `instance_cache_seconds`; the connection (its Connector, thread pool and private files) is rebuilt when the
  instance's generation or either Secret's resourceVersion changes. A replaced connection is closed only after the
  longest a call on it can take, so calls in flight finish on it.
- Problems that need a person (instance missing, Secret missing or incomplete, CA bundle unreadable) raise
  `InstanceProblem` with a condition reason and a message; they are also written to the instance's status.
- `health(conn)` checks the grid (reachability, TLS, credentials, the default network view, a default DNS view
  other than NIOS's built-in one, the ownership extensible-attribute definitions, created when missing if the
  instance allows it) and writes the instance's `Ready` condition when it changes. Results are cached: long when
  healthy, short when not. A grid that refuses the credentials is asked again later and later (the short wait
  doubling, up to `auth_failed_max_recheck_seconds`), since a real grid may lock the account; a changed Secret
  builds a new connection, which is checked at once. `refused(conn)` answers that cached refusal while it stands,
  so that other paths (releases) do not ask the grid with credentials it refused either.
- Credentials are only ever put in the Connector (and, for a client certificate, in 0600 files of a private 0700
  temporary directory, removed with the connection). They never reach a log, a condition or an exception.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import os
import ssl
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from pydantic import ValidationError

from backends.infoblox.client import Problem, WapiClient, WapiError
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import INSTANCES, OWNERSHIP_EAS, InstanceSpec
from ipam_provider.api.meta import Condition, set_condition
from ipam_provider.common import Object
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.errors import ApiError
from ipam_provider.kube.resources import SECRETS

log = structlog.get_logger(__name__)
BUILTIN_DNS_VIEW = "default"
AUTH_FAILED = Problem.AUTH.value  # the Health reason of refused credentials
EA_COMMENT = "Written by the Cluster API IPAM provider (capi-ipam-provider-py) on the objects it owns"


class InstanceProblem(Exception):
    """An InfobloxInstance that cannot be used; `reason` and `message` go into conditions."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Health:
    ready: bool
    reason: str
    message: str
    checked_at: float
    ea_names: frozenset[str] = frozenset()


@dataclass
class _Material:
    key: tuple[str, ...]
    spec: InstanceSpec
    options: dict[str, Any]
    secret: str
    files: tempfile.TemporaryDirectory[str] | None


@dataclass
class Connection:
    name: str
    key: tuple[str, ...]
    spec: InstanceSpec
    client: WapiClient
    secret: str  # "<namespace>/<name>", for messages
    files: tempfile.TemporaryDirectory[str] | None
    read_at: float
    health: Health | None = None
    check_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    auth_failures: int = 0  # grid checks in a row that ended in HTTP 401, with these credentials

    async def close(self) -> None:
        await self.client.close()
        if self.files is not None:
            self.files.cleanup()


class Instances:
    """Every InfobloxInstance this process talks to."""

    def __init__(self, kube: KubeClient, settings: InfobloxSettings) -> None:
        self._kube = kube
        self._settings = settings
        self._connections: dict[str, Connection] = {}
        self._raw: dict[str, Object] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._retiring: dict[asyncio.Task[None], Connection] = {}

    async def connect(self, name: str) -> Connection:
        async with self._locks[name]:
            current = self._connections.get(name)
            if current is not None and time.monotonic() - current.read_at < self._settings.instance_cache_seconds:
                return current
            raw = await self._kube.get(INSTANCES, name)
            if raw is None:
                self._retire(name)
                raise InstanceProblem(
                    "InstanceNotFound", f"InfobloxInstance {name} was not found; create it or fix spec.instanceRef"
                )
            self._raw[name] = raw
            try:
                material = await self._read(raw)
            except InstanceProblem as problem:
                self._retire(name)
                await self.publish(name, False, problem.reason, problem.message)
                raise
            if current is not None and current.key == material.key:
                if material.files is not None:
                    material.files.cleanup()
                current.read_at = time.monotonic()
                return current
            spec = material.spec
            client = WapiClient(
                material.options,
                max_workers=spec.max_concurrent_requests,
                request_timeout=spec.request_timeout_seconds,
                retry=self._settings.retry,
                label=name,
            )
            connection = Connection(name, material.key, spec, client, material.secret, material.files, time.monotonic())
            self._retire(name)
            self._connections[name] = connection
            log.info("connection to grid built", instance=name, host=spec.netloc, wapi=spec.wapi_version)
            return connection

    async def _read(self, raw: Object) -> _Material:
        """What a connection to the instance needs; private files are removed again if reading fails."""
        try:
            spec = InstanceSpec.model_validate(raw.get("spec") or {})
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InstanceProblem("InvalidConfiguration", f"spec.{where}: {first['msg']}") from error
        ref = spec.credentials_secret_ref
        secret_label = f"{ref.namespace}/{ref.name}"
        secret = await self._kube.get(SECRETS, ref.name, ref.namespace)
        if secret is None:
            raise InstanceProblem("CredentialsNotFound", f"Secret {secret_label} was not found; create it")
        data = _decode(secret)
        pem, ca_version = (None, "") if spec.insecure_skip_verify else await self._ca_bundle(spec)
        if pem is not None:
            try:
                ssl.create_default_context(cadata=pem)
            except (ssl.SSLError, ValueError) as error:
                raise InstanceProblem("InvalidCABundle", "the CA bundle holds no readable PEM certificate") from error
        options: dict[str, Any] = {"host": spec.netloc, "wapi_version": spec.wapi_version}
        cert = data.get("clientCert") or data.get("tls.crt")
        key = data.get("clientKey") or data.get("tls.key")
        use_password = bool(data.get("username") and data.get("password"))
        if not use_password and not (cert and key):
            raise InstanceProblem(
                "InvalidCredentials",
                f"Secret {secret_label} holds neither username and password nor clientCert and clientKey",
            )
        files = None
        if pem is not None or not use_password:
            files = tempfile.TemporaryDirectory(prefix="ipam-infoblox-")  # 0700, removed with the connection
        if use_password:
            options["username"] = data["username"].decode("utf-8", "replace")
            options["password"] = data["password"].decode("utf-8", "replace")
        elif files is not None and cert and key:
            options["cert"] = _private_file(files.name, "client.crt", cert)
            options["key"] = _private_file(files.name, "client.key", key)
        if spec.insecure_skip_verify:
            options["ssl_verify"] = False
        elif pem is None:
            options["ssl_verify"] = True  # the CAs requests trusts (certifi, or REQUESTS_CA_BUNDLE)
        elif files is not None:
            options["ssl_verify"] = _private_file(files.name, "ca.crt", pem.encode())
        meta = raw["metadata"]
        key_parts = (str(meta.get("uid")), str(meta.get("generation")), str(secret["metadata"]["resourceVersion"]))
        return _Material((*key_parts, ca_version), spec, options, secret_label, files)

    async def _ca_bundle(self, spec: InstanceSpec) -> tuple[str | None, str]:
        if spec.ca_bundle:
            return spec.ca_bundle, ""
        ref = spec.ca_bundle_secret_ref
        if ref is None:
            return None, ""
        secret = await self._kube.get(SECRETS, ref.name, ref.namespace)
        if secret is None:
            raise InstanceProblem("InvalidCABundle", f"CA bundle Secret {ref.namespace}/{ref.name} was not found")
        value = _decode(secret).get(ref.key)
        if not value:
            raise InstanceProblem(
                "InvalidCABundle", f"CA bundle Secret {ref.namespace}/{ref.name} has no key {ref.key!r}"
            )
        return value.decode("utf-8", "replace"), str(secret["metadata"]["resourceVersion"])

    async def health(self, connection: Connection) -> Health:
        """The grid check's result, re-run when its cached result is too old."""
        async with connection.check_lock:
            current = connection.health
            if current is not None and time.monotonic() - current.checked_at < self._recheck_wait(connection):
                return current
            result = connection.health = await self._check(connection)
            connection.auth_failures = connection.auth_failures + 1 if result.reason == AUTH_FAILED else 0
        await self.publish(connection.name, result.ready, result.reason, result.message)
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
        await self.publish(connection.name, False, reason, message)
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
            if custom_view and not await client.search("view", ["name"], {"name": spec.default_dns_view}):
                message = f"DNS view {spec.default_dns_view!r} does not exist on the grid; create it or fix "
                return Health(False, "DNSViewNotFound", message + "spec.defaultDNSView", now)
            names = {str(d.get("name")) for d in await client.search("extensibleattributedef", ["name"], paging=True)}
            missing = [name for name in OWNERSHIP_EAS if name not in names]
            if missing and spec.manage_ea_definitions:
                for name in missing:
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
        return Health(True, "Connected", message, now, frozenset(names))

    async def publish(self, name: str, ready: bool, reason: str, message: str) -> None:
        """Write the instance's Ready condition if it changed."""
        raw = self._raw.get(name)
        if raw is None:
            return
        status = raw.get("status") or {}
        try:
            current = [Condition.model_validate(c) for c in status.get("conditions") or []]
        except ValidationError:
            current = []
        generation = raw["metadata"].get("generation")
        conditions, changed = set_condition(
            current, type="Ready", status=ready, reason=reason, message=message, generation=generation
        )
        if not changed:
            return
        patch = {"status": {"conditions": [c.wire() for c in conditions]}}
        try:
            self._raw[name] = await self._kube.patch(INSTANCES, name, patch, subresource="status")
        except ApiError as error:
            log.warning("cannot write the InfobloxInstance status", instance=name, error=error.message)
            return
        log.info("instance condition changed", instance=name, ready=ready, reason=reason, message=message)

    def _retire(self, name: str) -> None:
        """Replace without pulling the ground from under calls still using the old connection: close it (its
        client, its certificate and CA files) only once every call it may be serving has ended."""
        connection = self._connections.pop(name, None)
        if connection is None:
            return
        task = asyncio.get_running_loop().create_task(self._close_later(connection))
        self._retiring[task] = connection
        task.add_done_callback(lambda done: self._retiring.pop(done, None))

    @staticmethod
    async def _close_later(connection: Connection) -> None:
        await asyncio.sleep(connection.client.longest_call_seconds)
        await connection.close()

    async def close(self) -> None:
        """Close every connection now, retired ones included (the process is stopping)."""
        for name in list(self._connections):
            self._retire(name)
        for task, connection in list(self._retiring.items()):
            task.cancel()
            await connection.close()


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


INSTANCE_WIDE = frozenset({Problem.AUTH, Problem.TLS, Problem.UNREACHABLE})


def _decode(secret: Mapping[str, Any]) -> dict[str, bytes]:
    decoded: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        with contextlib.suppress(binascii.Error, ValueError, TypeError):
            decoded[key] = base64.b64decode(value)
    return decoded


def _private_file(directory: str, name: str, content: bytes) -> str:
    path = os.path.join(directory, name)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(content)
    return path
