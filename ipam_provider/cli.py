"""`ipam-provider run|status`: the controller's command line (its flags: `flags.py`; `status`: `statusview.py`), and
what `run` needs before the controller starts: its endpoints, the management cluster's identity, the leader lease."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence

import structlog
import uvloop
from aiohttp import web

from ipam_provider.admission import PoolAdmission
from ipam_provider.backend.contract import BackendContext
from ipam_provider.backend.registry import load_registry
from ipam_provider.cache import Caches
from ipam_provider.controller import Controller
from ipam_provider.flags import LeaderElection, RunOptions, parse_args
from ipam_provider.lifecycle_hook import hook_calls
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError, KubeconfigError
from ipam_provider.runtime.kube.resources import NAMESPACES
from ipam_provider.runtime.leader import LeaderElector
from ipam_provider.runtime.logconfig import configure_logging
from ipam_provider.runtime.memory import map_large_blocks
from ipam_provider.runtime.serving.certificates import CertificateError, ServingCertificate
from ipam_provider.runtime.serving.endpoint import MetricsEndpoint, Server
from ipam_provider.runtime.serving.guard import Limits
from ipam_provider.runtime.serving.reviews import Reviewer
from ipam_provider.runtime.serving.webhook import WebhookServer
from ipam_provider.statusview import status
from ipam_provider.version import __version__

log = structlog.get_logger(__name__)


class BindError(Exception):
    """An endpoint could not listen on its address (in use, not available, not permitted)."""


class Endpoints:
    """The metrics, probe and webhook endpoints. They are bound before anything talks to the API server, so that an
    address already in use (two controllers on one machine) fails at once, with one line saying which."""

    def __init__(self) -> None:
        self.metrics: MetricsEndpoint | None = None
        self.probes: Server | None = None
        self.webhook: WebhookServer | None = None
        self.ready: Callable[[], bool] = lambda: False  # /readyz without the webhook; the controller replaces it
        self.admission_synced: Callable[[], bool] = lambda: False  # with it: whether the caches it reads synced

    @classmethod
    async def bind(cls, options: RunOptions) -> Endpoints:
        endpoints = cls()
        try:
            metrics = options.metrics_bind
            if metrics is not None:
                served = options.metrics
                cert = ServingCertificate.load(served.cert, served.tls) if served.secure else None
                endpoint = MetricsEndpoint(cert, limits=options.webhook.limits)
                try:
                    await endpoint.start(*metrics)
                except OSError as error:
                    raise _bind_error(options.metrics.address, options.metrics.flag, error) from None
                endpoints.metrics = endpoint
            webhook = options.webhook.bind
            if webhook is not None:
                certificate = ServingCertificate.load(options.webhook.cert, options.metrics.tls)
                server = WebhookServer(certificate, options.webhook.limits)
                try:
                    await server.start(*webhook)
                except OSError as error:
                    raise _bind_error(options.webhook.address, "--webhook-port", error) from None
                endpoints.webhook = server
            probes = options.probes_bind
            if probes is not None:
                endpoints.probes = await endpoints._serve_probes(probes, options.probes_address, options.webhook.limits)
        except BaseException:
            await endpoints.close()
            raise
        if endpoints.metrics is not None:
            endpoints.metrics.log_serving()
        return endpoints

    async def _serve_probes(self, address: tuple[str, int], text: str, limits: Limits) -> Server:
        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            # With the webhook, readiness is the webhook's: serving, from synced caches (which every replica runs,
            # so that a standby stays in the webhook Service; a replica starting joins it once it answers all).
            if self.webhook is not None:
                serving, synced = self.webhook.serving, self.admission_synced()
                ready, why = serving and synced, "webhook not serving" if not serving else "caches not synced"
            else:
                ready, why = self.ready(), "caches not synced"
            return web.Response(text="ok") if ready else web.Response(status=503, text=why)

        app = web.Application()
        app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
        server = Server(None, limits)  # plain HTTP, within the HTTPS servers' limits
        try:
            await server.serve(address[0], address[1], app)
        except OSError as error:
            raise _bind_error(text, "--health-probe-bind-address", error) from None
        return server

    def use_api(self, kube: KubeClient) -> None:
        """Let the secure metrics endpoint review requests through `kube` (it answers 503 until then)."""
        if self.metrics is not None and self.metrics.secure:
            self.metrics.reviewer = Reviewer(kube)

    def use_admission(self, admission: PoolAdmission) -> None:
        """Let the webhook review pool changes through `admission`, and answer the lifecycle hook (it answers 503
        until then)."""
        if self.webhook is not None:
            self.webhook.use(admission.routes(), hook_calls(lambda: admission.registry.kinds))

    async def close(self) -> None:
        if self.webhook is not None:
            webhook, self.webhook = self.webhook, None
            await webhook.close()
        if self.probes is not None:
            await self.probes.close()
            self.probes = None
        if self.metrics is not None:
            metrics, self.metrics = self.metrics, None
            await metrics.close()


def _bind_error(address: str, flag: str, error: OSError) -> BindError:
    # aiohttp rewrites strerror but keeps errno; a name that does not resolve has a negative (getaddrinfo) errno.
    reason = os.strerror(error.errno) if error.errno and error.errno > 0 else str(error)
    return BindError(f"cannot listen on {address} ({flag}): {reason}; choose another address, or 0 to turn it off")


IDENTITY_NAMESPACE = "kube-system"
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0


class ClusterIdentityError(Exception):
    """The management cluster's identity could not be found; the message says what to do."""


