"""An in-memory API server behind the `KubeClient` interface, for the reconcilers' unit tests.

It serves the calls the core makes (`get`, `list`, `list_pages`, `create`, `patch`, `delete`) with the API
server's semantics for what the reconcilers rely on, and fails like the real client, with `ApiError` carrying a
Status:

- every write takes the next resourceVersion (one counter, as etcd's); a write that changes nothing (a no-op merge
  patch) keeps the object's resourceVersion; `metadata.generation` moves when anything but metadata (and status,
  where status is a subresource) changes;
- `create`: 409 AlreadyExists when the name is taken; uid, resourceVersion, creationTimestamp, generation are set;
- `patch`: JSON merge patches (RFC 7386) only. A patch whose `metadata.resourceVersion` is not the object's fails
  with 409 Conflict; 404 NotFound when there is no object. Resources with a status subresource (every resource but
  those in `NO_STATUS_SUBRESOURCE`) ignore `status` in a patch of the object, and a patch of `subresource="status"`
  changes nothing but `status`. Identity and deletion fields (name, namespace, uid, creationTimestamp,
  deletionTimestamp, generation) are never taken from a patch. A deleting object takes no new finalizer (422);
- `delete`: a `uid`/`resource_version` precondition that does not match fails with 409 Conflict; an object with
  finalizers gets a deletionTimestamp and stays; `False` when there is no object (as the real client answers);
- finalizers: when the last finalizer of a deleting object is removed, the object is gone.

There are no watches, no garbage collector and no admission: `watch` (and anything else that would reach the wire)
raises NotImplementedError. Every request is recorded in `requests` and in `journal` (shared with the fake
backend, so that tests can assert the order of API writes and backend calls). `put`, `stored` and `stored_all` are
the test's own access to the server's state; they are not requests.
"""

from __future__ import annotations

import builtins
import copy
import datetime
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from ipam_provider.runtime.kube.client import MERGE_PATCH, KubeClient, Page, PatchForm
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource

Object = dict[str, Any]
Key = tuple[str, str, str | None, str]  # (group, plural, namespace, name)
NO_STATUS_SUBRESOURCE = frozenset({("ipam.cluster.x-k8s.io", "ipaddresses"), ("", "events"), ("", "secrets")})
IDENTITY_FIELDS = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "generation")


@dataclass(frozen=True)
class Request:
    """One call to the fake API server."""

    verb: str  # get, list, create, patch, delete
    kind: str
    namespace: str | None
    name: str | None
    subresource: str | None = None
    body: Any = None

    def __str__(self) -> str:
        target = f"{self.kind}/{self.subresource}" if self.subresource else self.kind
        return f"{self.verb} {target} {self.name or '*'}"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes a key, anything else (lists too) replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def has_status_subresource(resource: Resource) -> bool:
    return (resource.group, resource.plural) not in NO_STATUS_SUBRESOURCE


def _qualified(resource: Resource) -> str:
    return f"{resource.plural}.{resource.group}" if resource.group else resource.plural


def status_error(code: int, reason: str, message: str, resource: Resource, name: str | None) -> ApiError:
    """An ApiError as the real client raises it, with the Status body the API server sends."""
    details: Object = {"group": resource.group, "kind": resource.plural}
    if name is not None:
        details["name"] = name
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }
    return ApiError(code, reason, message, body)


def not_found(resource: Resource, name: str) -> ApiError:
    return status_error(404, "NotFound", f'{_qualified(resource)} "{name}" not found', resource, name)


def conflict(resource: Resource, name: str, why: str) -> ApiError:
    message = f'Operation cannot be fulfilled on {_qualified(resource)} "{name}": {why}'
    return status_error(409, "Conflict", message, resource, name)


STALE = "the object has been modified; please apply your changes to the latest version and try again"


