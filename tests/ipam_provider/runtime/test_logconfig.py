"""Logging set-up: the controller's and the libraries' records on stderr through one renderer, JSON or console,
with structured tracebacks in JSON. Each case runs in a fresh interpreter (the set-up is process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from ipam_provider.runtime.logconfig import library_level

EMIT = textwrap.dedent(
    """
    import logging, sys, warnings
    import structlog
    from ipam_provider.runtime.logconfig import configure_logging

    configure_logging(sys.argv[1], sys.argv[2], sys.argv[3])
    log = structlog.get_logger("ipam_provider.sample")
    log.info("controller record", pool="net")
    log.debug("controller debug")
    logging.getLogger("aiohttp.client").info("library info %s", 1)
    logging.getLogger("urllib3.connectionpool").warning("library warning %s", 2)
    logging.getLogger("plugin.backend").info("plugin info")
    warnings.warn("careful")
    try:
        try:
            raise KeyError("inner")
        except KeyError as error:
            raise RuntimeError("outer") from error
    except RuntimeError as error:
        log.warning("controller failure", exc_info=error)
        logging.getLogger("asyncio").error("library failure", exc_info=True)
    print("stdout is not for logs")
    """
)


def emit(fmt: str, level: str = "info", libraries: str = "warning") -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", EMIT, fmt, level, libraries], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout, done.stderr


def json_records(stderr: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    for record in records:
        assert {"event", "level", "timestamp", "logger"} <= record.keys(), record
    return records


def test_json_mode_renders_every_record_as_one_json_line() -> None:
    stdout, stderr = emit("json")
    assert stdout == "stdout is not for logs\n"
    records = json_records(stderr)
    by_event = {r["event"]: r for r in records}
    assert set(by_event) == {
        "controller record",
        "library warning 2",
        "plugin info",
        "controller failure",
        "library failure",
        next(e for e in by_event if "UserWarning: careful" in e),
    }
    assert by_event["controller record"]["pool"] == "net" and by_event["controller record"]["level"] == "info"
    assert by_event["library warning 2"]["logger"] == "urllib3.connectionpool"
    warning = next(r for r in records if r["logger"] == "py.warnings")
    assert warning["level"] == "warning" and not warning["event"].endswith("\n")
    assert records[0]["timestamp"].endswith("Z")


@pytest.mark.parametrize("event", ["controller failure", "library failure"])
def test_json_tracebacks_are_structured(event: str) -> None:
    _, stderr = emit("json")
    record = next(r for r in json_records(stderr) if r["event"] == event)
    outer, inner = record["exception"]
    assert (outer["exc_type"], outer["exc_value"], outer["is_cause"]) == ("RuntimeError", "outer", False)
    assert (inner["exc_type"], inner["exc_value"], inner["is_cause"]) == ("KeyError", "'inner'", True)
    frame = outer["frames"][-1]
    assert frame["filename"] == "<string>" and frame["name"] == "<module>" and frame["lineno"] > 0
    assert "locals" not in frame, "frame locals may hold credentials"


def test_levels_of_the_controller_and_of_the_libraries_are_separate() -> None:
    _, stderr = emit("json", "debug", "info")
    events = {r["event"] for r in json_records(stderr)}
    assert {"controller debug", "library info 1"} <= events
    _, stderr = emit("json", "warning", "debug")
    events = {r["event"] for r in json_records(stderr)}
    assert "controller record" not in events and "library info 1" not in events and "library warning 2" in events


def test_console_mode_prints_readable_lines_and_tracebacks() -> None:
    _, stderr = emit("console")
    lines = stderr.splitlines()
    record = next(line for line in lines if "controller record" in line)
    assert "[info" in record and "pool=net" in record and "ipam_provider.sample" in record
    assert any("library warning 2" in line and "urllib3.connectionpool" in line for line in lines)
    assert "Traceback (most recent call last):" in stderr and "RuntimeError: outer" in stderr
    assert not any(line.startswith("{") for line in lines)


@pytest.mark.parametrize(
    ("verbosity", "level"), [(None, "warning"), (0, "warning"), (4, "warning"), (5, "info"), (6, "debug"), (9, "debug")]
)
def test_libraries_log_more_only_at_a_high_verbosity(verbosity: int | None, level: str) -> None:
    assert library_level(verbosity) == level
