"""List-then-watch one resource into a Store, and report every change.

For each watched namespace (or all of them) the informer lists, then watches from the list's
resourceVersion with bookmarks. When the server ends a watch it resumes from the last seen version; on 410 Gone
it lists again and reports the difference; on any other error it backs off (capped exponential) and lists again.
A handler that raises is logged and skipped: it never interrupts the watch; so is an object that cannot be keyed,
projected or stored (the others are served), and any other failure of a list or watch is retried. A resource the
API server does not serve (its CRD is not installed) counts as synced and empty, so that one missing kind does not
stop the controller; it is looked for again every NOT_SERVED_RETRY seconds.

While the handler is called for the objects of a scope's first list, `in_initial_list()` is True (as
controller-runtime's `IsInInitialList`), so that handlers can give work for objects that were merely found a
lower priority than work for live changes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from contextvars import ContextVar

import aiohttp
import structlog

from ipam_provider.runtime.cache.store import Key, Store, object_key, resource_version
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Object, Resource

EventHandler = Callable[[str, Object | None, Object | None], None]
log = structlog.get_logger(__name__)
NOT_SERVED_RETRY = 30.0
_INITIAL_LIST: ContextVar[bool] = ContextVar("initial_list", default=False)


def in_initial_list() -> bool:
    """Whether the handler now running was called for an object of its informer's first list."""
    return _INITIAL_LIST.get()


WATCH_TIMEOUT = 300  # seconds a watch asks to be kept open before it is made again