class FakeKube(KubeClient):
    """An in-memory API server with the KubeClient interface. See the module docstring for its semantics."""

    def __init__(self, journal: builtins.list[str] | None = None) -> None:  # no ApiClient: nothing goes on the wire
        self._objects: dict[Key, Object] = {}
        self._version = 0
        self.requests: builtins.list[Request] = []
        self.journal: builtins.list[str] = journal if journal is not None else []

    # --- the test's own access ------------------------------------------------------------------------------

    def put(self, resource: Resource, obj: Mapping[str, Any]) -> Object:
        """Store `obj` as it is (status and deletionTimestamp included), as if it had been written earlier;
        uid, resourceVersion, creationTimestamp and generation are filled in where missing. Not a request."""
        stored = copy.deepcopy(dict(obj))
        meta = stored.setdefault("metadata", {})
        if not resource.namespaced:
            meta.pop("namespace", None)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = self._next_version()
        stored.setdefault("apiVersion", resource.api_version)
        stored.setdefault("kind", resource.kind)
        self._objects[self._key(resource, meta.get("namespace"), meta["name"])] = stored
        return copy.deepcopy(stored)

    def stored(self, resource: Resource, name: str, namespace: str | None = None) -> Object | None:
        """The object as the server holds it now, or None. Not a request."""
        found = self._objects.get(self._key(resource, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def stored_all(self, resource: Resource, namespace: str | None = None) -> builtins.list[Object]:
        """Every object of `resource` (in `namespace`, or all), in creation order. Not a request."""
        return [copy.deepcopy(obj) for key, obj in self._objects.items() if self._selects(key, resource, namespace)]

    def writes(self) -> builtins.list[Request]:
        """The requests that change something: create, patch, delete."""
        return [r for r in self.requests if r.verb in ("create", "patch", "delete")]

    # --- KubeClient ---------------------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return "fake://"

    async def close(self) -> None:
        return None

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> aiohttp.ClientResponse:
        raise NotImplementedError(f"FakeKube serves get, list, create, patch and delete only, not {method} {path}")

    async def get(self, resource: Resource, name: str, namespace: str | None = None) -> Object | None:
        self._record("get", resource, namespace, name)
        return self.stored(resource, name, namespace)

    async def create(
        self,
        resource: Resource,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        field_validation: str | None = None,
    ) -> Object:
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        namespace = namespace if resource.namespaced else None
        name = meta.get("name")
        self._record("create", resource, namespace, name, body=body)
        if not name:
            raise status_error(422, "Invalid", "metadata.name: Required value: name is required", resource, None)
        if meta.get("namespace") not in (None, namespace):
            message = "the namespace of the provided object does not match the namespace sent on the request"
            raise status_error(400, "BadRequest", message, resource, name)
        key = self._key(resource, namespace, name)
        if key in self._objects:
            message = f'{_qualified(resource)} "{name}" already exists'
            raise status_error(409, "AlreadyExists", message, resource, name)
        if namespace is not None:
            meta["namespace"] = namespace
        meta.pop("deletionTimestamp", None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        meta["resourceVersion"] = self._next_version()
        if has_status_subresource(resource):
            obj.pop("status", None)
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        self._objects[key] = obj
        return copy.deepcopy(obj)

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        form: PatchForm = MERGE_PATCH,
    ) -> Object:
        self._record("patch", resource, namespace, name, subresource, patch)
        if form != MERGE_PATCH:
            raise NotImplementedError(f"FakeKube applies merge patches only, not {form.content_type}")
        key = self._key(resource, namespace, name)
        current = self._objects.get(key)
        if current is None or subresource not in (None, "status"):
            raise not_found(resource, name)
        if subresource == "status" and not has_status_subresource(resource):
            raise not_found(resource, name)
        wanted = ((patch or {}).get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            raise conflict(resource, name, STALE)
        merged: Object = merge_patch(current, patch)
        if subresource == "status":
            updated = copy.deepcopy(current)
            updated.pop("status", None)
            if "status" in merged:
                updated["status"] = merged["status"]
        else:
            updated = copy.deepcopy(merged)  # merge_patch shares what the patch leaves alone with `current`
            if has_status_subresource(resource):
                updated.pop("status", None)
                if "status" in current:
                    updated["status"] = copy.deepcopy(current["status"])
            meta = updated["metadata"]
            for field in IDENTITY_FIELDS:
                meta.pop(field, None)
                if field in current["metadata"]:
                    meta[field] = current["metadata"][field]
        meta = updated["metadata"]
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        if meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(current["metadata"].get("finalizers") or [])
            if added:
                message = (
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers {sorted(added)}"
                )
                raise status_error(422, "Invalid", message, resource, name)
        if updated == current:
            return copy.deepcopy(current)  # a no-op write keeps the resourceVersion
        if self._generation_part(resource, updated) != self._generation_part(resource, current):
            meta["generation"] = int(current["metadata"].get("generation") or 0) + 1
        meta["resourceVersion"] = self._next_version()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self._objects[key]  # its last finalizer is gone: the object is deleted now
        else:
            self._objects[key] = updated
        return copy.deepcopy(updated)

    async def delete(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> bool:
        preconditions = {k: v for k, v in {"uid": uid, "resourceVersion": resource_version}.items() if v}
        self._record("delete", resource, namespace, name, body={"preconditions": preconditions})
        key = self._key(resource, namespace, name)
        current = self._objects.get(key)
        if current is None:
            return False
        meta = current["metadata"]
        if uid and uid != meta["uid"]:
            raise conflict(
                resource, name, f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta['uid']}"
            )
        if resource_version and resource_version != meta["resourceVersion"]:
            why = (
                f"Precondition failed: ResourceVersion in precondition: {resource_version}, "
                f"ResourceVersion in object meta: {meta['resourceVersion']}"
            )
            raise conflict(resource, name, why)
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = now()
                meta["resourceVersion"] = self._next_version()
            return True
        del self._objects[key]
        self._next_version()
        return True

    async def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        limit: int = 500,
    ) -> tuple[builtins.list[Object], str]:
        self._record("list", resource, namespace, None)
        items = [obj for obj in self.stored_all(resource, namespace) if _selected(obj, label_selector)]
        return items, str(self._version)

    async def list_pages(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        limit: int = 500,
        before_page: Callable[[], Awaitable[None]] | None = None,
    ) -> AsyncGenerator[Page, None]:
        """The list as of the first page, `limit` objects a page; each page is one request, `before_page` awaited
        before it."""
        items = [obj for obj in self.stored_all(resource, namespace) if _selected(obj, label_selector)]
        version = str(self._version)
        for start in range(0, max(len(items), 1), limit):
            if before_page is not None:
                await before_page()
            self._record("list", resource, namespace, None)
            yield items[start : start + limit], version

    # --- internals ----------------------------------------------------------------------------------------------

    def _key(self, resource: Resource, namespace: str | None, name: str) -> Key:
        return resource.group, resource.plural, namespace if resource.namespaced else None, name

    @staticmethod
    def _selects(key: Key, resource: Resource, namespace: str | None) -> bool:
        group, plural, key_namespace, _ = key
        in_scope = namespace is None or not resource.namespaced or key_namespace == namespace
        return (group, plural) == (resource.group, resource.plural) and in_scope

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    @staticmethod
    def _generation_part(resource: Resource, obj: Object) -> Object:
        skipped = ("metadata", "status") if has_status_subresource(resource) else ("metadata",)
        return {k: v for k, v in obj.items() if k not in skipped}

    def _record(
        self,
        verb: str,
        resource: Resource,
        namespace: str | None,
        name: str | None,
        subresource: str | None = None,
        body: Any = None,
    ) -> None:
        request = Request(verb, resource.kind, namespace, name, subresource, copy.deepcopy(body))
        self.requests.append(request)
        self.journal.append(str(request))


def _selected(obj: Object, selector: str | None) -> bool:
    """Equality-based label selectors: `a=b`, `a==b`, `a!=b`, `a`, `!a`, joined by commas."""
    if not selector:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in selector.split(","):
        term = term.strip()
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True
