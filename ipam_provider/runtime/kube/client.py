"""A small typed facade over kubernetes-asyncio's ApiClient for JSON objects of any resource.

Objects are plain JSON dicts as the API server sends them (decoded whatever their depth: `bounds.loads`); callers
parse them into pydantic models where they need types. Non-2xx answers raise `ApiError` carrying the Status
reason. Every request carries the controller's User-Agent, every write (create, replace, patch) its field manager
unless the caller names another (`ipam_provider/runtime/user_agent.py`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.helpers
import orjson
import structlog
import yarl
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config import incluster_config

from ipam_provider.runtime.kube.bounds import loads
from ipam_provider.runtime.kube.errors import ApiError, KubeconfigError
from ipam_provider.runtime.kube.resources import Object, Resource
from ipam_provider.runtime.telemetry.clients import host_label, observe_rest_request
from ipam_provider.runtime.user_agent import FIELD_MANAGER, user_agent

Page = tuple[list[Object], str]  # a page of a list, and the list's resourceVersion
log = structlog.get_logger(__name__)
TOKEN_CHECK_SECONDS = 1.0
"""How often the service account's token file is looked at (a stat per look; one per request would cost ~13 µs)."""
WATCH_EVENT_BYTES = 64 * 1024 * 1024
"""The longest watch event read (aiohttp's default, 128 KiB, is less than one object may take: annotations alone
may hold 256 KiB). An object of the API server's default limit (etcd's 1.5 MiB) takes well under this in JSON."""


@dataclass(frozen=True)
class PatchForm:
    """How the API server reads a PATCH: its content type and, for a server-side apply, the field manager
    (default: the controller's) and whether it takes over conflicting fields (`force`)."""

    content_type: str = "application/merge-patch+json"
    field_manager: str | None = None
    force: bool = False


MERGE_PATCH = PatchForm()
JSON_PATCH = PatchForm("application/json-patch+json")


def apply_patch(field_manager: str | None = None, *, force: bool = False) -> PatchForm:
    """A server-side apply by `field_manager`."""
    return PatchForm("application/apply-patch+yaml", field_manager, force)


def _kubeconfig_files(path: str | None) -> list[str]:
    """The kubeconfig files to load: `path` (which must exist), else those of KUBECONFIG or ~/.kube/config that
    exist; none means the in-cluster service account."""
    if path is not None:
        if not os.path.isfile(path):
            raise KubeconfigError(f"cannot load the kubeconfig {path} (--kubeconfig): no such file")
        return [path]
    listed = [file for file in os.environ.get("KUBECONFIG", "").split(os.pathsep) if file]
    return [file for file in listed or [os.path.expanduser("~/.kube/config")] if os.path.isfile(file)]


