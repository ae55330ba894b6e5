"""From a pool's connection Secret to a `NetboxClient`, cached, and forgotten when no pool uses it.

Contract:
- The Secret (keys `url`, `token`, optional `caBundle`) is read by name only, through `tenancy.read_secret`
  (refused: SecretNotAllowed). What was read is trusted for `secret_seconds`, and so is each pool's right to it
  (checked per pool: a pool never gets what another pool was allowed to read); `invalidate` forgets the Secret at
  once (after an authentication failure, so that a rotated token is picked up on the next call).
- What one Secret makes the controller hold is bounded: `url` and `token` of at most URL_LENGTH and TOKEN_LENGTH
  characters, `caBundle` of at most CA_BUNDLE_BYTES, parsed as PEM certificates (written out re-encoded, so the CA
  file holds certificates only); anything else is InvalidSecret.
- One client per (URL, token, CA bundle, insecureSkipVerify): pools sharing a Secret share threads and connections.
  Every client of one URL shares one semaphore, so the requests in flight to a NetBox stay bounded however many
  Secrets point at it.
- `use(pool)` lends the client for one backend operation. A client no pool uses any more is retired: when its
  Secret's content changed (a rotated token), when its Secret is gone or unusable, when its pool names another
  Secret, or when its pool is gone (`forget`). No new operation gets a retired client, and it is closed, its CA
  file removed, once the last operation that borrowed it ends, so a pool still working with the old token is never
  cut off mid-operation. `client(pool)` returns the current client without a loan (for inspection; such a client
  may be closed under its holder). A client's CA bundle is a private temporary file (requests verifies a path).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import structlog
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from backends.netbox import reasons
from backends.netbox.client import ClientSettings, Endpoint, NetboxClient, display_url
from backends.netbox.reasons import PoolUnusableError
from backends.netbox.spec import SECRET_REF_FIELD, Pool
from ipam_provider.backend.contract import PoolRef
from ipam_provider.backend.tenancy import AccessDenied, Referrer, read_secret
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError

log = structlog.get_logger(__name__)

URL_LENGTH = 2048
TOKEN_LENGTH = 1024
# A private CA's chain is a few certificates of 1-2 KiB each; 64 KiB holds about 30. The bound keeps what Secrets
# make the controller write to its 16 MiB /tmp at 64 KiB per client (one client per pool at most, plus retired
# ones until their operations end).
CA_BUNDLE_BYTES = 64 * 1024

SecretKey = tuple[str, str]  # the Secret's namespace and name
Use = tuple[str, str, bool]  # a Secret, and insecureSkipVerify


@dataclass(frozen=True)
class _SecretData:
    url: str
    token: str
    ca_bundle: str | None
    read_at: float

    def __repr__(self) -> str:  # never the token
        return f"_SecretData(url={display_url(self.url)!r})"


class Connections:
    """The NetBox clients of one backend."""

    def __init__(self, kube: KubeClient, settings: ClientSettings, secret_seconds: float = 30.0) -> None:
        self.kube = kube
        self.settings = settings
        self.secret_seconds = secret_seconds
        self._secrets: dict[SecretKey, _SecretData] = {}
        self._allowed: dict[PoolRef, tuple[SecretKey, float]] = {}  # each pool's last granted read, and when
        self._uses: dict[PoolRef, Use] = {}  # what each pool's client was made from
        self._pending: dict[PoolRef, int] = {}  # operations in progress, per pool
        self._gone: set[PoolRef] = set()  # pools forgotten during an operation of theirs: it keeps no client
        self._client_of: dict[Use, str] = {}  # fingerprints of the current clients
        self._clients: dict[str, NetboxClient] = {}
        self._limits: dict[str, asyncio.Semaphore] = {}
        self._ca_dir: str | None = None
        self._ca_files: dict[NetboxClient, str] = {}
        self._loans: dict[NetboxClient, int] = {}  # operations in progress, per client
        self._retired: set[NetboxClient] = set()  # replaced clients still lent out
        self._closing: dict[asyncio.Task[None], NetboxClient] = {}

    @contextlib.asynccontextmanager
    async def use(self, pool: Pool) -> AsyncIterator[NetboxClient]:
        """The client for `pool`, lent for the duration of the `async with` block (see the module contract)."""
        self._pending[pool.ref] = self._pending.get(pool.ref, 0) + 1
        try:
            client = await self.client(pool)
            self._loans[client] = self._loans.get(client, 0) + 1
            if pool.ref in self._gone:  # forgotten while its Secret was read: lent only
                self.forget(pool.ref)
            try:
                yield client
            finally:
                self._return(client)
        finally:
            self._pending[pool.ref] -= 1
            if not self._pending[pool.ref]:
                del self._pending[pool.ref]
                self._gone.discard(pool.ref)

    def _return(self, client: NetboxClient) -> None:
        """One loan of `client` ends; a retired client is closed after its last."""
        self._loans[client] -= 1
        if not self._loans[client]:
            del self._loans[client]
            if client in self._retired:
                self._retire(client)

    async def client(self, pool: Pool) -> NetboxClient:
        """The client for `pool`'s Secret; raises PoolUnusableError when the Secret is missing, unusable or not the
        pool's to read."""
        key = (pool.secret_namespace, pool.secret_name)
        data = self._secrets.get(key)
        if data is None or not self._trusted(pool.ref, key, data):
            try:
                data = self._secrets[key] = await self._read(pool)
            except PoolUnusableError as problem:
                self._unusable(pool, key, problem)
                raise
            self._allowed[pool.ref] = (key, data.read_at)
        fingerprint = _fingerprint(data, pool.insecure_skip_verify)
        use = (*key, pool.insecure_skip_verify)
        client = self._clients.get(fingerprint)
        if client is None:
            client = self._clients[fingerprint] = self._new_client(data, pool.insecure_skip_verify, fingerprint)
        if self._client_of.get(use) != fingerprint or self._uses.get(pool.ref) != use:
            previous = self._client_of.get(use)
            if previous is not None and previous != fingerprint:
                log.info("netbox connection replaced", secret=f"{key[0]}/{key[1]}", url=client.endpoint.display_url)
            self._client_of[use], self._uses[pool.ref] = fingerprint, use
            self._prune()
        return client

    def _trusted(self, pool_ref: PoolRef, key: SecretKey, data: _SecretData) -> bool:
        """Whether `data`, of Secret `key`, and the pool's right to read it are both at most `secret_seconds` old."""
        now, allowed = time.monotonic(), self._allowed.get(pool_ref)
        fresh = now - data.read_at <= self.secret_seconds
        return fresh and allowed is not None and allowed[0] == key and now - allowed[1] <= self.secret_seconds

    def invalidate(self, pool: Pool) -> None:
        """Read the pool's Secret again on next use."""
        self._secrets.pop((pool.secret_namespace, pool.secret_name), None)

    def forget(self, pool_ref: PoolRef) -> None:
        """The pool is gone: what only it used is retired (see the module contract), and until it is `seen` again
        its operations in progress keep no client (one is only lent to them)."""
        if pool_ref in self._pending:
            self._gone.add(pool_ref)
        self._allowed.pop(pool_ref, None)
        if self._uses.pop(pool_ref, None) is not None:
            self._prune()

    def seen(self, pool_ref: PoolRef) -> None:
        """The pool exists (again): its client is kept from its next use on."""
        self._gone.discard(pool_ref)

    def _unusable(self, pool: Pool, key: SecretKey, problem: PoolUnusableError) -> None:
        """The pool cannot use its Secret: it gives up its client; when the Secret itself is gone or unusable (not
        just refused to this pool), every client made from it is retired."""
        self._allowed.pop(pool.ref, None)
        self._uses.pop(pool.ref, None)
        if problem.reason != reasons.SECRET_NOT_ALLOWED:
            self._secrets.pop(key, None)
            self._client_of = {use: f for use, f in self._client_of.items() if use[:2] != key}
        self._prune()

    def _prune(self) -> None:
        """Forget the Secret uses no pool has, the Secrets no use names, and retire the clients no use maps to."""
        used = set(self._uses.values())
        self._client_of = {use: f for use, f in self._client_of.items() if use in used}
        self._secrets = {key: d for key, d in self._secrets.items() if key in {use[:2] for use in used}}
        current = set(self._client_of.values())
        for fingerprint in [f for f in self._clients if f not in current]:
            self._retire(self._clients.pop(fingerprint))

    def _retire(self, client: NetboxClient) -> None:
        """Close `client` now if nothing borrows it, else when its last loan ends (in the background)."""
        if client in self._loans:
            self._retired.add(client)
            return
        self._retired.discard(client)
        task = asyncio.get_running_loop().create_task(self._close(client))
        self._closing[task] = client
        task.add_done_callback(self._closed)

    async def _close(self, client: NetboxClient) -> None:
        await client.close()
        path = self._ca_files.pop(client, None)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _closed(self, task: asyncio.Task[None]) -> None:
        """A retired client is closed: the semaphore of a URL no client has any more goes too."""
        self._closing.pop(task, None)
        alive = (*self._clients.values(), *self._retired, *self._loans, *self._closing.values())
        urls = {client.endpoint.url for client in alive}
        self._limits = {url: limit for url, limit in self._limits.items() if url in urls}

    async def _read(self, pool: Pool) -> _SecretData:
        where = f"Secret {pool.secret_namespace}/{pool.secret_name} ({SECRET_REF_FIELD})"
        referrer = Referrer(pool.ref.kind, pool.ref.name, pool.ref.namespace)
        try:
            secret = await read_secret(self.kube, referrer, SECRET_REF_FIELD, pool.secret_name, pool.secret_namespace)
        except AccessDenied as denied:
            raise PoolUnusableError(reasons.SECRET_NOT_ALLOWED, f"{pool.ref}: {denied}") from denied
        except ApiError as error:
            raise PoolUnusableError(
                reasons.SECRET_NOT_FOUND,
                f"{where} cannot be read ({error.status} {error.reason}); the controller needs `get` on it",
            ) from error
        if secret is None:
            raise PoolUnusableError(
                reasons.SECRET_NOT_FOUND,
                f"{where} does not exist; create it with keys `url` and `token` (and optionally `caBundle`)",
            )
        return _secret_data(where, {**_decoded(secret.get("data") or {}), **(secret.get("stringData") or {})})

    def _new_client(self, data: _SecretData, insecure: bool, fingerprint: str) -> NetboxClient:
        verify: bool | str = not insecure
        if not insecure and data.ca_bundle is not None:
            if self._ca_dir is None:
                self._ca_dir = tempfile.mkdtemp(prefix="netbox-ca-")
            path = os.path.join(self._ca_dir, f"{fingerprint[:16]}.pem")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
                handle.write(data.ca_bundle)
            verify = path
        limit = self._limits.setdefault(data.url, asyncio.Semaphore(self.settings.workers))
        client = NetboxClient(Endpoint(data.url, data.token, verify), self.settings, limit)
        if isinstance(verify, str):
            self._ca_files[client] = verify
        return client

    async def close(self) -> None:
        """Close every client, lent or not (the backend is shutting down)."""
        clients = {*self._clients.values(), *self._retired}
        self._clients, self._retired = {}, set()
        self._client_of.clear()
        self._uses.clear()
        self._allowed.clear()
        self._secrets.clear()
        for client in clients:
            await client.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        if self._ca_dir is not None:
            shutil.rmtree(self._ca_dir, ignore_errors=True)
            self._ca_dir = None
        self._ca_files.clear()


