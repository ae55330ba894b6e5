"""The validating admission webhook server: HTTPS, in the controller's event loop, on every replica.

One POST path per served pool kind (`admission.webhook_path`, kubebuilder's form); each takes an
`admission.k8s.io/v1` AdmissionReview and answers one. A body that is not a review (or is JSON nested too deeply to
read) is answered 400 and logged; a review at another `/validate-...` path (a kind whose backend is not loaded,
`--backends`) is allowed.

Every review is answered before the API server gives up: within the `timeout` it sends with the call (`?timeout=5s`,
the configuration's `timeoutSeconds`) less a margin, else DEFAULT_TIMEOUT. A check that cannot finish in time, or
fails, is answered as a refusal with code 500 saying why (with `failurePolicy: Fail` the API server would refuse the
change anyway, without the reason). At most CONCURRENT_REVIEWS reviews run at once. Until the controller has its API
client (`use`), reviews are answered 503. The certificate files are looked at every few seconds and reloaded when
they change (cert-manager's renewals).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
import structlog
from aiohttp import web

from ipam_provider.backend.contract import PoolKind
from ipam_provider.flagforms import go_duration
from ipam_provider.kube.errors import ApiError
from ipam_provider.serving.admission import (
    ALLOWED,
    MalformedReview,
    PoolAdmission,
    ReviewRequest,
    Verdict,
    parse_review,
    review_response,
    webhook_path,
)
from ipam_provider.serving.certificates import ServingCertificate
from ipam_provider.serving.endpoint import stop_serving, watch_certificate

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT = 10.0  # the API server's own default for timeoutSeconds
MARGIN = 1.0  # answer this much before the API server's timeout
MIN_BUDGET = 0.5
CONCURRENT_REVIEWS = 8
MAX_BODY = 16 * 1024 * 1024  # a review carries the object twice; an object is at most ~1.5 MiB in etcd


class WebhookServer:
    """The webhook on one address, with `certificate`; it reviews through `admission`, set by `use`."""

    def __init__(self, certificate: ServingCertificate) -> None:
        self.certificate = certificate
        self.admission: PoolAdmission | None = None
        self._kinds: dict[str, PoolKind] = {}
        self._runner: web.AppRunner | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(CONCURRENT_REVIEWS)
        self.address = ""
        self.port = 0

    @property
    def serving(self) -> bool:
        """Listening, and able to review (its API client and backends are set)."""
        return self._runner is not None and self.admission is not None

    def use(self, admission: PoolAdmission) -> None:
        """Review the kinds of `admission`'s registry through it from now on."""
        self._kinds = {webhook_path(kind): kind for kind in admission.registry.kinds}
        self.admission = admission
        log.info("admission webhook paths", paths=sorted(self._kinds))

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port. Raises OSError when the address cannot be bound."""
        app = web.Application(client_max_size=MAX_BODY)
        app.add_routes([web.post("/{path:validate-[^/]+}", self._review)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, ssl_context=self.certificate.context).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1]) if runner.addresses else port  # the one bound, for port 0
        self.address = f"{host}:{self.port}"
        if self.certificate.files.directory:
            self._watcher = asyncio.create_task(watch_certificate(self.certificate))
        report = log.warning if self.certificate.source == "self-signed" else log.info
        report("serving the admission webhook over HTTPS", address=self.address, certificate=self.certificate.source)

    async def close(self) -> None:
        watcher, runner = self._watcher, self._runner
        self._watcher, self._runner = None, None
        await stop_serving(watcher, runner)

    async def _review(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        kind = self._kinds.get(request.path)
        admission = self.admission
        if admission is None:
            return web.Response(status=503, text="starting: not connected to the API server yet\n")
        try:
            review = parse_review(json.loads(await request.read()))
        except (MalformedReview, ValueError, UnicodeDecodeError, RecursionError) as error:  # nested too deep: JSON
            log.warning("malformed admission review", path=request.path, error=str(error) or type(error).__name__)
            return web.Response(status=400, text=f"malformed AdmissionReview: {error}\n")
        if kind is None:  # a kind of the configuration whose backend is not loaded here (--backends): not ours
            log.warning("admission review for a kind no loaded backend serves; allowed", path=request.path)
            return web.json_response(review_response(review.uid, ALLOWED))
        budget = max(_timeout(request.query.get("timeout")) - MARGIN, MIN_BUDGET)
        verdict = await self._decide(admission, review, kind, budget)
        (log.debug if verdict.allowed else log.info)(  # a refusal is the requester's to fix, not the controller's
            "admission review",
            kind=kind.kind,
            namespace=review.namespace,
            name=review.name,
            operation=review.operation,
            allowed=verdict.allowed,
            message=verdict.message or None,
            seconds=round(time.monotonic() - started, 3),
        )
        return web.json_response(review_response(review.uid, verdict))

    async def _decide(self, admission: PoolAdmission, review: ReviewRequest, kind: PoolKind, budget: float) -> Verdict:
        try:
            async with asyncio.timeout(budget):
                async with self._slots:
                    return await admission.decide(review, kind)
        except TimeoutError:
            message = f"could not check the change within {budget:g} s; try again"
        except (ApiError, aiohttp.ClientError, OSError) as error:
            message = f"could not list the pool's IPAddresses to check the change: {error}; try again"
        except Exception as error:  # a backend's bug must not turn into a hung or crashed webhook
            log.error("admission check failed", kind=kind.kind, name=review.name, exc_info=True)
            message = f"the check failed: {type(error).__name__}: {error}"
        return Verdict(False, 500, "InternalError", message)


def _timeout(text: str | None) -> float:
    """The API server's `timeout` query parameter (Go's duration form) in seconds, else DEFAULT_TIMEOUT."""
    if not text:
        return DEFAULT_TIMEOUT
    try:
        return go_duration(text)
    except (argparse.ArgumentTypeError, ValueError):
        return DEFAULT_TIMEOUT
