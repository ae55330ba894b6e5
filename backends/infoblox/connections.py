"""From an InfobloxInstance and its Secrets to a cached, checked connection to its grid, and the instance's
conditions (`Ready`, `TLSVerified`).

Contract:
- `Connections.connect(name, namespace)` answers only a pool of a namespace the instance's `spec.allowedNamespaces`
  allows (listed, or its labels matching the selector; the Namespace's labels cached like the instance); otherwise
  InstanceProblem InstanceNotAllowed, and no Secret of the instance is read and nothing written on it. It reads the
  InfobloxInstance, its credentials Secret (`username` and `password`, or `clientCert`/`tls.crt` and
  `clientKey`/`tls.key`) and its CA bundle (PEM, at most CA_BUNDLE_LIMIT bytes) at most once per
  `instance_cache_seconds`, every Secret through `tenancy.read_secret` (its Namespace must lend Secrets to
  cluster-scoped objects: else SecretNotAllowed), and rebuilds the connection when the instance's generation or a
  Secret's resourceVersion changes; a replaced one, or one no pool asked for within `idle_connection_seconds`, is
  closed after `client.longest_call_seconds` and its files removed. A problem of the instance's own raises
  `InstanceProblem`, also written to its status. Credentials only go into the Connector options (and 0600 files of
  a private 0700 temporary directory, removed with the connection); never into a log, a condition or an exception.
- A connection built with `insecureSkipVerify` sets the instance's TLSVerified=False (InsecureSkipVerify) with a
  Warning Event and a warning log; pools report the same condition (`tls_condition`).
- `GridHealth.health(connection)` checks reachability, TLS, credentials, the default views and the extensible
  attribute definitions (created when missing if the instance allows it), cached long when healthy, short when not;
  refused credentials are asked again later and later (up to `auth_failed_max_recheck_seconds`: a grid may lock the
  account), and `refused` answers that refusal while it stands, so that releases do not ask either.
- `InstanceStatus.publish` writes an instance's condition only when it changes; a failed write is logged.
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
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from pydantic import ValidationError

from backends.infoblox.client import PAGE_SIZE, Failure, WapiClient, WapiError
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import (
    INSTANCES,
    OPTIONAL_EAS,
    OWNERSHIP_EAS,
    AllowedNamespaces,
    InstanceSpec,
    Pool,
    SecretRef,
)
from backends.validation import spec_error
from ipam_provider.api.capi import READY, Condition, set_condition
from ipam_provider.backend.contract import AllocationFailedError, BackendError, PoolNotReadyError
from ipam_provider.backend.tenancy import (
    AccessDenied,
    Referrer,
    name_problem,
    namespace_labels,
    read_secret,
    selector_matches,
)
from ipam_provider.common import Object
from ipam_provider.runtime.events.recorder import WARNING, EventRecorder
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import subdomain_problem

log = structlog.get_logger(__name__)
BUILTIN_DNS_VIEW = "default"
AUTH_FAILED = Failure.AUTH.value  # the Health reason of refused credentials
EA_COMMENT = "Written by the Cluster API IPAM provider (capi-ipam-provider-py) on the objects it owns"
INSTANCE_WIDE = frozenset({Failure.AUTH, Failure.TLS, Failure.UNREACHABLE})
CA_BUNDLE_LIMIT = 64 * 1024  # bytes of a CA bundle, inline or from its Secret
PEM_CERTIFICATE = "-----BEGIN CERTIFICATE-----"
TLS_CONDITION = "TLSVerified"


@dataclass(frozen=True)
class Health:
    ready: bool
    reason: str
    message: str
    checked_at: float
    ea_names: frozenset[str] = frozenset()
    dns_view_network_view: str | None = None  # the network view of a custom defaultDNSView


@dataclass
class Connection:
    """One instance's grid: its client and its grid check's state (last `Health`, one check at a time, refusals)."""

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
    used_at: float = field(default_factory=lambda: time.monotonic())  # when a pool last asked for it

    def network_view(self, pool: Pool) -> str:
        return pool.spec.network_view or self.spec.default_network_view

    def dns_view(self, pool: Pool) -> str:
        settings = pool.spec.host_record
        return (settings.dns_view if settings else None) or self.spec.default_dns_view

    async def close(self) -> None:
        await self.client.close()
        if self.files is not None:
            self.files.cleanup()


class InstanceProblem(Exception):
    """An InfobloxInstance that cannot be used; `reason` and `message` go into conditions."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class Material:
    key: tuple[str, ...]  # instance uid and generation, Secret resourceVersions: a change means a new connection
    spec: InstanceSpec
    options: dict[str, Any]  # the Connector's
    secret: str  # "<namespace>/<name>" of the credentials Secret, for messages
    files: tempfile.TemporaryDirectory[str] | None  # the private files the options name


