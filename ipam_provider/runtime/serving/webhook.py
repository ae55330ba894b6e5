"""The validating admission webhook server: HTTPS, in the controller's event loop, on every replica.

One POST path per `Route` given to `use`; each takes an
`admission.k8s.io/v1` AdmissionReview and answers one. A body that is not a review (or is JSON nested too deeply to
read) is answered 400 and logged; a review at another `/validate-...` path (a kind whose backend is not loaded,
`--backends`) is allowed.

Every review is answered before the API server gives up: within the `timeout` it sends with the call (`?timeout=5s`,
the configuration's `timeoutSeconds`, at most MAX_TIMEOUT) less a margin, else DEFAULT_TIMEOUT. A check that cannot
finish in time, or fails, is answered as a refusal with code 500 saying why (with `failurePolicy: Fail` the API
server would refuse the change anyway, without the reason). At most CONCURRENT_REVIEWS reviews run at once, and
nothing of a body is read before its review holds a slot: one that gets none (and its body) in time is answered
429. Bodies are bounded as guard.py says (413 over MAX_BODY). Until the controller has its API client (`use`),
reviews are answered 503. The certificate files are looked at every few seconds and reloaded when they change
(cert-manager's renewals).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from aiohttp import hdrs, web
from aiohttp.web import RequestPayloadError

from ipam_provider.runtime.flagforms import go_duration
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Object
from ipam_provider.runtime.serving.certificates import ServingCertificate
from ipam_provider.runtime.serving.endpoint import Server
from ipam_provider.runtime.serving.guard import DEFAULT_LIMITS, MAX_BODY, BodyTooLarge, Limits, read_body, too_large

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT = 10.0  # the API server's own default for timeoutSeconds
MARGIN = 1.0  # answer this much before the API server's timeout
MIN_BUDGET = 0.5
MAX_TIMEOUT = 30.0  # the longest timeoutSeconds the API accepts
CONCURRENT_REVIEWS = 8
# A body over BULKY_BODY (or of unknown length, or compressed) may decode to a tenfold of Python objects (7 MiB of
# `{}` make 150 MiB of dicts): such reviews take one of CONCURRENT_BULKY_REVIEWS slots first, then a common one.
BULKY_BODY = 256 * 1024
CONCURRENT_BULKY_REVIEWS = 1
ADMISSION_API_VERSION = "admission.k8s.io/v1"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
REVIEW = "AdmissionReview"


class MalformedReview(ValueError):
    """The body is not an `admission.k8s.io/v1` AdmissionReview request this webhook can answer."""


@dataclass(frozen=True)
class ReviewRequest:
    """What a review asks: may `operation` turn `old` into `new` for the object `group`/`kind` `name`?"""

    uid: str
    operation: str
    group: str
    kind: str
    namespace: str | None
    name: str
    old: Object | None
    new: Object | None


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    code: int = 200
    reason: str = ""
    message: str = ""
    warnings: tuple[str, ...] = ()  # shown by kubectl as `Warning: ...`, allowed or not


ALLOWED = Verdict(True)


def parse_review(body: Any) -> ReviewRequest:
    """The request of an AdmissionReview; raises MalformedReview saying what is wrong."""
    if not isinstance(body, dict):
        raise MalformedReview("the body is not a JSON object")
    if (body.get("apiVersion"), body.get("kind")) != (ADMISSION_API_VERSION, "AdmissionReview"):
        raise MalformedReview(f"expected an {ADMISSION_API_VERSION} AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("the AdmissionReview has no request")
    uid, operation, kind = request.get("uid"), request.get("operation"), request.get("kind")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("the request has no uid")
    if operation not in OPERATIONS:
        raise MalformedReview(f"unknown operation {operation!r}")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str):
        raise MalformedReview("the request has no kind")
    old, new = request.get("oldObject"), request.get("object")
    for name, obj in (("oldObject", old), ("object", new)):
        if obj is not None and not (isinstance(obj, dict) and isinstance(obj.get("metadata", {}), dict)):
            raise MalformedReview(f"the request's {name} is not an object")
    namespace = request.get("namespace")
    return ReviewRequest(
        uid=uid,
        operation=str(operation),
        group=str(kind.get("group") or ""),
        kind=str(kind["kind"]),
        namespace=namespace if isinstance(namespace, str) and namespace else None,
        name=str(request.get("name") or ""),
        old=old if operation != "CREATE" else None,
        new=new if operation != "DELETE" else None,
    )


def review_response(uid: str, verdict: Verdict) -> Object:
    """The AdmissionReview answering the request `uid`."""
    response: Object = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {
            "status": "Failure",
            "code": verdict.code,
            "reason": verdict.reason,
            "message": verdict.message,
        }
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


@dataclass(frozen=True)
class Route:
    """What answers the reviews of one path: `decide`, logged as `kind=label`. It may raise ApiError,
    aiohttp.ClientError or OSError when it could not list `reads`, what it needs (answered as a 500 refusal)."""

    label: str
    decide: Callable[[ReviewRequest], Awaitable[Verdict]]
    reads: str = "what it needs"


class MalformedCall(ValueError):
    """A call's body is not a request its handler can answer (answered 400 with this message)."""