class Informer:
    """Keeps `store` in step with the API server and calls `handler(type, old, new)` for every change."""

    def __init__(
        self,
        kube: KubeClient,
        resource: Resource,
        store: Store,
        handler: EventHandler,
        *,
        namespaces: Sequence[str] | None = None,
        label_selector: str | None = None,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.store = store
        self.handler = handler
        self.scopes: list[str | None] = list(namespaces) if namespaces and resource.namespaced else [None]
        self.label_selector = label_selector
        self._synced = [asyncio.Event() for _ in self.scopes]

    async def wait_synced(self) -> None:
        await asyncio.gather(*(event.wait() for event in self._synced))

    @property
    def synced(self) -> bool:
        return all(event.is_set() for event in self._synced)

    def replay(self) -> None:
        """Report every stored object as ADDED, with `in_initial_list()` True, as a first list does: for a handler
        that begins to act after the store filled (controller-runtime replays the cache to a handler added late)."""
        token = _INITIAL_LIST.set(True)
        try:
            for key in list(self.store.keys()):
                obj = self.store.get(*key)
                if obj is not None:
                    self._notify("ADDED", None, obj)
        finally:
            _INITIAL_LIST.reset(token)

    async def run(self) -> None:
        await asyncio.gather(
            *(self._run_scope(scope, synced) for scope, synced in zip(self.scopes, self._synced, strict=True))
        )

    async def _run_scope(self, namespace: str | None, synced: asyncio.Event) -> None:
        failures = 0
        bound = log.bind(resource=self.resource.plural, namespace=namespace or "*")
        warned_not_served = False
        while True:
            try:
                version = await self._relist(namespace, initial=not synced.is_set())
                synced.set()
                self.store.synced = self.synced
                failures = 0
                warned_not_served = False
                while True:
                    version = await self._watch(namespace, version)
            except ApiError as error:
                if error.gone:
                    bound.debug("watch expired; listing again")
                    continue
                if error.not_found:
                    if not warned_not_served:
                        bound.warning(f"{self.resource.kind} is not served (CRD not installed?); ignored until it is")
                        warned_not_served = True
                    synced.set()
                    self.store.synced = self.synced
                    await asyncio.sleep(NOT_SERVED_RETRY)
                    continue
                failures += 1
                bound.warning("watch failed", status=error.status, reason=error.reason, error=error.message)
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as error:
                failures += 1
                bound.warning("watch connection failed", error=str(error) or type(error).__name__)
            except Exception as error:  # whatever else a list or a watch raises must not stop the informer
                failures += 1
                bound.error("list or watch failed", error=str(error)[:200], error_type=type(error).__name__)
            delay = min(30.0, 0.2 * 2 ** min(failures, 8)) * (0.5 + random.random() / 2)
            await asyncio.sleep(delay)

    async def _relist(self, namespace: str | None, *, initial: bool = False) -> str:
        """List into the store page by page (a page's objects are projected before the next page is read, so the
        whole list is never held as the API server sent it), then forget what the list no longer has. With
        `initial`, handlers see `in_initial_list()` while the list's objects are applied."""
        seen: set[Key] = set()
        version = ""
        pages = self.kube.list_pages(self.resource, namespace, label_selector=self.label_selector)
        async for items, page_version in pages:
            version = page_version
            token = _INITIAL_LIST.set(initial)
            try:
                for obj in items:
                    self._take("ADDED", obj, seen)
            finally:
                _INITIAL_LIST.reset(token)
        listed_at = int(version) if version.isdigit() else None
        for key in list(self.store.keys()):
            if key not in seen and (namespace is None or key[0] == namespace):
                cached = resource_version(self.store.get(*key) or {})
                if listed_at is not None and cached is not None and cached > listed_at:
                    continue  # written by this controller after the list's snapshot: not gone
                old = self.store.remove(key, watched=True)
                self._notify("DELETED", old, None)
        return version

    async def _watch(self, namespace: str | None, version: str) -> str:
        async for kind, obj in self.kube.watch(
            self.resource,
            namespace,
            resource_version=version,
            label_selector=self.label_selector,
            timeout_seconds=WATCH_TIMEOUT,
        ):
            version = obj.get("metadata", {}).get("resourceVersion", version)
            if kind != "BOOKMARK":
                self._take(kind, obj)
        return version

    def _take(self, kind: str, obj: Object, seen: set[Key] | None = None) -> None:
        """Apply one listed (`seen` collects its key) or watched object; an object that cannot be keyed, projected
        or stored is logged and skipped, never allowed to stop the informer."""
        try:
            key = object_key(obj)
            if seen is not None:
                seen.add(key)  # a listed object that fails below keeps the version cached before, if any
            self.resource.typed(obj)
            if kind == "DELETED":
                old = self.store.remove(key, obj, watched=True)
                self._notify("DELETED", old or obj, None)
            else:
                self._apply(kind, obj)
        except Exception as error:
            log.error(
                "object not cached; skipped",
                resource=self.resource.plural,
                object=name_of(obj),
                change=kind,
                error=str(error)[:200] or type(error).__name__,
                error_type=type(error).__name__,
            )

    def _apply(self, kind: str, obj: Object) -> None:
        """Store `obj` and report the change with the objects as the store keeps them (projected)."""
        key = object_key(obj)
        previous = self.store.get(*key)
        if not self.store.upsert(obj):
            return
        obj = self.store.get(*key) or obj
        if previous is None:
            self._notify("ADDED", None, obj)
        elif previous.get("metadata", {}).get("resourceVersion") != obj["metadata"].get("resourceVersion"):
            self._notify("MODIFIED", previous, obj)

    def _notify(self, kind: str, old: Object | None, new: Object | None) -> None:
        """Call the handler; a failing handler is logged and skipped, never taken for a failed connection (which
        would list again, and fail again, forever). The store is already up to date."""
        try:
            self.handler(kind, old, new)
        except Exception:
            log.exception(
                "event handler failed; event skipped",
                resource=self.resource.plural,
                object=name_of(new or old),
                change=kind,
            )


def name_of(obj: object) -> str:
    """`namespace/name` of an object, as far as it has them (for logs)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return ""
    return f"{meta.get('namespace') or ''}/{meta.get('name', '')}"
