"""Asynchronous access to one grid through infoblox-client's blocking `Connector`.

Contract:
- Every call runs in the client's own thread pool (`max_workers` = the instance's maxConcurrentRequests); one that
  does not finish within `call_timeout` is abandoned and reported as `Failure.UNKNOWN_OUTCOME`.
- Every failure surfaces as `WapiError` whose `detail` is safe to show: never credentials, nor library exception
  strings (which embed URLs and bodies).
- `search`, `update` and `delete` are retried with backoff on 503 and lost requests; `create` is tried once, since a
  lost POST may have been committed. A search sends one GET per attempt and page (not `Connector.get_object`, which
  re-sends without delay and shares its page cursor); a paged search is retried from its first page, so an answer is
  always complete, awaiting `before_page` before each page. A 401 on a session with a cookie gets one fresh login.
- A call made after `close()` fails with a transient `WapiError`; queued calls still run.
- Every HTTP request is counted and timed in `ipam_provider_backend_requests_total{backend="infoblox"}` under its
  method and WAPI object type, never a reference or a query value.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import requests
import structlog
from infoblox_client import connector as ib_connector
from infoblox_client import exceptions as ib_ex
from requests.adapters import BaseAdapter

from backends.backoff import backoff_delay
from ipam_provider.backend.metrics import observe_request
from ipam_provider.common import Object
from ipam_provider.runtime.user_agent import user_agent

log = structlog.get_logger(__name__)
T = TypeVar("T")
BeforePage = Callable[[], Awaitable[None]]
PAGE_SIZE = 1000
BACKEND = "infoblox"  # the `backend` label of the request metrics: the entry-point name
_WAPI_PATH = re.compile(r"/wapi/v[0-9.]+/([a-z][a-z0-9_:]*)(?:/|$)")


class Failure(enum.Enum):
    AUTH = "AuthenticationFailed"
    TLS = "TLSVerificationFailed"
    UNREACHABLE = "Unreachable"
    UNKNOWN_OUTCOME = "UnknownOutcome"  # the request may or may not have been carried out
    UNAVAILABLE = "GridUnavailable"  # 503: the grid did nothing
    NOT_FOUND = "NotFound"
    EXHAUSTED = "Exhausted"
    TARGET_NOT_FOUND = "TargetNotFound"  # func:nextavailableip names no network/range of the view
    UNKNOWN_EA = "UnknownExtensibleAttribute"
    EA_NOT_ALLOWED = "ExtensibleAttributeNotAllowed"  # the attribute's definition does not allow the object's type
    VIEW_NOT_FOUND = "ViewNotFound"
    CONFLICT = "Conflict"
    REFUSED = "Refused"  # any other error answer


TRANSIENT = frozenset({Failure.UNAVAILABLE, Failure.UNKNOWN_OUTCOME, Failure.UNREACHABLE})


class WapiError(Exception):
    """A failed WAPI call. `detail` is safe to show to people."""

    def __init__(self, failure: Failure, detail: str, status: int | None = None) -> None:
        super().__init__(f"{failure.value}: {detail}")
        self.failure = failure
        self.detail = detail
        self.status = status


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    base_delay: float = 0.25
    max_delay: float = 2.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (0-based), with ±20 % jitter."""
        return backoff_delay(attempt, self.base_delay, self.max_delay)


