"""The repair loop's settings and the `--repair-*` flags of `ipam-provider run` that set them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ipam_provider.runtime.flagforms import go_bool, go_duration

DEFAULT_INTERVAL = 60.0  # seconds between passes; a pass reads every reservation (docs/performance.md, Many pools)
DEFAULT_GRACE_PERIOD = 60.0
DEFAULT_REQUESTS_PER_SECOND = 20.0


@dataclass(frozen=True)
class RepairSettings:
    """`interval`: seconds between passes (0: no repair loop); `grace_period`: a suspected leak is released only
    once it stayed unaccounted for across two consecutive passes or more, the first at least this long ago;
    `report_only`: leaks are reported, never released; `requests_per_second`: the pace of a pass's listing
    requests (to the backends' external systems and to the API server)."""

    interval: float = DEFAULT_INTERVAL
    grace_period: float = DEFAULT_GRACE_PERIOD
    report_only: bool = False
    requests_per_second: float = DEFAULT_REQUESTS_PER_SECOND

    @property
    def enabled(self) -> bool:
        return self.interval > 0


def add_repair_flags(run: argparse.ArgumentParser) -> None:
    """The repair loop's flags (docs/repair.md)."""
    repair = run.add_argument_group("repair loop (docs/repair.md)")
    repair.add_argument(
        "--repair-interval",
        type=_non_negative_duration,
        default=DEFAULT_INTERVAL,
        metavar="DURATION",
        help="how often the leader compares every pool's backend allocations with the live IPAddresses and "
        f"claims, and repairs the difference; 0 turns the repair loop off (default: {DEFAULT_INTERVAL:g}s)",
    )
    repair.add_argument(
        "--repair-grace-period",
        type=_non_negative_duration,
        default=DEFAULT_GRACE_PERIOD,
        metavar="DURATION",
        help="a suspected leak is released only once it stayed unaccounted for across two consecutive passes or "
        f"more, the first at least this long ago (default: {DEFAULT_GRACE_PERIOD:g}s)",
    )
    repair.add_argument(
        "--repair-report-only",
        nargs="?",
        const=True,
        default=False,
        type=go_bool,
        metavar="BOOL",
        help="report suspected leaks (Events, metrics) and never release them",
    )
    repair.add_argument(
        "--repair-requests-per-second",
        type=_positive_rate,
        default=DEFAULT_REQUESTS_PER_SECOND,
        metavar="N",
        help="the pace of a repair pass's listing requests, to the backends and to the API server "
        f"(default: {DEFAULT_REQUESTS_PER_SECOND:g})",
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


def repair_settings(args: argparse.Namespace) -> RepairSettings:
    """The settings the parsed `--repair-*` flags give."""
    return RepairSettings(
        interval=args.repair_interval,
        grace_period=args.repair_grace_period,
        report_only=args.repair_report_only,
        requests_per_second=args.repair_requests_per_second,
    )
