"""Run the WAPI simulator as a command: ``python -m tools.wapi_simulator [options]``.

It binds 127.0.0.1 only, prints the WAPI URL, the credentials and (with TLS) the CA certificate path, then
serves until interrupted.  ``--seed-*`` options may be repeated.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from .server import WapiSimulator
from .tls import make_tls_material


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.wapi_simulator", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--tls", dest="tls", action="store_true", default=True, help="serve https (default)")
    parser.add_argument("--no-tls", dest="tls", action="store_false", help="serve plain http")
    parser.add_argument("--cert-dir", type=Path, help="write the throwaway CA and server cert here")
    parser.add_argument("--username", default="admin")
    parser.add_argument("--password", default="infoblox")
    parser.add_argument("--wapi-version", default="2.12", help="version shown in the printed URL")
    parser.add_argument("--session-timeout", type=int, default=600, help="ibapauth session lifetime (s)")
    parser.add_argument("--seed-network-view", action="append", default=[], metavar="NAME")
    parser.add_argument(
        "--seed-network", action="append", default=[], metavar="CIDR[,VIEW]", help="a network or ipv6network"
    )
    parser.add_argument("--seed-range", action="append", default=[], metavar="FIRST-LAST[,VIEW]")
    parser.add_argument("--seed-ea", action="append", default=[], metavar="NAME[:TYPE]")
    parser.add_argument("--seed-zone", action="append", default=[], metavar="FQDN[,DNSVIEW]")
    return parser


def _view(spec: str) -> tuple[str, str]:
    value, _, view = spec.partition(",")
    return value, view or "default"


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, seed, serve until SIGINT/SIGTERM."""
    args = _parser().parse_args(argv)
    material = make_tls_material(args.cert_dir) if args.tls and args.cert_dir else None
    simulator = WapiSimulator(
        port=args.port,
        tls=args.tls,
        tls_material=material,
        username=args.username,
        password=args.password,
        wapi_version=args.wapi_version,
        session_timeout=args.session_timeout,
    )
    for name in args.seed_network_view:
        simulator.state.add_network_view(name)
    for spec in args.seed_ea:
        name, _, ea_type = spec.partition(":")
        simulator.state.add_ea_definition(name, ea_type or "STRING")
    for spec in args.seed_network:
        cidr, view = _view(spec)
        simulator.state.add_network(cidr, view)
    for spec in args.seed_range:
        span, view = _view(spec)
        first, _, last = span.partition("-")
        simulator.state.add_range(first, last, view)
    for spec in args.seed_zone:
        fqdn, view = _view(spec)
        simulator.state.add_zone(fqdn, view)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    simulator.start()
    try:
        print(f"WAPI simulator listening on {simulator.url}", flush=True)
        print(f"credentials: {simulator.username} / {simulator.password}", flush=True)
        if simulator.ca_path is not None:
            print(f"CA certificate: {simulator.ca_path}", flush=True)
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        simulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