def _secret_data(where: str, data: dict[str, str]) -> _SecretData:
    """The connection a Secret's decoded `data` describes; PoolUnusableError (InvalidSecret) if it is unusable."""
    url = data.get("url", "").strip().rstrip("/").removesuffix("/api")
    token = data.get("token", "").strip()
    if len(url) > URL_LENGTH or len(token) > TOKEN_LENGTH:
        raise PoolUnusableError(
            reasons.INVALID_SECRET,
            f"{where}: key `url` may have at most {URL_LENGTH} characters and key `token` at most {TOKEN_LENGTH}",
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PoolUnusableError(reasons.INVALID_SECRET, f"{where}: key `url` must be an http(s) URL of NetBox")
    if not token:
        raise PoolUnusableError(reasons.INVALID_SECRET, f"{where}: key `token` is missing or empty")
    ca = data.get("caBundle") or None
    return _SecretData(url, token, None if ca is None else _certificates(where, ca), time.monotonic())


def _certificates(where: str, ca: str) -> str:
    """The PEM certificates of a `caBundle`, re-encoded; PoolUnusableError (InvalidSecret) unless it holds only
    PEM certificates, at least one, in at most CA_BUNDLE_BYTES."""
    raw = ca.encode()
    if len(raw) > CA_BUNDLE_BYTES:
        raise PoolUnusableError(
            reasons.INVALID_SECRET,
            f"{where}: key `caBundle` has {len(raw)} bytes; at most {CA_BUNDLE_BYTES} (64 KiB) of PEM certificates "
            "are read: keep only the CA certificates that sign NetBox's certificate",
        )
    try:
        certificates = x509.load_pem_x509_certificates(raw)
    except ValueError as error:
        raise PoolUnusableError(
            reasons.INVALID_SECRET,
            f"{where}: key `caBundle` must hold PEM certificates (-----BEGIN CERTIFICATE----- blocks), and one of "
            "them does not parse",
        ) from error
    return "".join(certificate.public_bytes(Encoding.PEM).decode() for certificate in certificates)


def _decoded(data: dict[str, str]) -> dict[str, str]:
    result = {}
    for key, value in data.items():
        with contextlib.suppress(binascii.Error, UnicodeDecodeError):  # an undecodable value is left out
            result[key] = base64.b64decode(value).decode("utf-8")
    return result


def _fingerprint(data: _SecretData, insecure: bool) -> str:
    parts = (data.url, data.token, data.ca_bundle or "", "insecure" if insecure else "verify")
    return hashlib.sha256("".join(f"{part}\0" for part in parts).encode()).hexdigest()
