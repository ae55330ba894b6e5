"""From a pool's connection Secret to a `NetboxClient`, cached.

Contract:
- The Secret (keys `url`, `token`, optional `caBundle`) is read by name only (RBAC grants `get`, never `list`) and
  trusted for `secret_seconds`; `invalidate` forgets it at once (after an authentication failure, so that a
  rotated token is picked up on the next call).
- One client per (URL, token, CA bundle, insecureSkipVerify): pools sharing a Secret share threads and connections.
  Every client of one URL shares one semaphore, so the requests in flight to a NetBox stay bounded however many
  Secrets point at it.
- `use(pool)` lends the client for one backend operation. A client whose Secret changed (a rotated token) is
  retired: no new operation gets it, and it is closed once the last operation that borrowed it ends, so a pool
  still working with the old token is never cut off mid-operation. `client(pool)` returns the current client
  without a loan (for inspection; such a client may be closed under its holder).
- A CA bundle is written to a private temporary file (requests verifies against a path) and removed on close.
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

from backends.netbox import reasons
from backends.netbox.client import ClientSettings, Endpoint, NetboxClient, display_url
from backends.netbox.reasons import PoolUnusableError
from backends.netbox.spec import Pool
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import SECRETS

log = structlog.get_logger(__name__)


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
        self._secrets: dict[tuple[str, str], _SecretData] = {}
        self._clients: dict[str, NetboxClient] = {}
        self._client_of: dict[tuple[str, str, bool], str] = {}
        self._limits: dict[str, asyncio.Semaphore] = {}
        self._ca_dir: str | None = None
        self._loans: dict[NetboxClient, int] = {}  # operations in progress, per client
        self._retired: set[NetboxClient] = set()  # replaced clients still lent out
        self._closing: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def use(self, pool: Pool) -> AsyncIterator[NetboxClient]:
        """The client for `pool`, lent for the duration of the `async with` block (see the module contract)."""
        client = await self.client(pool)
        self._loans[client] = self._loans.get(client, 0) + 1
        try:
            yield client
        finally:
            self._loans[client] -= 1
            if not self._loans[client]:
                del self._loans[client]
                if client in self._retired:
                    self._retire(client)

    def _retire(self, client: NetboxClient) -> None:
        """Close `client` now if nothing borrows it, else when its last loan ends (in the background)."""
        if client in self._loans:
            self._retired.add(client)
            return
        self._retired.discard(client)
        task = asyncio.get_running_loop().create_task(client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def client(self, pool: Pool) -> NetboxClient:
        """The client for `pool`'s Secret; raises PoolUnusableError when the Secret is missing or unusable."""
        key = (pool.secret_namespace, pool.secret_name)
        data = self._secrets.get(key)
        if data is None or time.monotonic() - data.read_at > self.secret_seconds:
            data = self._secrets[key] = await self._read(pool)
        fingerprint = _fingerprint(data, pool.insecure_skip_verify)
        use = (*key, pool.insecure_skip_verify)
        previous = self._client_of.get(use)
        client = self._clients.get(fingerprint)
        if client is None:
            client = self._clients[fingerprint] = self._new_client(data, pool.insecure_skip_verify, fingerprint)
        self._client_of[use] = fingerprint
        if previous is not None and previous != fingerprint and previous not in self._client_of.values():
            old = self._clients.pop(previous)  # every fingerprint in _client_of has its client
            log.info("netbox connection replaced", secret=f"{key[0]}/{key[1]}", url=old.endpoint.display_url)
            self._retire(old)
        return client

    def invalidate(self, pool: Pool) -> None:
        """Read the pool's Secret again on next use."""
        self._secrets.pop((pool.secret_namespace, pool.secret_name), None)

    async def _read(self, pool: Pool) -> _SecretData:
        where = f"Secret {pool.secret_namespace}/{pool.secret_name} (spec.connection.secretRef)"
        try:
            secret = await self.kube.get(SECRETS, pool.secret_name, pool.secret_namespace)
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
        data = {**_decoded(secret.get("data") or {}), **(secret.get("stringData") or {})}
        url = data.get("url", "").strip().rstrip("/").removesuffix("/api")
        token = data.get("token", "").strip()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PoolUnusableError(reasons.INVALID_SECRET, f"{where}: key `url` must be an http(s) URL of NetBox")
        if not token:
            raise PoolUnusableError(reasons.INVALID_SECRET, f"{where}: key `token` is missing or empty")
        ca = data.get("caBundle") or None
        if ca is not None and "BEGIN CERTIFICATE" not in ca:
            raise PoolUnusableError(reasons.INVALID_SECRET, f"{where}: key `caBundle` must hold PEM certificates")
        return _SecretData(url, token, ca, time.monotonic())

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
        return NetboxClient(Endpoint(data.url, data.token, verify), self.settings, limit)

    async def close(self) -> None:
        """Close every client, lent or not (the backend is shutting down)."""
        clients = {*self._clients.values(), *self._retired}
        self._clients, self._retired = {}, set()
        self._client_of.clear()
        self._secrets.clear()
        for client in clients:
            await client.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        if self._ca_dir is not None:
            shutil.rmtree(self._ca_dir, ignore_errors=True)
            self._ca_dir = None


def _decoded(data: dict[str, str]) -> dict[str, str]:
    result = {}
    for key, value in data.items():
        with contextlib.suppress(binascii.Error, UnicodeDecodeError):  # an undecodable value is left out
            result[key] = base64.b64decode(value).decode("utf-8")
    return result


def _fingerprint(data: _SecretData, insecure: bool) -> str:
    parts = (data.url, data.token, data.ca_bundle or "", "insecure" if insecure else "verify")
    return hashlib.sha256("".join(f"{part}\0" for part in parts).encode()).hexdigest()
