"""The command line's flags: controller-runtime's names, in the Go forms a Cluster API manager is given (`--flag` or
`--flag=true|false`, Go durations, `--v=N`, `--<kind>-concurrency=N`), resolved by `parse_args` into `RunOptions`.
Flags accepted that change nothing here are named in `--help` and in `RunOptions.not_acted_on`, logged at start-up.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ipam_provider.controller import ControllerSettings
from ipam_provider.repair.pool import RepairSettings
from ipam_provider.runtime.flagforms import (
    FlagError,
    MetricsServing,
    WebhookServing,
    add_serving_flags,
    add_webhook_flags,
    given,
    go_bool,
    go_duration,
    host_port,
    metrics_serving,
    positive_duration,
    split_list,
    take_kind_concurrency,
    webhook_serving,
)
from ipam_provider.runtime.leader import JITTER_FACTOR
from ipam_provider.runtime.logconfig import library_level
from ipam_provider.version import __version__

CLAIM_KIND = "ipaddressclaim"
"""The kind whose `--<kind>-concurrency` is acted on: claims are reconciled that many at a time."""

NOT_ACTED_ON = "accepted, not acted on"
DEFAULTS = ControllerSettings()  # the defaults of --workers, --sync-period and the --repair-* flags
REPAIR = DEFAULTS.repair


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ipam-provider", description="A Cluster API IPAM provider: `run` the controller, or show `status`."
    )
    parser.add_argument("--version", action="version", version=__version__, help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="run the controller",
        description="Run the controller. Flag names follow controller-runtime and Cluster API managers; booleans "
        "take --flag or --flag=true|false, durations Go's form (15s, 1m30s, 500ms).",
    )
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    run.add_argument(
        "--namespace", action="append", metavar="NAMESPACE", help="watch only this namespace (repeatable or a,b)"
    )
    run.add_argument("--watch-filter", help="only claims labelled cluster.x-k8s.io/watch-filter=<value>")
    run.add_argument("--backends", help="entry-point names of the backends to load (default: all installed)")
    _add_reconcile_flags(run)
    run.add_argument(
        "--cluster-identity",
        default="",
        metavar="TEXT",
        help="names this management cluster on the NetBox and Infoblox objects it makes, so that clusters sharing "
        "one IPAM never release each other's (default: the uid of the kube-system Namespace; set it when that "
        "cannot be read; docs/repair.md)",
    )
    _add_leader_election_flags(run)
    _add_repair_flags(run)
    add_serving_flags(run)
    add_webhook_flags(run)
    _add_logging_flags(run)
    _add_ignored_flags(run)
    status = commands.add_parser("status", help="show claims with their addresses, or pools with their counts")
    status.add_argument("view", nargs="?", choices=["claims", "pools"], default="claims", help="default: claims")
    status.add_argument("--pools", action="store_true", help="the pools view")
    status.add_argument("-o", "--output", choices=["table", "json"], default="table", help="default: table")
    status.add_argument("--kubeconfig")
    status.add_argument("--namespace", action="append")
    return parser


def _add_reconcile_flags(run: argparse.ArgumentParser) -> None:
    """How many reconciles run at once, and how often a pool is reported again without a change."""
    run.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help=f"concurrent reconciles of claims and pools (default: {DEFAULTS.workers}; wins over the concurrency "
        "flags below); an in-cluster pool's claims are served at once, a NetBox or Infoblox pool's one at a time",
    )
    run.add_argument(
        f"--{CLAIM_KIND}-concurrency",
        dest="claim_concurrency",
        type=int,
        metavar="N",
        help="sets --workers (Cluster API's per-kind concurrency flag for the kind this controller reconciles); "
        f"--<kind>-concurrency=N for any other kind (e.g. --inclusterippool-concurrency) is {NOT_ACTED_ON}",
    )
    run.add_argument(
        "--max-concurrent-reconciles",
        type=int,
        metavar="N",
        help="sets --workers unless --workers or --ipaddressclaim-concurrency is given",
    )
    run.add_argument(
        "--sync-period",
        type=positive_duration,
        default=DEFAULTS.sync_period,
        metavar="DURATION",
        help="every live pool is reported again this often (NetBox and Infoblox pools every minute, since their "
        "reports read the external system); anything else is reconciled when a watched object changes "
        f"(default: {DEFAULTS.sync_period:g}s)",
    )


_ELECTION_DURATIONS = (  # flag, default (seconds), help
    ("--leader-elect-lease-duration", 15.0, "how long standbys wait before taking over a lease that was not renewed"),
    ("--leader-elect-renew-deadline", 10.0, "the leader gives up (and exits 1) when it could not renew for this long"),
    ("--leader-elect-retry-period", 2.0, "how often the leader renews and standbys try to acquire"),
)


def _bool_flag(group: argparse._ArgumentGroup, flag: str, help: str) -> None:
    """A boolean flag in Go's forms: `--flag` or `--flag=true|false`, false when absent."""
    group.add_argument(flag, nargs="?", const=True, default=False, type=go_bool, metavar="BOOL", help=help)