def allowed_namespaces(instance: Object) -> AllowedNamespaces | None:
    """The instance's spec.allowedNamespaces, nothing else of it read; None (no namespace) when it is malformed."""
    spec = instance.get("spec")
    try:
        return AllowedNamespaces.model_validate(spec["allowedNamespaces"]) if isinstance(spec, dict) else None
    except (KeyError, TypeError, ValidationError):
        return None


def instance_spec(instance: Object) -> InstanceSpec:
    """The instance's spec, its Secret names checked; InstanceProblem InvalidConfiguration when it is malformed."""
    try:
        spec = InstanceSpec.model_validate(instance.get("spec") or {})
    except ValidationError as error:
        raise InstanceProblem("InvalidConfiguration", spec_error(error)) from error
    refs: list[tuple[str, SecretRef | None]] = [
        ("spec.credentialsSecretRef", spec.credentials_secret_ref),
        ("spec.caBundleSecretRef", spec.ca_bundle_secret_ref),
    ]
    for field_name, ref in refs:
        if ref is not None and (problem := name_problem(field_name, ref.name, ref.namespace)):
            raise InstanceProblem("InvalidConfiguration", problem)
    return spec


async def read_material(kube: KubeClient, instance: Object, spec: InstanceSpec) -> Material:
    """What a connection to `instance` (of checked `spec`) needs; private files are removed again if reading fails.
    Every Secret is read through `tenancy.read_secret`: its Namespace must lend Secrets to cluster-scoped objects."""
    ref = spec.credentials_secret_ref
    secret_label = f"{ref.namespace}/{ref.name}"
    where = f"Secret {secret_label} (spec.credentialsSecretRef)"
    referrer = Referrer(INSTANCES.kind, str(instance["metadata"]["name"]), None)
    secret = await _secret(kube, referrer, "spec.credentialsSecretRef", ref)
    if secret is None:
        raise InstanceProblem("CredentialsNotFound", f"{where} was not found; create it")
    data = _decode(secret)
    pem, ca_version = (None, "") if spec.insecure_skip_verify else await _ca_bundle(kube, referrer, spec)
    options: dict[str, Any] = {"host": spec.netloc, "wapi_version": spec.wapi_version}
    cert = data.get("clientCert") or data.get("tls.crt")
    key = data.get("clientKey") or data.get("tls.key")
    use_password = bool(data.get("username") and data.get("password"))
    if not use_password and not (cert and key):
        raise InstanceProblem(
            "InvalidCredentials", f"{where} holds neither username and password nor clientCert and clientKey"
        )
    files = tempfile.TemporaryDirectory(prefix="ipam-infoblox-") if pem is not None or not use_password else None
    if use_password:
        options["username"] = data["username"].decode("utf-8", "replace")
        options["password"] = data["password"].decode("utf-8", "replace")
    elif files is not None and cert and key:
        options["cert"] = _private_file(files.name, "client.crt", cert)
        options["key"] = _private_file(files.name, "client.key", key)
    options["ssl_verify"] = not spec.insecure_skip_verify  # True: the CAs requests trusts (certifi, REQUESTS_CA_BUNDLE)
    if pem is not None and files is not None:
        options["ssl_verify"] = _private_file(files.name, "ca.crt", pem.encode())
    meta = instance["metadata"]
    key_parts = (str(meta.get("uid")), str(meta.get("generation")), str(secret["metadata"]["resourceVersion"]))
    return Material((*key_parts, ca_version), spec, options, secret_label, files)


