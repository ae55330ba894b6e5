"""The repair loop's flags (Go durations, a boolean in both forms, a positive rate, their defaults) and its pacer."""

from __future__ import annotations

import asyncio

import pytest

from ipam_provider.flags import RunOptions, parse_args
from ipam_provider.repair import RepairSettings
from ipam_provider.repair.pacer import RatePacer


def repair(*argv: str) -> RepairSettings:
    options: RunOptions = parse_args(["run", *argv]).options
    return options.controller.repair


def test_the_defaults_release_leaks_every_30_seconds_after_a_minute() -> None:
    assert repair() == RepairSettings(interval=60.0, grace_period=60.0, report_only=False, requests_per_second=20.0)
    assert repair().enabled


def test_the_flags_in_go_forms() -> None:
    got = repair(
        "--repair-interval=1m30s",
        "--repair-grace-period=500ms",
        "--repair-report-only",
        "--repair-requests-per-second=2.5",
    )
    assert got == RepairSettings(interval=90.0, grace_period=0.5, report_only=True, requests_per_second=2.5)
    assert repair("--repair-report-only=false").report_only is False
    assert repair("--repair-report-only", "true").report_only is True


def test_an_interval_of_zero_turns_the_loop_off() -> None:
    assert not repair("--repair-interval=0").enabled
    assert repair("--repair-grace-period=0").grace_period == 0.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repair-interval=-1s"], "must not be negative"),
        (["--repair-interval=30"], "is not a duration"),
        (["--repair-grace-period=-5m"], "must not be negative"),
        (["--repair-requests-per-second=0"], "is not a rate greater than zero"),
        (["--repair-requests-per-second=fast"], "is not a rate greater than zero"),
        (["--repair-requests-per-second=inf"], "is not a rate greater than zero"),
        (["--repair-report-only=yes"], "is not a boolean"),
    ],
)
def test_bad_values_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["run", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


async def test_the_pacer_lets_one_request_go_then_makes_the_next_wait() -> None:
    pacer = RatePacer(0.001)  # one request per 1,000 s: the second must wait, however slow the machine
    await pacer.wait()
    second = asyncio.ensure_future(pacer.wait())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not second.done()
    second.cancel()
    with pytest.raises(ValueError, match="greater than zero"):
        RatePacer(0)
