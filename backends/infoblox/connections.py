"""From an InfobloxInstance to a cached connection to its grid.

Contract:
- `connect(name)` answers the instance's `Connection`, reading the InfobloxInstance and its Secrets (see
  `credentials`) at most once per `instance_cache_seconds`; the connection (its Connector, thread pool and private
  files) is rebuilt when the instance's generation or either Secret's resourceVersion changes. A replaced or
  dropped connection is closed only once every call it may be serving has ended (`Retiring`): after the longest a
  call on it can take (`client.longest_call_seconds`), or at once when the process stops.
- An instance that is missing, or whose spec or Secrets cannot be used, raises `InstanceProblem`; the problem is
  also written to the instance's status (see `status`) when the instance exists.
- A connection carries the state of its grid check (`Health`, decided by `health`): its last result, the lock
  that makes one check at a time, and how many checks in a row the grid refused its credentials.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field

import structlog

from backends.infoblox.client import WapiClient
from backends.infoblox.credentials import InstanceProblem, Material, read_material
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import INSTANCES, InstanceSpec
from backends.infoblox.status import InstanceStatus
from ipam_provider.kube.client import KubeClient

log = structlog.get_logger(__name__)


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


class Connections:
    """The connection to every InfobloxInstance this process talks to."""

    def __init__(self, kube: KubeClient, settings: InfobloxSettings, status: InstanceStatus) -> None:
        self._kube = kube
        self._settings = settings
        self._status = status
        self._connections: dict[str, Connection] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._retiring = Retiring()

    async def connect(self, name: str) -> Connection:
        async with self._locks[name]:
            current = self._connections.get(name)
            if current is not None and time.monotonic() - current.read_at < self._settings.instance_cache_seconds:
                return current
            instance = await self._kube.get(INSTANCES, name)
            if instance is None:
                self._retire(name)
                raise InstanceProblem(
                    "InstanceNotFound", f"InfobloxInstance {name} was not found; create it or fix spec.instanceRef"
                )
            self._status.remember(name, instance)
            try:
                material = await read_material(self._kube, instance)
            except InstanceProblem as problem:
                self._retire(name)
                await self._status.publish(name, False, problem.reason, problem.message)
                raise
            if current is not None and current.key == material.key:
                if material.files is not None:
                    material.files.cleanup()
                current.read_at = time.monotonic()
                return current
            connection = self._connection(name, material)
            self._retire(name)
            self._connections[name] = connection
            log.info(
                "connection to grid built",
                instance=name,
                host=connection.spec.netloc,
                wapi=connection.spec.wapi_version,
            )
            return connection

    def _connection(self, name: str, material: Material) -> Connection:
        spec = material.spec
        client = WapiClient(
            material.options,
            max_workers=spec.max_concurrent_requests,
            request_timeout=spec.request_timeout_seconds,
            retry=self._settings.retry,
            label=name,
        )
        return Connection(name, material.key, spec, client, material.secret, material.files, time.monotonic())

    def _retire(self, name: str) -> None:
        connection = self._connections.pop(name, None)
        if connection is not None:
            self._retiring.retire(connection)

    async def close(self) -> None:
        """Close every connection now, retired ones included (the process is stopping)."""
        for name in list(self._connections):
            self._retire(name)
        await self._retiring.close()


class Retiring:
    """The connections waiting to be closed."""

    def __init__(self) -> None:
        self._closing: dict[asyncio.Task[None], Connection] = {}

    def retire(self, connection: Connection) -> None:
        task = asyncio.get_running_loop().create_task(_close_later(connection))
        self._closing[task] = connection
        task.add_done_callback(lambda done: self._closing.pop(done, None))

    async def close(self) -> None:
        for task, connection in list(self._closing.items()):
            task.cancel()
            await connection.close()


async def _close_later(connection: Connection) -> None:
    await asyncio.sleep(connection.client.longest_call_seconds)
    await connection.close()
