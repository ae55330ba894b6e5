"""Asynchronous access to one NetBox through pynetbox, which is synchronous and built on `requests`.

Contract:
- Every call runs `fn(api)` in this client's own thread pool with a pynetbox API object that belongs to the worker
  thread (a `requests.Session` is not documented as thread-safe, so no session is ever shared between threads).
  At most `workers` requests are in flight per NetBox URL: all clients of one URL share an asyncio semaphore.
- Idempotent calls (reads, DELETE, PATCH) are retried with exponential backoff on connection errors, timeouts and
  5xx answers. A non-idempotent call (the allocating POST) is tried exactly once: when it fails without an answer
  or with a 5xx, `OutcomeUnknownError` is raised and the caller resolves it by looking the claim up.
- Every call, retries and the wait for a free slot included, ends within `deadline` seconds. A call that hits it
  is abandoned: a non-idempotent one raises `OutcomeUnknownError` (NetBox may still carry it out), an idempotent
  one `UnreachableError` (transient). Its worker thread keeps its slot of the semaphore until it really ends, so
  abandoned calls never push more requests onto NetBox than `workers`.
- A call on a closed client raises `ClientClosedError` (a NetboxError), never a bare RuntimeError.
- Every failure is a `NetboxError` whose message is safe to show: it names the URL (without any userinfo) and
  NetBox's own `detail`, never the token. pynetbox's exception strings are never passed on.
- Every HTTP request (each attempt) is counted and timed (`observe_request`, backend "netbox", `request_operation`).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pynetbox
import requests
import structlog
import urllib3
from requests.adapters import HTTPAdapter

from backends.backoff import backoff_delay
from ipam_provider.backend.metrics import observe_request
from ipam_provider.runtime.user_agent import user_agent

log = structlog.get_logger(__name__)
T = TypeVar("T")
Api = Any  # pynetbox.api: untyped
BACKEND = "netbox"  # the `backend` label of the request metrics: the entry-point name
_PATH_SEGMENT = re.compile(r"[a-z][a-z0-9_-]*")


@dataclass(frozen=True)
class ClientSettings:
    """Tunables of a NetBox client. The defaults suit production; tests shorten them."""

    workers: int = 4
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    attempts: int = 3
    backoff: float = 0.25
    max_backoff: float = 2.0
    deadline: float = 60.0  # the longest one call may take, all attempts and waits included


@dataclass(frozen=True)
class Endpoint:
    """Where and how to reach one NetBox. `token` never appears in repr, logs or messages."""

    url: str
    token: str = field(repr=False)
    verify: bool | str = True  # True, False (insecureSkipVerify) or the path of a CA bundle file

    @property
    def display_url(self) -> str:
        return display_url(self.url)


def display_url(url: str) -> str:
    """`url` without userinfo, query or fragment: safe to show."""
    parts = urlsplit(url)
    host = f"{parts.hostname or ''}:{parts.port}" if parts.port else parts.hostname or ""
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class NetboxError(Exception):
    """A failed NetBox call. `message` is safe to show to people."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnreachableError(NetboxError):
    """No usable answer: connection refused or reset, timeout, TLS failure, or 5xx after the retries."""

    def __init__(self, message: str, *, tls: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.tls = tls
        self.status = status  # the 5xx status NetBox answered, if it answered


class OutcomeUnknownError(UnreachableError):
    """A non-idempotent request may or may not have been carried out by NetBox."""


class ClientClosedError(NetboxError):
    """The client was closed (its Secret changed, or the backend shut down) before the call could start."""


class HTTPError(NetboxError):
    """NetBox answered with an error status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status

    @property
    def auth(self) -> bool:
        return self.status in (401, 403)

    @property
    def invalid(self) -> bool:
        return self.status == 400


class _Adapter(HTTPAdapter):
    """Gives every request a (connect, read) timeout (pynetbox passes none) and the endpoint's TLS verification
    (which REQUESTS_CA_BUNDLE in the environment would otherwise override), and never retries by itself."""

    def __init__(self, timeout: tuple[float, float], verify: bool | str) -> None:
        super().__init__(pool_connections=1, pool_maxsize=1, max_retries=0)
        self._timeout = timeout
        self._verify = verify

    def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self._timeout
        kwargs["verify"] = self._verify
        with observe_request(BACKEND, request_operation(str(request.method), str(request.url))) as observed:
            response = super().send(request, *args, **kwargs)
            observed.answered(response.status_code)
        return response


def request_operation(method: str, url: str) -> str:
    """The metrics name of a request: the method and the API path below `/api/` without ids or query
    (`GET ipam/prefixes`, `POST ipam/ip-ranges/available-ips`; `GET api` for the API root, `other` off the API)."""
    _, found, below = urlsplit(url).path.partition("/api/")
    if not found:
        return f"{method} other"
    segments = [part for part in below.split("/") if _PATH_SEGMENT.fullmatch(part)][:3]
    return f"{method} {'/'.join(segments) or 'api'}"


@dataclass(frozen=True)
class Ownership:
    """How a NetBox marks what this provider holds: the owner tag's id, and whether NetBox itself refuses a second
    address for one claim UID."""

    owner_tag_id: int
    uid_unique: bool


class NetboxClient:
    """One NetBox endpoint (URL, token, TLS settings): a bounded thread pool with one pynetbox API per thread."""

    def __init__(
        self, endpoint: Endpoint, settings: ClientSettings | None = None, limit: asyncio.Semaphore | None = None
    ) -> None:
        self.endpoint = endpoint
        self.settings = settings or ClientSettings()
        self._limit = limit or asyncio.Semaphore(self.settings.workers)
        if endpoint.verify is False:  # insecureSkipVerify is reported on the pool's condition instead, once
            host = re.escape(urlsplit(endpoint.url).hostname or "")
            warnings.filterwarnings(
                "ignore", message=f".*host '{host}'", category=urllib3.exceptions.InsecureRequestWarning
            )
        self._executor = ThreadPoolExecutor(max_workers=self.settings.workers, thread_name_prefix="netbox")
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()
        self._requests = itertools.count()
        self.requests_sent = 0  # HTTP answers received; for benchmarks and tests
        self.closed = False
        self.ownership: tuple[float, Ownership] | None = None  # when `Resolver.ownership` last checked, and what

    def _count(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self.requests_sent = next(self._requests) + 1

    def _api(self) -> Api:
        api = getattr(self._local, "api", None)
        if api is None:
            api = pynetbox.api(self.endpoint.url, token=self.endpoint.token)
            session = requests.Session()
            session.verify = self.endpoint.verify
            session.headers["User-Agent"] = user_agent("pynetbox")
            adapter = _Adapter((self.settings.connect_timeout, self.settings.read_timeout), self.endpoint.verify)
            session.mount("https://", adapter)
            session.mount("http://", adapter)
            session.hooks["response"].append(self._count)
            api.http_session = session
            with self._lock:
                self._sessions.append(session)
            self._local.api = api
        return api

    async def call(self, what: str, fn: Callable[[Api], T], *, idempotent: bool = True) -> T:
        """Run `fn(api)` in a worker thread; `what` names the call in messages ("GET prefix 12")."""
        attempts = self.settings.attempts if idempotent else 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.deadline
        for attempt in range(attempts):
            limit = asyncio.timeout_at(deadline)
            try:
                async with limit:
                    return await self._attempt(loop, fn)
            except Exception as error:  # classified below; nothing unclassified leaves this method
                failure = self._classify(what, error, idempotent, overdue=limit.expired())
            delay = backoff_delay(attempt, self.settings.backoff, self.settings.max_backoff)  # ±20 % jitter
            retry = (
                isinstance(failure, UnreachableError)
                and not failure.tls
                and attempt + 1 < attempts
                and loop.time() + delay < deadline
                and not limit.expired()
            )
            if not retry:
                raise failure
            log.debug("netbox call retried", url=self.endpoint.display_url, call=what, error=failure.message)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt(self, loop: asyncio.AbstractEventLoop, fn: Callable[[Api], T]) -> T:
        await self._limit.acquire()
        try:
            future = loop.run_in_executor(self._executor, lambda: fn(self._api()))
        except BaseException:
            self._limit.release()
            raise
        future.add_done_callback(self._finished)
        return await asyncio.shield(future)

    def _finished(self, future: asyncio.Future[Any]) -> None:
        self._limit.release()
        if not future.cancelled():
            future.exception()  # retrieved, so an abandoned call's failure is not reported as never retrieved

    def _classify(self, what: str, error: Exception, idempotent: bool, *, overdue: bool) -> NetboxError:
        """The NetboxError for a failed attempt; `overdue`: it hit the call's deadline."""
        where = f"NetBox at {self.endpoint.display_url}"
        unknown = OutcomeUnknownError if not idempotent else UnreachableError
        if overdue:
            return unknown(f"{what}: {where} did not finish within {self.settings.deadline:g} s")
        if isinstance(error, RuntimeError) and (self.closed or "shutdown" in str(error)):
            return ClientClosedError(
                f"{what}: the connection to {where} was closed (its Secret changed, or the controller is "
                "stopping); try again"
            )
        if isinstance(error, pynetbox.AllocationError):
            return HTTPError(f"{what}: {where} has no free address (409)", 409)
        if isinstance(error, pynetbox.RequestError):
            status = int(error.req.status_code)
            detail = _detail(_body(error.req))
            detail = detail.replace(self.endpoint.token, "***") if self.endpoint.token else detail
            if status >= 500:
                return unknown(f"{what}: {where} answered {status}: {detail}", status=status)
            return HTTPError(f"{what}: {where} answered {status}: {detail}", status)
        if isinstance(error, pynetbox.ContentError):
            return UnreachableError(f"{what}: {where} answered something that is not the NetBox API")
        if isinstance(error, requests.exceptions.SSLError):
            return UnreachableError(
                f"{what}: TLS with {where} failed (certificate not trusted, or not TLS); put the CA in the "
                "Secret's caBundle, or set insecureSkipVerify",
                tls=True,
            )
        if isinstance(error, requests.exceptions.ConnectTimeout):
            return UnreachableError(f"{what}: {where} did not accept a connection within the timeout")
        if isinstance(error, requests.exceptions.Timeout):
            return unknown(f"{what}: {where} did not answer within {self.settings.read_timeout:g} s")
        if isinstance(error, requests.exceptions.ConnectionError):
            return unknown(f"{what}: cannot reach {where}: {_reason(error)}")
        if isinstance(error, requests.exceptions.RequestException):
            return unknown(f"{what}: request to {where} failed: {type(error).__name__}")
        return NetboxError(f"{what}: unexpected failure talking to {where}: {type(error).__name__}")

    async def close(self) -> None:
        """Close every thread's session and stop the threads (waits for calls in flight)."""
        self.closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()


def _body(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        return str(getattr(response, "text", ""))[:300]


def _detail(body: Any) -> str:
    """NetBox's error in one line: `detail`, or the field errors (`field: message; …`)."""
    if isinstance(body, dict):
        if "detail" in body:
            return str(body["detail"])[:300]
        parts = []
        for key, value in body.items():
            text = "; ".join(str(v) for v in value) if isinstance(value, list) else str(value)
            parts.append(text if key in ("__all__", "non_field_errors") else f"{key}: {text}")
        return " | ".join(parts)[:500] or "no details"
    if isinstance(body, list):
        return " | ".join(_detail(item) for item in body)[:500]
    return str(body)[:300] or "no details"


def _reason(error: Exception) -> str:
    """The innermost cause of a connection error, without URLs (they may carry credentials)."""
    text = str(error)
    for marker in ("Connection refused", "Name or service not known", "No route to host", "Connection reset"):
        if marker in text:
            return marker.lower()
    if "RemoteDisconnected" in text or "Connection aborted" in text:
        return "connection closed without an answer"
    return type(error).__name__