async def _secret(kube: KubeClient, referrer: Referrer, field_name: str, ref: SecretRef) -> Object | None:
    """The Secret `ref` names, or None; InstanceProblem SecretNotAllowed when its Namespace does not lend it."""
    try:
        return await read_secret(kube, referrer, field_name, ref.name, ref.namespace)
    except AccessDenied as error:
        raise InstanceProblem("SecretNotAllowed", str(error)) from error


async def _ca_bundle(kube: KubeClient, referrer: Referrer, spec: InstanceSpec) -> tuple[str | None, str]:
    """The instance's CA bundle, checked (None: the default trust store), and the resourceVersion of its Secret."""
    if spec.ca_bundle:
        return checked_ca_bundle(spec.ca_bundle.encode(), "spec.caBundle"), ""
    ref = spec.ca_bundle_secret_ref
    if ref is None:
        return None, ""
    where = f"CA bundle Secret {ref.namespace}/{ref.name}"
    secret = await _secret(kube, referrer, "spec.caBundleSecretRef", ref)
    if secret is None:
        raise InstanceProblem("InvalidCABundle", f"{where} was not found")
    value = _decode(secret).get(ref.key)
    if not value:
        raise InstanceProblem("InvalidCABundle", f"{where} has no key {ref.key!r}")
    return checked_ca_bundle(value, f"key {ref.key!r} of {where}"), str(secret["metadata"]["resourceVersion"])


def checked_ca_bundle(pem: bytes, where: str) -> str:
    """`pem` as text if it is a PEM bundle of CA certificates of at most CA_BUNDLE_LIMIT bytes; else
    InstanceProblem InvalidCABundle, saying which (never quoting the content)."""
    if len(pem) > CA_BUNDLE_LIMIT:
        raise InstanceProblem(
            "InvalidCABundle", f"{where} is {len(pem)} bytes, over the {CA_BUNDLE_LIMIT} bytes a CA bundle may have"
        )
    text = pem.decode("utf-8", "replace")
    try:
        if PEM_CERTIFICATE not in text:
            raise ValueError("no PEM certificate")
        ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError) as error:
        raise InstanceProblem("InvalidCABundle", f"{where} holds no readable PEM certificate") from error
    return text


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


class InstanceStatus:
    """Each InfobloxInstance's conditions, written when they change (`ready_changed(name)` is called when its Ready
    condition did); Warning Events about instances."""

    def __init__(self, kube: KubeClient, recorder: EventRecorder | None = None) -> None:
        self._kube = kube
        self._recorder = recorder
        self.instances: dict[str, Object] = {}  # each InfobloxInstance in use, as last read or written
        self.ready_changed: Callable[[str], None] = lambda name: None

    async def publish(self, name: str, ready: bool, reason: str, message: str, type: str = READY) -> bool:
        """Set condition `type` of the instance (as last read by Connections.connect); whether it changed. An
        instance no longer held (its connection retired meanwhile) is not written."""
        instance = self.instances.get(name)
        if instance is None:
            return False
        try:
            current = [Condition.model_validate(c) for c in (instance.get("status") or {}).get("conditions") or []]
        except ValidationError:
            current = []
        generation = instance["metadata"].get("generation")
        conditions, changed = set_condition(current, type, ready, reason, message, generation)
        if not changed:
            return False
        patch = {"status": {"conditions": [c.wire() for c in conditions]}}
        try:
            self.instances[name] = await self._kube.patch(INSTANCES, name, patch, subresource="status")
        except ApiError as error:
            log.warning("cannot write the InfobloxInstance status", instance=name, error=error.message)
            return False
        log.info("instance condition changed", instance=name, type=type, status=ready, reason=reason, message=message)
        if type == READY:
            self.ready_changed(name)
        return True

    async def publish_tls(self, name: str, spec: InstanceSpec) -> None:
        """The instance's TLSVerified condition; turning verification off is also a Warning Event and log."""
        status, reason, message = tls_condition(spec)
        if not status:
            log.warning("TLS verification of the grid is off", instance=name, host=spec.netloc)
        if await self.publish(name, status, reason, message, TLS_CONDITION) and not status and self._recorder:
            self._recorder.start()
            self._recorder.record(self.instances[name], WARNING, reason, message)