async def cluster_identity(kube: KubeClient, override: str = "") -> str:
    """The management cluster's identity (not a secret), stamped by the NetBox and Infoblox backends on what they
    make, so that management clusters sharing one IPAM never release each other's addresses: `override` when not
    blank, else the uid of the kube-system Namespace (one GET). Raises ClusterIdentityError when that Namespace cannot
    be read or has no uid; other API failures propagate. The controller does not serve without it."""
    if override.strip():
        log.info("management cluster identity from --cluster-identity", cluster_identity=override.strip())
        return override.strip()
    try:
        namespace = await kube.get(NAMESPACES, IDENTITY_NAMESPACE)
    except ApiError as error:
        if error.status not in (401, 403):
            raise
        how = "refused" if error.status == 401 else "forbidden"
        raise ClusterIdentityError(
            f"cannot read Namespace {IDENTITY_NAMESPACE} ({how}: HTTP {error.status}), whose uid names this management "
            "cluster on the objects NetBox and Infoblox pools make; grant get on it (config/rbac) or set "
            "--cluster-identity"
        ) from error
    uid = str(((namespace or {}).get("metadata") or {}).get("uid") or "")
    if not uid:
        raise ClusterIdentityError(
            f"Namespace {IDENTITY_NAMESPACE} does not exist, and its uid names this management cluster on the "
            "objects NetBox and Infoblox pools make; set --cluster-identity"
        )
    log.info("management cluster identity", cluster_identity=uid, source=f"Namespace {IDENTITY_NAMESPACE}")
    return uid


async def wait_for_identity(kube: KubeClient, override: str, stopping: asyncio.Event) -> str | None:
    """The identity (see `cluster_identity`), asked for again after each failure; None once `stopping` is set."""
    delay = FIRST_RETRY_SECONDS
    while not stopping.is_set():
        try:
            return await cluster_identity(kube, override)
        except ClusterIdentityError as error:
            log.error(str(error), retry_in=delay)
        except Exception as error:  # the API server cannot be used now: as the informers, try again later
            log.warning("cannot read the management cluster identity; trying again", error=str(error), retry_in=delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), delay)
        delay = min(delay * 2, MAX_RETRY_SECONDS)
    return None


def leader_elector(kube: KubeClient, election: LeaderElection) -> LeaderElector:
    return LeaderElector(
        kube,
        election.namespace,
        election.name,
        lease_seconds=election.lease_duration,
        renew_deadline_seconds=election.renew_deadline,
        retry_seconds=election.retry_period,
    )