def _add_leader_election_flags(run: argparse.ArgumentParser) -> None:
    election = run.add_argument_group("leader election")
    _bool_flag(election, "--leader-elect", "run only while holding the leader lease")
    election.add_argument(
        "--leader-election-namespace", default="capi-ipam-system", metavar="NAMESPACE", help="the lease's namespace"
    )
    election.add_argument(
        "--leader-election-id",
        default="capi-ipam-provider-py",
        metavar="[NAMESPACE/]NAME",
        help="the lease's name; a NAMESPACE/ prefix overrides --leader-election-namespace",
    )
    for flag, default, help in _ELECTION_DURATIONS:
        election.add_argument(
            flag, type=positive_duration, default=default, metavar="DURATION", help=f"{help} (default: {default:g}s)"
        )


def _add_repair_flags(run: argparse.ArgumentParser) -> None:
    repair = run.add_argument_group("repair loop (docs/repair.md)")
    repair.add_argument(
        "--repair-interval",
        type=_non_negative_duration,
        default=REPAIR.interval,
        metavar="DURATION",
        help="how often the leader compares every pool's backend allocations with the live IPAddresses and "
        f"claims, and repairs the difference; 0 turns the repair loop off (default: {REPAIR.interval:g}s)",
    )
    repair.add_argument(
        "--repair-grace-period",
        type=_non_negative_duration,
        default=REPAIR.grace_period,
        metavar="DURATION",
        help="a suspected leak is released only once it stayed unaccounted for across two consecutive passes or "
        f"more, the first at least this long ago (default: {REPAIR.grace_period:g}s)",
    )
    _bool_flag(repair, "--repair-report-only", "report suspected leaks (Events, metrics) and never release them")
    repair.add_argument(
        "--repair-requests-per-second",
        type=_positive_rate,
        default=REPAIR.requests_per_second,
        metavar="N",
        help="the pace of a repair pass's listing requests, to the backends and to the API server "
        f"(default: {REPAIR.requests_per_second:g})",
    )


def _non_negative_duration(text: str) -> float:
    seconds = go_duration(text)
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the duration must not be negative")
    return seconds


def _positive_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        rate = 0.0
    if not rate > 0 or rate == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate greater than zero (requests per second)")
    return rate


def _add_logging_flags(run: argparse.ArgumentParser) -> None:
    """Log format and level, and the CAPI forms that map onto them."""
    logs = run.add_argument_group("logging")
    logs.add_argument("--log-format", choices=["json", "console"], help="default: console")
    logs.add_argument(
        "--logging-format",
        choices=["text", "json"],
        help="Kubernetes components' name for it: text is console (--log-format wins)",
    )
    logs.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="default: info; wins over --v")
    logs.add_argument(
        "--v",
        type=_verbosity,
        metavar="N",
        help="klog verbosity: 0-3 log at info, 4 and more at debug; libraries log warnings, from 5 on info, from 6 on "
        "debug",
    )


_IGNORED = {  # flag → (metavar, why it changes nothing here)
    "--profiler-address": ("ADDRESS", "no pprof endpoint"),
    "--feature-gates": ("NAME=BOOL,...", "there are no feature gates"),
    "--webhook-cert-secret-name": ("VALUE", "the webhook's certificate is read from --webhook-cert-dir"),
    "--webhook-cert-secret-namespace": ("VALUE", "the webhook's certificate is read from --webhook-cert-dir"),
    "--tls-curve-preferences": (
        "ID,...",
        "Python's ssl module can restrict the key exchange to one curve only, not to a list; OpenSSL's default "
        "groups are offered",
    ),
}


def _add_ignored_flags(run: argparse.ArgumentParser) -> None:
    """Flags a CAPI manager is given that are accepted and not acted on."""
    ignored = run.add_argument_group(
        f"Cluster API manager flags that are {NOT_ACTED_ON}",
        "Taken so that a manager's usual command line starts; each one given is named in a warning at start-up.",
    )
    for flag, (metavar, help) in _IGNORED.items():
        ignored.add_argument(flag, metavar=metavar, help=help)