def tls_condition(spec: InstanceSpec) -> tuple[bool, str, str]:
    """The TLSVerified condition of an instance and of its pools: status, reason and message."""
    if spec.insecure_skip_verify:
        message = (
            f"spec.insecureSkipVerify is set: the certificate of {spec.netloc} is not verified, so anyone on the "
            "path can read the credentials; set spec.caBundle or spec.caBundleSecretRef and remove insecureSkipVerify"
        )
        return False, "InsecureSkipVerify", message
    source = "spec.caBundle" if spec.ca_bundle else "spec.caBundleSecretRef" if spec.ca_bundle_secret_ref else None
    return True, "Verified", f"the certificate of {spec.netloc} is verified against {source or 'the trusted CAs'}"


class Connections:
    """The connections to every InfobloxInstance in use (see the module's contract)."""

    def __init__(self, kube: KubeClient, settings: InfobloxSettings, status: InstanceStatus) -> None:
        self._kube = kube
        self._settings = settings
        self._status = status
        self._connections: dict[str, Connection] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()  # while used
        self._closing: dict[asyncio.Task[None], Connection] = {}  # replaced ones, closed once their calls ended
        self._namespaces: dict[str, tuple[float, Mapping[str, str] | None]] = {}  # labels, as read at a time

    async def connect(self, name: str, namespace: str) -> Connection:
        """The connection to InfobloxInstance `name` for a pool of `namespace` (see the module's contract)."""
        if problem := subdomain_problem(name):
            raise InstanceProblem("InvalidConfiguration", f"spec.instanceRef.name: {problem}")
        self._sweep()
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            connection = await self._current(name, namespace)
        connection.used_at = time.monotonic()
        return connection

    async def _current(self, name: str, namespace: str) -> Connection:
        current = self._connections.get(name)
        if current is not None and time.monotonic() - current.read_at < self._settings.instance_cache_seconds:
            await self._admit(current.spec.allowed_namespaces, namespace)
            return current
        instance = await self._kube.get(INSTANCES, name)
        if instance is None:
            self._retire(name)
            self._status.instances.pop(name, None)
            raise InstanceProblem(
                "InstanceNotFound", f"InfobloxInstance {name} was not found; create it or fix spec.instanceRef"
            )
        material = await self._material(name, instance, namespace)
        if current is not None and current.key == material.key:
            if material.files is not None:
                material.files.cleanup()
            current.read_at = time.monotonic()
            return current
        spec, retry = material.spec, self._settings.retry
        workers, timeout = spec.max_concurrent_requests, spec.request_timeout_seconds
        client = WapiClient(material.options, max_workers=workers, request_timeout=timeout, retry=retry, label=name)
        connection = Connection(name, material.key, spec, client, material.secret, material.files, time.monotonic())
        self._retire(name)
        self._connections[name] = connection
        log.info("connection to grid built", instance=name, host=spec.netloc, wapi=spec.wapi_version)
        await self._status.publish_tls(name, spec)
        return connection

    async def _material(self, name: str, instance: Object, namespace: str) -> Material:
        """The instance's checked spec and Secrets, once `namespace` is found allowed (nothing else of the instance
        is looked at before); a problem of the instance's own is written on it (and its connection retired)."""
        await self._admit(allowed_namespaces(instance), namespace)
        self._status.instances[name] = instance
        try:
            return await read_material(self._kube, instance, instance_spec(instance))
        except InstanceProblem as problem:
            self._retire(name)
            await self._status.publish(name, False, problem.reason, problem.message)
            self._status.instances.pop(name, None)  # read again by the next connect, which has no connection to reuse
            raise

    async def _admit(self, allowed: AllowedNamespaces | None, namespace: str) -> None:
        """InstanceProblem InstanceNotAllowed unless the instance's `allowed` namespaces list or select `namespace`;
        the message names the namespace and the field, nothing more (callers prefix the instance's name)."""
        if allowed is not None and namespace in allowed.names:
            return
        if allowed is not None and allowed.selector is not None:
            labels = await self._labels(namespace)
            if labels is not None and selector_matches(allowed.selector, labels):
                return
        raise InstanceProblem(
            "InstanceNotAllowed",
            f"namespace {namespace} may not use it: its spec.allowedNamespaces neither lists the namespace nor "
            "selects its labels; its owner may add the namespace to spec.allowedNamespaces.list, or label the "
            "namespace to match spec.allowedNamespaces.selector",
        )

    async def _labels(self, namespace: str) -> Mapping[str, str] | None:
        """The Namespace's labels, read at most once per `instance_cache_seconds`."""
        now = time.monotonic()
        read_at, labels = self._namespaces.get(namespace, (None, None))
        if read_at is not None and now - read_at < self._settings.instance_cache_seconds:
            return labels
        labels = await namespace_labels(self._kube, namespace)
        self._namespaces[namespace] = now, labels
        return labels

    def _sweep(self) -> None:
        """Retire connections no pool asked for within `idle_connection_seconds` (their instance or pools went),
        and forget stale Namespace labels."""
        now, settings = time.monotonic(), self._settings
        for name, connection in list(self._connections.items()):
            if now - connection.used_at > settings.idle_connection_seconds and name not in self._locks:
                self._retire(name)  # (a name in `_locks` has a connect under way)
                self._status.instances.pop(name, None)
        fresh = {ns: read for ns, read in self._namespaces.items() if now - read[0] <= settings.instance_cache_seconds}
        self._namespaces = fresh

    def _retire(self, name: str) -> None:
        connection = self._connections.pop(name, None)
        if connection is not None:
            task = asyncio.get_running_loop().create_task(_close_later(connection))
            self._closing[task] = connection
            task.add_done_callback(lambda done: self._closing.pop(done, None))

    async def close(self) -> None:
        """Close every connection now, retired ones included (the process is stopping)."""
        for name in list(self._connections):
            self._retire(name)
        for task, connection in list(self._closing.items()):
            task.cancel()
            await connection.close()