class TokenFile:
    """The service account's token file, as a Configuration's `refresh_api_key_hook`: before a request it looks at
    the file (a stat, which follows the kubelet's `..data` symlink to the file behind it), at most once per
    `check_seconds`, and reads it again when it changed, so a token the kubelet projects anew is sent within
    `check_seconds` (the kubelet rotates minutes before expiry). When the file cannot be read the last token read is
    kept, and the file is tried again at the next look."""

    def __init__(self, path: str, check_seconds: float) -> None:
        self.path = path
        self.check_seconds = check_seconds
        self._seen: tuple[int, int, int, int] | None = None
        self._looked_at = -math.inf
        self._failing = False

    def __call__(self, configuration: client.Configuration, *_: object) -> None:
        now = time.monotonic()
        if now - self._looked_at < self.check_seconds:
            return
        self._looked_at = now
        try:
            stat = os.stat(self.path)
            seen = (stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if seen == self._seen:
                return
            with open(self.path, encoding="utf-8") as file:
                token = file.read().strip()
        except OSError as error:
            if not self._failing:  # once until it can be read again
                log.warning(
                    "cannot read the service account token, keeping the last one", path=self.path, error=str(error)
                )
            self._failing = True
            return
        self._failing = False
        if token:
            configuration.api_key["BearerToken"] = f"Bearer {token}"
            self._seen = seen


def _load_incluster(configuration: client.Configuration) -> None:
    """The in-cluster service account into `configuration` (kubernetes-asyncio's loader), its token re-read from
    the file whenever the file changes (`TokenFile`). Raises config.ConfigException outside a pod."""
    token_path = incluster_config.SERVICE_TOKEN_FILENAME
    loader = incluster_config.InClusterConfigLoader(
        token_filename=token_path, cert_filename=incluster_config.SERVICE_CERT_FILENAME, try_refresh_token=False
    )
    loader.load_and_set(configuration)
    configuration.refresh_api_key_hook = TokenFile(token_path, TOKEN_CHECK_SECONDS)


def _reason(error: BaseException) -> str:
    """The kubeconfig loader's complaint on one line, without the loader's preamble."""
    text = " ".join(str(error).split())
    if not text or isinstance(error, (TypeError, AttributeError, KeyError)):
        return "not a kubeconfig (no clusters, contexts and users in it)"
    return text.removeprefix("Invalid kube-config file. ")


class KubeClient:
    """Asynchronous access to the API server. One instance is shared by the whole process."""

    def __init__(self, api_client: client.ApiClient, request_timeout: float = 30.0) -> None:
        self._api = api_client
        self._api.user_agent = user_agent("kubernetes-asyncio")
        _without_environment_lookups(api_client)
        self._timeout = request_timeout
        self._host_label = host_label(str(api_client.configuration.host))
        self._base_url = str(api_client.configuration.host)

    @classmethod
    async def from_kubeconfig(cls, path: str | None = None, *, max_connections: int = 64) -> KubeClient:
        """Build a client from a kubeconfig file, or from the in-cluster service account when `path` is None
        and no default kubeconfig exists. Raises KubeconfigError, one line naming what is missing, when neither
        loads."""
        configuration = _configuration()
        files = _kubeconfig_files(path)
        if files:
            try:
                await config.load_kube_config(config_file=path, client_configuration=configuration)
            except Exception as error:  # the loader fails on malformed files with any exception type
                raise KubeconfigError(
                    f"cannot load the kubeconfig {os.pathsep.join(files)}: {_reason(error)}"
                ) from None
        else:
            try:
                _load_incluster(configuration)
            except config.ConfigException:
                raise KubeconfigError(
                    "no kubeconfig: give one with --kubeconfig=<file> or KUBECONFIG, put one at ~/.kube/config, "
                    "or run in a pod with a service account"
                ) from None
        configuration.connection_pool_maxsize = max_connections
        proxy_from_environment(configuration)
        return cls(client.ApiClient(configuration))

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    async def close(self) -> None:
        await self._api.close()

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
        """Send one request on the ApiClient's HTTP session, with its TLS, proxy and credentials.

        kubernetes-asyncio's generic `call_api` is not used: it walks every body and parameter to sanitise it for
        serialisation, which costs more CPU than the rest of a request; our bodies are plain JSON already.
        """
        headers = {**self._api.default_headers, "Accept": "application/json", "Content-Type": content_type}
        for auth in (await self._api.configuration.auth_settings()).values():  # refreshes an expiring token
            headers[auth["key"]] = auth["value"]
        url = self._base_url + path
        query_params = tuple((k, _query_value(v)) for k, v in (query or {}).items() if v is not None)
        if query_params:
            url += "?" + _query_string(query_params)
        rest = self._api.rest_client
        options: dict[str, Any] = {"proxy": rest.proxy, "proxy_headers": rest.proxy_headers}
        if rest.server_hostname:
            options["server_hostname"] = rest.server_hostname
        started, status = time.perf_counter(), None
        try:
            response: aiohttp.ClientResponse = await rest.pool_manager.request(
                method,
                url,
                data=orjson.dumps(body) if body is not None else None,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout if timeout is not None else self._timeout),
                **options,
            )
            status = response.status
        finally:
            observe_rest_request(self._host_label, method, status, time.perf_counter() - started)
        if not 200 <= response.status <= 299:
            raw = await response.read()
            response.release()
            raise _api_error(response.status, raw)
        return response

    async def _json(self, method: str, path: str, **kwargs: Any) -> Object:
        response = await self._request(method, path, **kwargs)
        try:
            raw = await response.read()
        finally:
            response.release()
        data: Object = loads(raw) if raw.strip() else {}
        return data

    async def get(self, resource: Resource, name: str, namespace: str | None = None) -> Object | None:
        """The object, or None if it does not exist. Always read from the API server, never a cache."""
        try:
            return await self._json("GET", resource.path(namespace, name))
        except ApiError as error:
            if error.not_found:
                return None
            raise

    async def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Object], str]:
        """Every object (following continue tokens) and the list's resourceVersion. A consistent read."""
        listing = self.list_pages(resource, namespace, label_selector=label_selector, limit=limit)
        pages = [page async for page in listing]
        return [item for items, _ in pages for item in items], pages[-1][1]  # list_pages yields one page at least

    async def list_pages(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        limit: int = 500,
        before_page: Callable[[], Awaitable[None]] | None = None,
    ) -> AsyncGenerator[Page, None]:
        """The list page by page (at most `limit` objects each), each with the list's resourceVersion, so that a
        caller can digest a page before the next one is read. `before_page` is awaited before each page's request
        (to pace them)."""
        token: str | None = None
        while True:
            if before_page is not None:
                await before_page()
            page = await self._json(
                "GET",
                resource.path(namespace),
                query={"labelSelector": label_selector, "limit": limit, "continue": token},
            )
            items = [resource.typed(item) for item in page.get("items", [])]
            meta = page.get("metadata", {})
            yield items, str(meta.get("resourceVersion", ""))
            token = meta.get("continue") or None
            if not token:
                return

    async def create(
        self,
        resource: Resource,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        field_validation: str | None = None,
    ) -> Object:
        """Create an object. `field_validation` is the API server's `fieldValidation` (Strict, as kubectl sends it,
        refuses unknown fields; by default the API server prunes them with a warning)."""
        query = {**_WRITE_QUERY, "fieldValidation": field_validation}
        return await self._json("POST", resource.path(namespace), body=dict(body), query=query)

    async def create_subresource(
        self, resource: Resource, name: str, subresource: str, body: Mapping[str, Any], namespace: str | None = None
    ) -> Object:
        """POST to an object's subresource, e.g. a ServiceAccount's `token` (a TokenRequest)."""
        return await self._json("POST", resource.path(namespace, name, subresource), body=dict(body))

    async def replace(self, resource: Resource, body: Mapping[str, Any], *, subresource: str | None = None) -> Object:
        meta = body["metadata"]
        path = resource.path(meta.get("namespace"), meta["name"], subresource)
        return await self._json("PUT", path, body=dict(body), query=_WRITE_QUERY)

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
        """Patch an object, read as `form` says. A merge patch that carries metadata.resourceVersion fails with 409
        when stale."""
        return await self._json(
            "PATCH",
            resource.path(namespace, name, subresource),
            body=patch,
            content_type=form.content_type,
            query={"fieldManager": form.field_manager or FIELD_MANAGER, "force": True if form.force else None},
        )

    async def delete(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> bool:
        """Delete an object; False if it was already gone. `uid`/`resource_version` become preconditions."""
        preconditions = {k: v for k, v in {"uid": uid, "resourceVersion": resource_version}.items() if v}
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if preconditions:
            body["preconditions"] = preconditions  # type: ignore[assignment]
        try:
            await self._json("DELETE", resource.path(namespace, name), body=body)
        except ApiError as error:
            if error.not_found:
                return False
            raise
        return True

    async def watch(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[tuple[str, Object]]:
        """Yield (type, object) events from `resource_version` on, bookmarks included, until the server ends
        the watch. An expired resourceVersion raises ApiError with status 410."""
        response = await self._request(
            "GET",
            resource.path(namespace),
            query={
                "watch": "true",
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "labelSelector": label_selector,
                "timeoutSeconds": timeout_seconds,
            },
            timeout=timeout_seconds + 30,
        )
        try:
            while line := await response.content.readline(max_line_length=WATCH_EVENT_BYTES):
                if not line.strip():
                    continue
                event = loads(line)
                kind, obj = event.get("type", ""), event.get("object", {})
                if kind == "ERROR":
                    raise ApiError(int(obj.get("code", 500)), obj.get("reason", ""), obj.get("message", ""), obj)
                yield kind, obj
        finally:
            response.release()


_WRITE_QUERY = {"fieldManager": FIELD_MANAGER}


def proxy_from_environment(configuration: client.Configuration) -> None:
    """Take the API server's proxy from the environment (HTTPS_PROXY, HTTP_PROXY, NO_PROXY, as client-go does), once,
    unless the kubeconfig names one."""
    if configuration.proxy:
        return
    try:
        proxy, auth = aiohttp.helpers.get_env_proxy_for_url(yarl.URL(str(configuration.host)))
    except LookupError:  # none set, or NO_PROXY covers the host
        return
    configuration.proxy = str(proxy)
    if auth is not None:
        configuration.proxy_headers = {"Proxy-Authorization": auth.encode()}


def _without_environment_lookups(api_client: client.ApiClient) -> None:
    """kubernetes-asyncio opens its aiohttp session with `trust_env=True`, under which every request looks up
    ~/.netrc and the proxy environment in worker threads: two thread hops per request, and the GIL contention that
    comes with them. The proxy is taken once instead (`proxy_from_environment`); the session looks no more."""
    api_client.rest_client.pool_manager._trust_env = False


def _configuration() -> client.Configuration:
    """A new Configuration, leaving the process's log levels as they were (its constructor sets the `urllib3`
    and `client` loggers to WARNING)."""
    loggers = [logging.getLogger(name) for name in ("client", "urllib3")]
    levels = [logger.level for logger in loggers]
    configuration = client.Configuration()
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)
    return configuration


_ONE_OFF_PARAMETERS = frozenset({"labelSelector", "continue", "resourceVersion"})
"""Query parameters whose values are seldom sent twice (a selector may name one object, a continue token or a watch's
resourceVersion is used once): queries with them are not cached."""


def _query_string(params: tuple[tuple[str, str], ...]) -> str:
    """The query string of `params`: from a cache for the few that most requests repeat (every write names our field
    manager), encoded anew for one-off ones, which would only churn the cache."""
    if any(key in _ONE_OFF_PARAMETERS for key, _ in params):
        return urllib.parse.urlencode(params)
    return _encoded_query(params)


@functools.lru_cache(maxsize=256)
def _encoded_query(params: tuple[tuple[str, str], ...]) -> str:
    return urllib.parse.urlencode(params)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _api_error(status: int, raw: bytes) -> ApiError:
    try:
        body = orjson.loads(raw)
    except ValueError:
        return ApiError(status, "", raw.decode("utf-8", "replace")[:500])
    if not isinstance(body, dict):
        return ApiError(status, "", str(body)[:500], body)
    return ApiError(status, str(body.get("reason", "")), str(body.get("message", "")), body)