class WapiClient:
    """One grid, one infoblox-client Connector (thread-safe, shared by the pool's threads)."""

    def __init__(
        self, options: Mapping[str, Any], *, max_workers: int, request_timeout: float, retry: RetryPolicy, label: str
    ) -> None:
        self.label = label
        self.retry = retry
        # A failing GET may cost four HTTP requests (infoblox-client's own retries), each bounded by the timeout.
        self.call_timeout = request_timeout * 4 + 5
        pool = {"http_pool_connections": max_workers, "http_pool_maxsize": max_workers}
        # urllib3's max_retries re-sends only idempotent requests (never a POST)
        settings = {"http_request_timeout": request_timeout, **pool, "max_retries": 1, "paging": False}
        self._connector = ib_connector.Connector({**options, **settings})
        self._connector.session.headers["User-Agent"] = user_agent("infoblox-client")
        for prefix, adapter in list(self._connector.session.adapters.items()):
            self._connector.session.mount(prefix, _ObservedAdapter(adapter))
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"wapi-{label}")
        self._closed = False

    @property
    def longest_call_seconds(self) -> float:
        """An upper bound on how long one retried call (all attempts, all pages of a short search) may take."""
        return self.retry.attempts * (self.call_timeout * 2 + self.retry.max_delay * 1.2)

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            if self._closed:
                raise RuntimeError("closed")
            future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except RuntimeError as error:  # closed, or the executor refuses new work after shutdown
            raise WapiError(Failure.UNAVAILABLE, "the connection to the grid was replaced; try again") from error
        try:
            return await asyncio.wait_for(future, self.call_timeout)
        except TimeoutError as error:
            raise WapiError(Failure.UNKNOWN_OUTCOME, f"no answer within {self.call_timeout:.0f} s") from error
        except Exception as error:
            raise classify(error) from error

    async def _retrying(self, what: str, attempt_once: Callable[[], Awaitable[T]]) -> T:
        for attempt in range(self.retry.attempts):
            try:
                return await attempt_once()
            except WapiError as error:
                if error.failure not in TRANSIENT or attempt + 1 == self.retry.attempts:
                    raise
                delay = self.retry.delay(attempt)
                log.info(
                    "WAPI call failed; retrying",
                    grid=self.label,
                    call=what,
                    failure=error.failure.value,
                    detail=error.detail,
                    retry_in=round(delay, 2),
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _retried(self, what: str, fn: Callable[[], T]) -> T:
        return await self._retrying(what, lambda: self._run(fn))

    async def search(
        self,
        obj_type: str,
        fields: Sequence[str],
        params: Mapping[str, str] | None = None,
        extattrs: Mapping[str, str] | None = None,
        *,
        page_size: int | None = None,
        before_page: BeforePage | None = None,
    ) -> list[Object]:
        """Objects of `obj_type` matching `params` (field filters) and `extattrs` (`*Name=value`); [] if none.
        With a `page_size`, WAPI paging (`page_size` objects a page), awaiting `before_page` before each page."""
        eas = {name: {"value": value} for name, value in (extattrs or {}).items()}
        query: dict[str, Any] = {**(params or {}), "_return_fields": ",".join(fields)}
        if page_size is None:
            answer = await self._retried(f"GET {obj_type}", lambda: self._get(obj_type, query, eas))
            return _objects(answer, obj_type)
        query.update({"_paging": 1, "_return_as_object": 1, "_max_results": page_size})
        return await self._retrying(
            f"GET {obj_type} (paged)", lambda: self._all_pages(obj_type, query, eas, before_page)
        )

    async def _all_pages(
        self, obj_type: str, query: Mapping[str, Any], eas: Mapping[str, Any], before_page: BeforePage | None
    ) -> list[Object]:
        found: list[Object] = []
        page_id: str | None = None
        while True:
            if before_page is not None:
                await before_page()
            page_query = {**query, "_page_id": page_id} if page_id else dict(query)
            try:
                page = await self._run(functools.partial(self._get, obj_type, page_query, eas))
            except WapiError as error:
                if page_id is None or error.failure is not Failure.REFUSED:
                    raise
                # The grid took the same query without a page id: it refused the cursor (expired, or used by a
                # request whose reply was lost and which was sent again). Transient: the search starts over.
                lost = f"the grid lost the search's page cursor ({error.detail})"
                raise WapiError(Failure.UNAVAILABLE, lost) from error
            if not isinstance(page, dict) or not isinstance(page.get("result"), list):
                raise WapiError(Failure.REFUSED, f"the grid answered a paged GET of {obj_type} without a result list")
            found.extend(_objects(page["result"], obj_type))
            page_id = page.get("next_page_id")
            if not page_id:
                return found

    def _get(self, obj_type: str, query: Mapping[str, Any], eas: Mapping[str, Any]) -> Any:
        """One GET (in a worker thread); one fresh login and one re-send if the grid ended the session."""
        connector = self._connector
        url = connector._construct_url(obj_type, dict(query), dict(eas) or None)
        try:
            return connector._get_object(obj_type, url)
        except ib_ex.InfobloxBadWAPICredential:
            if not connector.session.cookies:
                raise
            connector.session.cookies.clear()
            if getattr(connector, "username", None) is not None:
                connector.session.auth = (connector.username, connector.password)
            return connector._get_object(obj_type, url)

    async def create(self, obj_type: str, payload: Mapping[str, Any], fields: Sequence[str]) -> Object:
        """One POST (no retry), answering the new object with `fields`."""
        result = await self._run(
            lambda: self._connector.create_object(obj_type, dict(payload), return_fields=list(fields))
        )
        if not isinstance(result, dict) or "_ref" not in result:
            raise WapiError(Failure.REFUSED, f"the grid answered the POST of a {obj_type} without an object")
        return result

    async def update(self, ref: str, payload: Mapping[str, Any]) -> None:
        """One PUT on an object (idempotent, so retried like a GET)."""
        await self._retried(f"PUT {ref.split('/', 1)[0]}", lambda: self._connector.update_object(ref, dict(payload)))

    async def delete(self, ref: str) -> bool:
        """DELETE one object by reference; False if it was already gone (404)."""
        try:
            await self._retried(f"DELETE {ref.split('/', 1)[0]}", lambda: self._connector.delete_object(ref))
        except WapiError as error:
            if error.failure is Failure.NOT_FOUND:
                return False
            raise
        return True

    async def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=False)
        with contextlib.suppress(Exception):
            self._connector.session.close()


class _ObservedAdapter(BaseAdapter):
    def __init__(self, inner: BaseAdapter) -> None:
        super().__init__()
        self._inner = inner

    def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        with observe_request(BACKEND, request_operation(str(request.method), str(request.url))) as observed:
            response = self._inner.send(request, *args, **kwargs)
            observed.answered(response.status_code)
        return response

    def close(self) -> None:
        self._inner.close()