async def _close_later(connection: Connection) -> None:
    await asyncio.sleep(connection.client.longest_call_seconds)
    await connection.close()


class GridHealth:
    """The grid checks of every connection, and the conditions they decide."""

    def __init__(self, settings: InfobloxSettings, status: InstanceStatus) -> None:
        self._settings = settings
        self._status = status

    async def health(self, connection: Connection) -> Health:
        async with connection.check_lock:
            current = connection.health
            if current is not None and time.monotonic() - current.checked_at < self._recheck_wait(connection):
                return current
            result = connection.health = await self._check(connection)
            connection.auth_failures = connection.auth_failures + 1 if result.reason == AUTH_FAILED else 0
        await self._status.publish(connection.name, result.ready, result.reason, result.message)
        return result

    def _recheck_wait(self, connection: Connection) -> float:
        """How long the last grid check stands: long if it passed, short if not, doubling per refusal in a row."""
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
        reason, message = failure_condition(connection, error)
        if error.failure is Failure.AUTH:
            connection.read_at = 0.0  # read the Secret again on the next call: it may have been fixed
            if connection.health is None or connection.health.reason != AUTH_FAILED:
                connection.auth_failures = max(connection.auth_failures, 1)
            elif self.refused(connection) is None:
                # The wait was over and this call asked again: it doubles (calls already under way do not count).
                connection.auth_failures += 1
        health = connection.health = Health(False, reason, message, time.monotonic())
        await self._status.publish(connection.name, False, reason, message)
        return health

    async def translate(self, connection: Connection, error: WapiError, what: str) -> BackendError:
        """A BackendError for people; instance-wide failures also go to the instance's condition."""
        if error.failure in INSTANCE_WIDE:
            health = await self.failed(connection, error)
            return PoolNotReadyError(f"InfobloxInstance {connection.name}: {health.message}")
        if error.failure is Failure.VIEW_NOT_FOUND:
            return PoolNotReadyError(view_missing(error.detail, what)[1])
        if error.failure is Failure.TARGET_NOT_FOUND:
            return PoolNotReadyError(f"{what}: {error.detail}; create it on the grid or fix the pool's spec")
        if error.failure is Failure.UNKNOWN_EA:
            return PoolNotReadyError(
                f"{error.detail}: define it on the grid or remove it from spec.extensibleAttributes"
            )
        if error.failure is Failure.EA_NOT_ALLOWED:
            return PoolNotReadyError(
                f"{what}: the grid refused an extensible attribute the pool writes: {error.detail}; allow the object "
                "type in the attribute definition's allowed_object_types, or remove the attribute from "
                "spec.extensibleAttributes if it is the pool's own"
            )
        if error.failure in (Failure.UNAVAILABLE, Failure.UNKNOWN_OUTCOME):
            return AllocationFailedError(f"the grid did not answer ({error.detail}); retrying", retry_after=5.0)
        return AllocationFailedError(f"{what}: the grid refused: {error.detail}")

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
            query = {"name": spec.default_dns_view}
            dns_views = await client.search("view", ["name", "network_view"], query) if custom_view else []
            if custom_view and not dns_views:
                message = f"DNS view {spec.default_dns_view!r} does not exist on the grid; create it or fix "
                return Health(False, "DNSViewNotFound", message + "spec.defaultDNSView", now)
            bound = dns_views[0].get("network_view") if dns_views else None
            names, missing = await self._definitions(connection)
        except WapiError as error:
            return Health(False, *failure_condition(connection, error), now)
        if missing:
            how = "the API user could not create them" if spec.manage_ea_definitions else "their creation is off"
            message = (
                f"the grid lacks the STRING extensible attribute definitions {', '.join(missing)} ({how}); create "
                "them in Grid Manager (Administration > Extensible Attributes) or let the provider's API user create "
                "extensible attribute definitions"
            )
            return Health(False, "ExtensibleAttributesMissing", message, now)
        views = f"network view {spec.default_network_view!r}"
        views += f" and DNS view {spec.default_dns_view!r} exist" if custom_view else " exists"
        message = f"WAPI {spec.wapi_version} at {spec.netloc} answers; {views}"
        return Health(True, "Connected", message, now, frozenset(names), bound if isinstance(bound, str) else None)

    async def _definitions(self, connection: Connection) -> tuple[set[str], list[str]]:
        """The grid's extensible-attribute definition names, after creating those this backend writes when missing
        (if the instance allows it), and the ownership ones still missing."""
        client = connection.client
        definitions = await client.search("extensibleattributedef", ["name"], page_size=PAGE_SIZE)
        names = {str(d.get("name")) for d in definitions}
        absent = [name for name in (*OWNERSHIP_EAS, *OPTIONAL_EAS) if name not in names]
        for name in absent if connection.spec.manage_ea_definitions else ():
            with contextlib.suppress(WapiError):
                payload = {"name": name, "type": "STRING", "comment": EA_COMMENT}
                await client.create("extensibleattributedef", payload, ["name"])
                names.add(name)
                log.info("extensible attribute definition created", instance=connection.name, ea=name)
        return names, [name for name in OWNERSHIP_EAS if name not in names]


