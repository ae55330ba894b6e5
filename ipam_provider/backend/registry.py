"""Backends register per (apiGroup, kind) through the entry-point group `ipam_provider.backends`, each naming a
factory `create_backend(context: BackendContext) -> Backend`; an installed package adds a pool kind by declaring
one. Each backend's name (its metrics' `backend` label) is its entry-point name, else `backend_name`. A backend's
`capabilities()` are asked once, here, when it is registered; the core reads them from `capabilities(backend)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import entry_points

import structlog

from ipam_provider.backend.contract import BackendContext, PoolKind
from ipam_provider.backend.protocol import Backend, Capabilities

ENTRY_POINT_GROUP = "ipam_provider.backends"
BackendFactory = Callable[[BackendContext], Backend]
log = structlog.get_logger(__name__)
NO_CAPABILITIES = Capabilities()


class RegistryError(RuntimeError):
    """Two backends claim the same pool kind, or a factory did not return a Backend."""


class BackendRegistry:
    """The backends of this process, by pool (apiGroup, kind)."""

    def __init__(self, backends: Iterable[Backend] = ()) -> None:
        self._by_kind: dict[tuple[str, str], tuple[Backend, PoolKind]] = {}
        self._names: dict[tuple[str, str], str] = {}
        self._backends: list[Backend] = []
        self._capabilities: dict[int, Capabilities] = {}  # by id() of a registered backend
        for backend in backends:
            self.register(backend)

    def register(self, backend: Backend, name: str | None = None) -> None:
        """Serve the backend's pool kinds; `name` (default: `backend_name`) labels its metrics."""
        if not isinstance(backend, Backend):
            raise RegistryError(f"{backend!r} does not implement the Backend protocol")
        capabilities = backend.capabilities().resolved()
        name = name or backend_name(backend, capabilities)
        for kind in backend.kinds:
            key = (kind.group, kind.kind)
            if key in self._by_kind:
                raise RegistryError(f"pool kind {kind.kind}.{kind.group} is served by two backends")
            self._by_kind[key] = (backend, kind)
            self._names[key] = name
        self._backends.append(backend)
        self._capabilities[id(backend)] = capabilities

    def capabilities(self, backend: Backend) -> Capabilities:
        """The capabilities `backend` declared when it was registered (none for a backend not registered here)."""
        return self._capabilities.get(id(backend), NO_CAPABILITIES)

    def lookup(self, group: str, kind: str) -> tuple[Backend, PoolKind] | None:
        return self._by_kind.get((group, kind))

    def kind_of(self, group: str, kind: str) -> PoolKind | None:
        found = self._by_kind.get((group, kind))
        return found[1] if found is not None else None

    def name_of(self, group: str, kind: str) -> str:
        """The name of the backend serving the pool kind ("" when none does)."""
        return self._names.get((group, kind), "")

    @property
    def kinds(self) -> Sequence[PoolKind]:
        return [kind for _, kind in self._by_kind.values()]

    @property
    def backends(self) -> Sequence[Backend]:
        return list(self._backends)

    async def close(self) -> None:
        for backend in self._backends:
            await backend.close()


def discover_factories(enabled: Iterable[str] | None = None) -> dict[str, BackendFactory]:
    """The backend factories installed in this environment, by entry-point name (optionally only `enabled`)."""
    wanted = set(enabled) if enabled is not None else None
    entries = [entry for entry in entry_points(group=ENTRY_POINT_GROUP) if wanted is None or entry.name in wanted]
    factories: dict[str, BackendFactory] = {entry.name: entry.load() for entry in entries}
    if wanted is not None and wanted - set(factories):
        raise RegistryError(f"unknown backends: {', '.join(sorted(wanted - set(factories)))}")
    return factories


def load_registry(context: BackendContext, enabled: Iterable[str] | None = None) -> BackendRegistry:
    registry = BackendRegistry()
    for name, factory in sorted(discover_factories(enabled).items()):
        backend = factory(context)
        registry.register(backend, name)
        log.info("backend loaded", backend=name, kinds=",".join(k.kind for k in backend.kinds))
    return registry


def backend_name(backend: Backend, capabilities: Capabilities | None = None) -> str:
    """The name of a backend registered without one: its `Capabilities.name` if that is a non-empty string, else the
    last component of its class's module path other than a final `backend` (`backends.netbox.backend` → `netbox`)."""
    name = (capabilities or backend.capabilities()).name
    if isinstance(name, str) and name:
        return name
    parts = type(backend).__module__.split(".")
    if len(parts) > 1 and parts[-1] == "backend":
        parts = parts[:-1]
    return parts[-1]
