"""`ipam-provider run|status`: the controller's command line, with controller-runtime's flag names."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

import structlog
from aiohttp import web
from prometheus_client import start_http_server

from ipam_provider.backend.contract import BackendContext
from ipam_provider.backend.registry import load_registry
from ipam_provider.controller import Controller, ControllerSettings
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.resources import ADDRESSES, CLAIMS
from ipam_provider.leader import LeaderElector
from ipam_provider.logconfig import configure_logging
from ipam_provider.version import __version__

log = structlog.get_logger(__name__)


def _split(values: Sequence[str] | None) -> list[str]:
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]


def _host_port(address: str) -> tuple[str, int] | None:
    """controller-runtime's bind-address form: ":8080", "127.0.0.1:8080", "[::]:8080", "[::1]:8080", or "0" to
    disable. IPv6 hosts come back without their brackets."""
    if address in ("", "0"):
        return None
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"bind address {address!r}: put an IPv6 host in brackets, as in [::]:8080")
    return host or "0.0.0.0", int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ipam-provider", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__, help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the controller")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    run.add_argument("--namespace", action="append", help="watch only this namespace (repeatable or a,b)")
    run.add_argument("--watch-filter", help="only claims labelled cluster.x-k8s.io/watch-filter=<value>")
    run.add_argument("--workers", type=int, default=8, help="concurrent reconciles (one per pool at a time)")
    run.add_argument("--backends", help="entry-point names of the backends to load (default: all installed)")
    run.add_argument("--leader-elect", action="store_true", help="run only while holding the leader lease")
    run.add_argument("--leader-election-namespace", default="capi-ipam-system")
    run.add_argument("--leader-election-id", default="capi-ipam-provider-py")
    run.add_argument("--metrics-bind-address", default=":8080", help='"0" disables the metrics endpoint')
    run.add_argument("--health-probe-bind-address", default=":8081", help='"0" disables /healthz and /readyz')
    run.add_argument("--log-format", choices=["json", "console"], default="console")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    status = commands.add_parser("status", help="show claims with their addresses")
    status.add_argument("--kubeconfig")
    status.add_argument("--namespace", action="append")
    return parser


async def _serve_probes(address: tuple[str, int], controller: Controller, standby: asyncio.Event) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        # A standby replica waiting for the leader lease is ready (as with controller-runtime), so that a
        # Deployment of several replicas becomes Available and rolls out.
        if controller.synced or standby.is_set():
            return web.Response(text="ok")
        return web.Response(status=503, text="caches not synced")

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, address[0], address[1]).start()
    return runner


async def run(args: argparse.Namespace) -> int:
    kube = await KubeClient.from_kubeconfig(args.kubeconfig)
    registry = load_registry(BackendContext(kube=kube), _split([args.backends]) if args.backends else None)
    settings = ControllerSettings(
        namespaces=_split(args.namespace), watch_filter=args.watch_filter, workers=args.workers
    )
    controller = Controller(kube, registry, settings)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, controller.stop)
    metrics_address = _host_port(args.metrics_bind_address)
    if metrics_address is not None:
        start_http_server(metrics_address[1], metrics_address[0])
    probes_address = _host_port(args.health_probe_bind_address)
    standby = asyncio.Event()
    probes = await _serve_probes(probes_address, controller, standby) if probes_address else None
    elector = None
    try:
        log.info(
            "controller starting",
            version=__version__,
            kinds=",".join(k.kind for k in registry.kinds),
            workers=settings.workers,
            namespaces=",".join(settings.namespaces) or "*",
        )
        if args.leader_elect:
            elector = LeaderElector(kube, args.leader_election_namespace, args.leader_election_id)
            return await lead_and_run(controller, elector, standby)
        await controller.run()
    finally:
        if probes is not None:
            await probes.cleanup()
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


async def status(args: argparse.Namespace) -> int:
    kube = await KubeClient.from_kubeconfig(args.kubeconfig)
    try:
        namespaces: list[str | None] = [*_split(args.namespace)] or [None]
        rows = []
        for namespace in namespaces:
            claims, _ = await kube.list(CLAIMS, namespace)
            addresses, _ = await kube.list(ADDRESSES, namespace)
            by_name = {(a["metadata"]["namespace"], a["metadata"]["name"]): a for a in addresses}
            for claim in claims:
                meta, status_ = claim["metadata"], claim.get("status") or {}
                ready: dict[str, str] = next(
                    (c for c in status_.get("conditions") or [] if c.get("type") == "Ready"), {}
                )
                ref = (status_.get("addressRef") or {}).get("name")
                address = by_name.get((meta["namespace"], ref)) if ref else None
                shown = f"{address['spec']['address']}/{address['spec']['prefix']}" if address else "-"
                pool = claim["spec"]["poolRef"]
                rows.append(
                    (
                        meta["namespace"],
                        meta["name"],
                        f"{pool['kind']}/{pool['name']}",
                        shown,
                        ready.get("reason", "-"),
                    )
                )
        widths = [
            max(len(str(r[i])) for r in [("NAMESPACE", "CLAIM", "POOL", "ADDRESS", "READY"), *rows]) for i in range(5)
        ]
        for row in [("NAMESPACE", "CLAIM", "POOL", "ADDRESS", "READY"), *rows]:
            print("  ".join(str(value).ljust(width) for value, width in zip(row, widths, strict=True)))
    finally:
        await kube.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(getattr(args, "log_format", "console"), getattr(args, "log_level", "info"))
    command = run if args.command == "run" else status
    return asyncio.run(command(args))


if __name__ == "__main__":
    sys.exit(main())
