"""The Prometheus `/metrics` endpoint, served by aiohttp in the controller's event loop.

Secure (the default, as Cluster API's diagnostics endpoint): HTTPS, and every request must carry a bearer token
that the API server authenticates (TokenReview) and authorises for `get` on the non-resource URL `/metrics`
(SubjectAccessReview). No or an unknown token is 401, a user without the grant 403, a review the API server could
not make 503 (no answer) or 500 (an error answer); the body says which. Insecure: plain HTTP, no checks.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ipam_provider.runtime.serving.certificates import ServingCertificate
from ipam_provider.runtime.serving.guard import DEFAULT_LIMITS, MAX_BODY, Limits, Listener, track_requests
from ipam_provider.runtime.serving.reviews import Reviewer, ReviewUnavailable

log = structlog.get_logger(__name__)

METRICS_PATH = "/metrics"
CERT_CHECK_SECONDS = 10.0  # how often the certificate files are looked at (a stat of each) for a rotation


class Server:
    """One aiohttp application on one address, within `limits` (guard.py): over HTTPS with `certificate` (its
    files, when it has a directory, are looked at every CERT_CHECK_SECONDS and reloaded on change), else plain
    HTTP."""

    def __init__(self, certificate: ServingCertificate | None, limits: Limits = DEFAULT_LIMITS) -> None:
        self.certificate = certificate
        self.limits = limits
        self.address = ""
        self.port = 0
        self.listener: Listener | None = None
        self._runner: web.AppRunner | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def serve(self, host: str, port: int, app: web.Application) -> None:
        """Serve `app` on host:port (port 0: any free one, then in `port`). Raises OSError when it cannot bind."""
        app.middlewares.append(track_requests)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        context = self.certificate.context if self.certificate is not None else None
        listener = Listener(runner, context, self.limits)
        try:
            await listener.start(host, port)
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self.listener = runner, listener
        self.port = listener.port
        self.address = f"{host}:{self.port}"
        if self.certificate is not None and self.certificate.files.directory:
            self._watcher = asyncio.create_task(watch_certificate(self.certificate))

    async def close(self) -> None:
        watcher, listener, runner = self._watcher, self.listener, self._runner
        self._watcher, self.listener, self._runner = None, None, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if listener is not None:
            await listener.close()
        if runner is not None:
            await runner.cleanup()


class MetricsEndpoint(Server):
    """`/metrics` on one address. `certificate` None serves plain HTTP without authentication; otherwise HTTPS,
    authenticated and authorised through `reviewer`, which the caller sets once it has an API client (until then
    requests are answered 503)."""

    def __init__(
        self,
        certificate: ServingCertificate | None,
        registry: CollectorRegistry = REGISTRY,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        super().__init__(certificate, limits)
        self.reviewer: Reviewer | None = None
        self._registry = registry

    @property
    def secure(self) -> bool:
        return self.certificate is not None

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port. Raises OSError when the address cannot be bound."""
        app = web.Application(client_max_size=MAX_BODY)
        app.add_routes([web.get(METRICS_PATH, self._metrics)])
        await self.serve(host, port, app)

    def log_serving(self) -> None:
        """One line saying where and how the metrics are served (a warning for the self-signed certificate, the
        development one, so that it is noticed in production)."""
        if self.certificate is None:
            log.info("serving the metrics over plain HTTP", address=self.address, path=METRICS_PATH)
            return
        report = log.warning if self.certificate.source == "self-signed" else log.info
        report("serving the metrics over HTTPS", address=self.address, certificate=self.certificate.source)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.secure:
            refused = await self._refusal(request)
            if refused is not None:
                return refused
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = await asyncio.to_thread(encoder, self._registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def _refusal(self, request: web.Request) -> web.Response | None:
        """The answer to a request that may not have the metrics, or None when it may."""
        reviewer = self.reviewer
        if reviewer is None:
            return web.Response(status=503, text="starting: not connected to the API server yet\n")
        token = bearer_token(request.headers.get("Authorization", ""))
        if not token:
            return _unauthorized("no bearer token")
        try:
            user = await reviewer.authenticate(token)
            if user is None:
                return _unauthorized("the token is not valid")
            if await reviewer.authorize(user, request.path, "get"):
                return None
        except ReviewUnavailable as error:
            log.warning("cannot check a metrics request", error=str(error))
            status = 503 if error.unanswered else 500
            return web.Response(status=status, text=f"cannot check the request's credentials: {error}\n")
        log.debug("metrics request forbidden", user=user.name)
        return web.Response(status=403, text=f'Forbidden: user "{user.name}" may not get {request.path}\n')


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (the scheme in any case), else None."""
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _unauthorized(reason: str) -> web.Response:
    return web.Response(
        status=401, text=f"Unauthorized: {reason}\n", headers={"WWW-Authenticate": 'Bearer realm="metrics"'}
    )


async def watch_certificate(certificate: ServingCertificate) -> None:
    """Look at the certificate files every CERT_CHECK_SECONDS, for ever (see `refresh_certificate`)."""
    while True:
        await asyncio.sleep(CERT_CHECK_SECONDS)
        refresh_certificate(certificate)


def refresh_certificate(certificate: ServingCertificate) -> None:
    """One look at the certificate files. Never raises: whatever goes wrong (a full temporary directory, an
    unreadable file) is logged, the current certificate stays in use, and the next look tries again."""
    try:
        certificate.refresh()
    except Exception as error:
        log.error("cannot check the serving certificate files; keeping the current certificate", error=str(error))