Call = Callable[[Any], Awaitable[Object]]
"""Answers one call: its JSON body → the JSON body of the answer. Raises MalformedCall for a body it cannot read."""


class WebhookServer(Server):
    """The webhook on one address, over HTTPS with `certificate`, within `limits`; it reviews through the routes set
    by `use`."""

    def __init__(self, certificate: ServingCertificate, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(certificate, limits)
        self._routes: Mapping[str, Route] | None = None
        self._calls: Mapping[str, Call] | None = None
        self._slots = asyncio.Semaphore(CONCURRENT_REVIEWS)
        self._bulky_slots = asyncio.Semaphore(CONCURRENT_BULKY_REVIEWS)
        self._decoder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="webhook-json")

    @property
    def serving(self) -> bool:
        """Listening, and able to review (its API client and backends are set)."""
        return self._runner is not None and self._routes is not None

    def use(self, routes: Mapping[str, Route], calls: Mapping[str, Call] | None = None) -> None:
        """Review through `routes` (path → route), and answer the other paths through `calls`, from now on."""
        self._routes = dict(routes)
        self._calls = dict(calls or {})
        log.info("admission webhook paths", paths=sorted(self._routes), calls=sorted(self._calls))

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port. Raises OSError when the address cannot be bound."""
        app = web.Application(client_max_size=MAX_BODY)
        app.add_routes([web.post("/{path:validate-[^/]+}", self._review), web.post("/{path:.+}", self._call)])
        await self.serve(host, port, app)
        source = self.certificate.source if self.certificate is not None else ""
        report = log.warning if source == "self-signed" else log.info
        report("serving the admission webhook over HTTPS", address=self.address, certificate=source)

    async def close(self) -> None:
        await super().close()
        self._decoder.shutdown(wait=False, cancel_futures=True)

    async def _review(self, request: web.Request) -> web.Response:
        """Nothing of the body is read before the request holds its slots, which it keeps until it is answered;
        a request that cannot get them and its body within the budget is answered 429 (there is no review yet)."""
        started = time.monotonic()
        routes = self._routes
        if routes is None:
            return web.Response(status=503, text="starting: not connected to the API server yet\n")
        budget = max(min(_timeout(request.query.get("timeout")), MAX_TIMEOUT) - MARGIN, MIN_BUDGET)
        deadline = asyncio.get_running_loop().time() + budget
        async with contextlib.AsyncExitStack() as held:
            body = await self._read_json(request, REVIEW, held, deadline, budget)
            if isinstance(body, web.Response):
                return body
            try:
                review = parse_review(body)
            except MalformedReview as error:
                return _malformed(request, REVIEW, error)
            route = routes.get(request.path)
            if route is None:  # a kind of the configuration whose backend is not loaded here (--backends): not ours
                log.warning("admission review for a kind no loaded backend serves; allowed", path=request.path)
                return web.json_response(review_response(review.uid, ALLOWED))
            verdict = await self._decide(route, review, deadline, budget)
        _log_verdict(route, review, verdict, time.monotonic() - started)
        return web.json_response(review_response(review.uid, verdict))

    async def _call(self, request: web.Request) -> web.Response:
        """A call of one of `use`'s `calls` (404 for another path), read and bounded as a review is."""
        calls = self._calls
        if calls is None:
            return web.Response(status=503, text="starting: not connected to the API server yet\n")
        call = calls.get(request.path)
        if call is None:
            return web.Response(status=404, text=f"no handler at {request.path[:200]}\n")
        budget = max(min(_timeout(request.query.get("timeout")), MAX_TIMEOUT) - MARGIN, MIN_BUDGET)
        deadline = asyncio.get_running_loop().time() + budget
        async with contextlib.AsyncExitStack() as held:
            body = await self._read_json(request, "request", held, deadline, budget)
            if isinstance(body, web.Response):
                return body
            try:
                async with asyncio.timeout_at(deadline):
                    return web.json_response(await call(body))
            except MalformedCall as error:
                return _malformed(request, "request", error)
            except TimeoutError:
                return web.Response(status=503, text=f"not answered within {budget:g} s; try again\n")

    async def _read_json(
        self, request: web.Request, what: str, held: contextlib.AsyncExitStack, deadline: float, budget: float
    ) -> Any:
        """The request's JSON body, read once it holds its slots (kept in `held`), or the Response that answers a
        request that cannot be read: 429 (no slot or body within the budget), 413 (too large), 400 (malformed)."""
        try:
            async with asyncio.timeout_at(deadline):
                if _maybe_bulky(request):
                    await held.enter_async_context(self._bulky_slots)
                await held.enter_async_context(self._slots)
                return await self._decode(await read_body(request))
        except TimeoutError:
            return web.Response(status=429, text=f"too many requests: this one was not read within {budget:g} s\n")
        except BodyTooLarge:
            return too_large()
        except (ValueError, UnicodeDecodeError, RecursionError, RequestPayloadError) as error:  # bad gzip too
            return _malformed(request, what, error)

    async def _decode(self, body: bytes) -> Any:
        """The JSON of `body`: a large one in the decoder's one thread, so that the event loop waits at most for one
        decoding at a time (the decoder holds the GIL while it runs)."""
        if len(body) <= BULKY_BODY:
            return json.loads(body)
        return await asyncio.get_running_loop().run_in_executor(self._decoder, json.loads, body)

    async def _decide(self, route: Route, review: ReviewRequest, deadline: float, budget: float) -> Verdict:
        try:
            async with asyncio.timeout_at(deadline):
                return await route.decide(review)
        except TimeoutError:
            message = f"could not check the change within {budget:g} s; try again"
        except (ApiError, aiohttp.ClientError, OSError) as error:
            message = f"could not list {route.reads} to check the change: {error}; try again"
        except Exception as error:  # a backend's bug must not turn into a hung or crashed webhook
            log.error("admission check failed", kind=route.label, name=review.name, exc_info=True)
            message = f"the check failed: {type(error).__name__}: {error}"
        return Verdict(False, 500, "InternalError", message)