def request_operation(method: str, url: str) -> str:
    """The metrics name of a WAPI request: `GET network`, `PUT record:host`, or `<method> other` off WAPI paths."""
    found = _WAPI_PATH.match(urlsplit(url).path)
    return f"{method} {found.group(1) if found else 'other'}"


def _objects(answer: Any, obj_type: str) -> list[Object]:
    """The objects of a search answer; anything but a list of objects is the grid misbehaving."""
    if answer is None:
        return []
    if not isinstance(answer, list) or not all(isinstance(item, dict) for item in answer):
        raise WapiError(Failure.REFUSED, f"the grid answered a GET of {obj_type} with something other than objects")
    return answer


_VERIFY = re.compile(r"certificate verify failed: ([^'\"()]+)")
_VIEW_NOT_FOUND = re.compile(r"^(Network )?[Vv]iew .* not found")  # "View  not found": a blank view


def classify(error: BaseException) -> WapiError:
    """Map an infoblox-client / requests failure to a WapiError without leaking its text."""
    if isinstance(error, ib_ex.InfobloxBadWAPICredential | ib_ex.InfobloxGridTemporaryUnavailable):
        return _answer(401 if isinstance(error, ib_ex.InfobloxBadWAPICredential) else 503, None)
    if isinstance(error, ib_ex.InfobloxTimeoutError):
        return WapiError(Failure.UNKNOWN_OUTCOME, "the request timed out; the grid may still have carried it out")
    if isinstance(error, ib_ex.InfobloxConnectionError):
        return _connection_error(error.kwargs.get("reason"))
    if isinstance(error, ib_ex.InfobloxException):
        code = error.kwargs.get("code")
        status = int(code) if isinstance(code, int) or (isinstance(code, str) and code.isdigit()) else None
        return _answer(status, error.response if isinstance(error.response, dict) else None)
    if isinstance(error, requests.RequestException):
        return _connection_error(error)
    return WapiError(Failure.REFUSED, f"unexpected {type(error).__name__} from the WAPI client")


def _connection_error(reason: Any) -> WapiError:
    if isinstance(reason, requests.exceptions.SSLError):
        found = _VERIFY.search(str(reason))
        why = f" ({found.group(1).strip()})" if found else ""
        return WapiError(Failure.TLS, f"the grid's TLS certificate could not be verified{why}")
    if isinstance(reason, requests.HTTPError) and reason.response is not None:
        try:
            body = reason.response.json()
        except ValueError:
            body = None
        return _answer(reason.response.status_code, body if isinstance(body, dict) else None)
    if isinstance(reason, requests.exceptions.ConnectTimeout):
        return WapiError(Failure.UNREACHABLE, "connecting to the grid timed out")
    if isinstance(reason, requests.exceptions.Timeout):
        return WapiError(Failure.UNKNOWN_OUTCOME, "the request timed out; the grid may still have carried it out")
    text = str(reason)
    if "NewConnectionError" in text or "Connection refused" in text or "Name or service not known" in text:
        return WapiError(Failure.UNREACHABLE, "cannot connect to the grid (connection refused or name not resolved)")
    return WapiError(Failure.UNKNOWN_OUTCOME, "the connection was lost before the grid answered")


# The grid's refusal of an attribute whose definition's allowed_object_types excludes the object's type.
_EA_NOT_ALLOWED = re.compile(r"^Extensible attribute '.+' is not allowed for this operation")


def _answer(status: int | None, body: Mapping[str, Any] | None) -> WapiError:
    """An error answer from the grid, by HTTP status and the WAPI error body."""
    code = str((body or {}).get("code", ""))
    text = str((body or {}).get("text", "")) or f"HTTP {status}"
    if status == 401:
        return WapiError(Failure.AUTH, "the grid refused the credentials (HTTP 401)", status)
    if status == 503:
        return WapiError(Failure.UNAVAILABLE, "the grid is temporarily unavailable (HTTP 503)", status)
    if "available IP address" in text and code.startswith("Client.Ibap.Data"):
        return WapiError(Failure.EXHAUSTED, text, status)
    if "does not match any unique networks/ranges" in text:
        return WapiError(Failure.TARGET_NOT_FOUND, text, status)
    if "Unknown extensible attribute" in text:
        return WapiError(Failure.UNKNOWN_EA, text, status)
    if status == 404:
        return WapiError(Failure.VIEW_NOT_FOUND if _VIEW_NOT_FOUND.match(text) else Failure.NOT_FOUND, text, status)
    if code == "Client.Ibap.Data.Conflict":
        return WapiError(Failure.EA_NOT_ALLOWED if _EA_NOT_ALLOWED.match(text) else Failure.CONFLICT, text, status)
    if status is not None and status >= 500:
        return WapiError(Failure.UNAVAILABLE, f"the grid answered HTTP {status}: {text}", status)
    return WapiError(Failure.REFUSED, text, status)