async def run(options: RunOptions) -> int:
    if options.not_acted_on:
        log.warning("flags accepted but not acted on", flags=list(options.not_acted_on))
    try:
        kube = await KubeClient.from_kubeconfig(options.kubeconfig)  # before any listener starts
    except KubeconfigError as error:
        log.error(str(error))
        return 2
    try:
        endpoints = await Endpoints.bind(options)
    except (BindError, CertificateError) as error:
        log.error(str(error))
        await kube.close()
        return 1
    try:
        return await _run_controller(options, endpoints, kube)
    finally:
        await endpoints.close()


async def _run_controller(options: RunOptions, endpoints: Endpoints, kube: KubeClient) -> int:
    endpoints.use_api(kube)
    election, settings = options.leader_election, options.controller
    log.info(
        "controller starting",
        version=__version__,
        workers=settings.workers,
        sync_period=settings.sync_period,
        namespaces=",".join(settings.namespaces) or "*",
        leader_elect=election.enabled,
    )
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()  # SIGTERM before the controller exists
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    try:
        identity = await wait_for_identity(kube, options.cluster_identity, stopping)
    except BaseException:
        await kube.close()
        raise
    if identity is None:
        await kube.close()
        return 0
    return await _serve(options, endpoints, kube, identity, stopping)


async def _serve(
    options: RunOptions, endpoints: Endpoints, kube: KubeClient, identity: str, stopping: asyncio.Event
) -> int:
    """Build the caches, the backends reading them and the controller for the cluster `identity`; run it."""
    caches = Caches()
    ctx = BackendContext(
        kube=kube, cached_addresses=caches.cached_addresses, cached_pools=caches.cached_pools, cluster_identity=identity
    )
    registry = load_registry(ctx, options.backends)
    controller = Controller(kube, registry, options.controller, caches)
    controller.start_caches()  # every replica: what admission reads, so that a standby answers from its caches
    endpoints.admission_synced = caches.admission_synced
    admission = PoolAdmission(kube, registry, caches.cached_addresses, caches.cached_pools, caches.admission_synced)
    endpoints.use_admission(admission)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, controller.stop)
    if stopping.is_set():  # SIGTERM came while the backends were being built
        controller.stop()
    # A standby replica waiting for the leader lease is ready (as with controller-runtime), so that a Deployment
    # of several replicas becomes Available and rolls out.
    standby = asyncio.Event()
    endpoints.ready = lambda: controller.synced or standby.is_set()
    election = options.leader_election
    try:
        log.info("backends loaded", kinds=",".join(k.kind for k in registry.kinds), cluster_identity=identity)
        if election.enabled:
            return await lead_and_run(controller, leader_elector(kube, election), standby)
        await controller.run()
    finally:
        await controller.close_caches()
        await registry.close()
        await kube.close()
    return 0


async def lead_and_run(controller: Controller, elector: LeaderElector, standby: asyncio.Event) -> int:
    """Wait for the lease (as a ready standby), then run the controller while holding it.

    Returns the exit code: 0 after `controller.stop()` (SIGTERM), before or after the lease was won, with the
    lease given up; 1 when leadership was lost, as controller-runtime exits non-zero ("leader election lost") so
    that the pod restarts and queues for the lease again.
    """
    standby.set()
    acquire = asyncio.create_task(elector.acquire())
    stopping = asyncio.create_task(controller.wait_stopping())
    await asyncio.wait({acquire, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not acquire.done():
        acquire.cancel()
        return 0
    acquire.result()  # an error that ended the wait is fatal: never run without the lease
    standby.clear()
    keeper = asyncio.create_task(elector.keep())
    keeper.add_done_callback(lambda _: controller.stop())
    try:
        await controller.run()
    finally:
        lost = keeper.done() and not keeper.cancelled()
        keeper.cancel()
        if not lost:
            await elector.release()
    if lost:
        log.error("leader election lost; exiting")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "run":
        options: RunOptions = args.options
        configure_logging(options.log_format, options.log_level, options.library_log_level)
        map_large_blocks()
        try:
            # uvloop's event loop and TLS transport take a tenth less CPU per claim than asyncio's own
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(run(options))
        except Exception:  # a fatal error is one record in the log's format (JSON: a structured traceback)
            log.critical("controller failed", exc_info=True)
            return 1
    configure_logging(level="warning")  # stdout is the view; stderr only says what went wrong
    try:
        return asyncio.run(status(args))
    except KubeconfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