def _verbosity(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a verbosity (0, 1, 2, ...)")
    return int(text)


@dataclass(frozen=True)
class LeaderElection:
    enabled: bool
    namespace: str
    name: str
    lease_duration: float
    renew_deadline: float
    retry_period: float


@dataclass(frozen=True)
class RunOptions:
    """What `ipam-provider run` does, with every alias, precedence and default resolved."""

    kubeconfig: str | None
    controller: ControllerSettings  # namespaces, watch filter, workers, sync period, repair
    backends: list[str] | None
    leader_election: LeaderElection
    metrics: MetricsServing  # its TLS options are the webhook's too
    probes_address: str
    webhook: WebhookServing  # the admission webhook (port 0: off)
    log_format: str
    log_level: str
    not_acted_on: tuple[str, ...]
    library_log_level: str = "warning"  # the HTTP and client libraries' stdlib loggers (see logconfig.py)
    cluster_identity: str = ""  # --cluster-identity ("": the kube-system Namespace's uid, read at start)

    @property
    def metrics_bind(self) -> tuple[str, int] | None:
        return host_port(self.metrics.address)

    @property
    def probes_bind(self) -> tuple[str, int] | None:
        return host_port(self.probes_address)


def run_options(args: argparse.Namespace) -> RunOptions:
    """Resolve `run`'s parsed flags. Raises FlagError for values that parse but cannot work together."""
    ignored = given(args, *_IGNORED)
    kind_concurrency: dict[str, int] = getattr(args, "kind_concurrency", None) or {}
    ignored += [f"--{kind}-concurrency={count}" for kind, count in sorted(kind_concurrency.items())]
    workers = _workers(args, ignored)
    webhook = webhook_serving(args)
    metrics = metrics_serving(args, ignored, webhook=webhook.bind is not None)
    log_format, log_level = _logging(args, ignored)
    library_log_level = library_level(None if args.log_level else args.v)  # --log-level wins over --v
    return RunOptions(
        kubeconfig=args.kubeconfig,
        controller=ControllerSettings(
            namespaces=split_list(args.namespace),
            watch_filter=args.watch_filter,
            workers=workers,
            sync_period=args.sync_period,
            repair=RepairSettings(
                args.repair_interval, args.repair_grace_period, args.repair_report_only, args.repair_requests_per_second
            ),
        ),
        backends=split_list([args.backends]) if args.backends else None,
        leader_election=_leader_election(args),
        metrics=metrics,
        probes_address=args.health_probe_bind_address,
        webhook=webhook,
        log_format=log_format,
        log_level=log_level,
        not_acted_on=tuple(ignored),
        library_log_level=library_log_level,
        cluster_identity=args.cluster_identity.strip(),
    )


def _workers(args: argparse.Namespace, ignored: list[str]) -> int:
    """--workers, else the claim kind's concurrency, else --max-concurrent-reconciles; the others given go to
    `ignored`."""
    flags = ("--workers", f"--{CLAIM_KIND}-concurrency", "--max-concurrent-reconciles")
    values = (args.workers, args.claim_concurrency, args.max_concurrent_reconciles)
    counts = [(flag, value) for flag, value in zip(flags, values, strict=True) if value is not None]
    for flag, value in reversed(counts):
        if value < 1:
            raise FlagError(f"argument {flag}: must be at least 1, got {value}")
    ignored += [f"{flag}={value} ({counts[0][0]} wins)" for flag, value in counts[1:]]
    return counts[0][1] if counts else DEFAULTS.workers


def _logging(args: argparse.Namespace, ignored: list[str]) -> tuple[str, str]:
    """Log format and level: --log-format/--log-level win over --logging-format/--v."""
    log_format = args.log_format or {"json": "json", "text": "console", None: "console"}[args.logging_format]
    if args.log_format and args.logging_format:
        ignored.append(f"--logging-format={args.logging_format} (--log-format wins)")
    if args.log_level:
        if args.v is not None:
            ignored.append(f"--v={args.v} (--log-level wins)")
        return log_format, str(args.log_level)
    return log_format, "debug" if args.v is not None and args.v >= 4 else "info"


def _leader_election(args: argparse.Namespace) -> LeaderElection:
    namespace, name = args.leader_election_namespace, args.leader_election_id
    if "/" in name:
        namespace, _, name = name.partition("/")
        if not namespace or not name or "/" in name:
            raise FlagError(
                f"argument --leader-election-id: expected NAME or NAMESPACE/NAME, got {args.leader_election_id!r}"
            )
    durations = args.leader_elect_lease_duration, args.leader_elect_renew_deadline, args.leader_elect_retry_period
    election = LeaderElection(args.leader_elect, namespace, name, *durations)
    if election.enabled:
        # As client-go's leader elector checks them (controller-runtime fails to start otherwise).
        if election.renew_deadline >= election.lease_duration:
            raise FlagError(
                "--leader-elect-renew-deadline must be shorter than --leader-elect-lease-duration "
                f"({election.renew_deadline:g}s >= {election.lease_duration:g}s)"
            )
        if election.renew_deadline <= election.retry_period * JITTER_FACTOR:
            raise FlagError(
                f"--leader-elect-renew-deadline must be longer than {JITTER_FACTOR:g} x --leader-elect-retry-period "
                f"({election.renew_deadline:g}s <= {JITTER_FACTOR:g} x {election.retry_period:g}s)"
            )
    return election


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a command line; `run` also gets `args.options`, its resolved RunOptions. Exits 2 on a bad flag."""
    parser = build_parser()
    try:
        rest, kind_concurrency = take_kind_concurrency(list(sys.argv[1:] if argv is None else argv), CLAIM_KIND)
        args = parser.parse_args(rest, argparse.Namespace(kind_concurrency=kind_concurrency))
        if args.command == "run":
            args.options = run_options(args)
    except FlagError as error:
        parser.error(str(error))
    return args