def failure_condition(connection: Connection, error: WapiError) -> tuple[str, str]:
    """The condition reason and message for an instance-wide failure."""
    where = f"WAPI {connection.spec.wapi_version} at {connection.spec.netloc}"
    if error.failure is Failure.AUTH:
        return AUTH_FAILED, f"{where} refused the credentials of Secret {connection.secret} (HTTP 401); fix the Secret"
    if error.failure is Failure.TLS:
        return "TLSVerificationFailed", (
            f"{where}: {error.detail}; set spec.caBundle or spec.caBundleSecretRef to the CA that signed it"
        )
    if error.failure in (Failure.UNREACHABLE, Failure.UNKNOWN_OUTCOME):
        return "Unreachable", f"{where} did not answer: {error.detail}; check spec.host, spec.port and the network"
    reason = {Failure.UNAVAILABLE: "GridUnavailable", Failure.VIEW_NOT_FOUND: "NetworkViewNotFound"}
    return reason.get(error.failure, "WAPIError"), f"{where}: {error.detail}"


def view_missing(detail: str, what: str) -> tuple[str, str]:
    """The reason and message of a 404 on a view (`View <name> not found` or `Network view <name> not found`)."""
    if detail.startswith("Network view"):
        kind, fix = "network view", "spec.networkView or the InfobloxInstance's defaultNetworkView"
    else:
        kind, fix = "DNS view", "spec.hostRecord.dnsView or the InfobloxInstance's defaultDNSView"
    message = f"{what}: the pool's {kind} does not exist on the grid (the grid answered {detail!r}); create it or fix"
    return ("NetworkViewNotFound" if kind == "network view" else "DNSViewNotFound"), f"{message} {fix}"