def _log_verdict(route: Route, review: ReviewRequest, verdict: Verdict, seconds: float) -> None:
    (log.debug if verdict.allowed else log.info)(  # a refusal is the requester's to fix, not the controller's
        "admission review",
        kind=route.label,
        namespace=review.namespace,
        name=review.name,
        operation=review.operation,
        allowed=verdict.allowed,
        message=verdict.message or None,
        seconds=round(seconds, 3),
    )


def _malformed(request: web.Request, what: str, error: Exception) -> web.Response:
    """The 400 answer to a body that is not `what` (the review's, "AdmissionReview"), logged."""
    event = "malformed admission review" if what == REVIEW else "malformed request"
    log.warning(event, path=request.path[:200], error=str(error) or type(error).__name__)
    return web.Response(status=400, text=f"malformed {what}: {error}\n")


def _maybe_bulky(request: web.Request) -> bool:
    """Whether the body may decode to more than BULKY_BODY bytes (unknown length, or compressed)."""
    length = request.content_length
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
    return length is None or length > BULKY_BODY or encoding != "identity"


def _timeout(text: str | None) -> float:
    """The API server's `timeout` query parameter (Go's duration form) in seconds, else DEFAULT_TIMEOUT."""
    try:
        return go_duration(text or "")  # "" is no duration either
    except (argparse.ArgumentTypeError, ValueError):
        return DEFAULT_TIMEOUT
