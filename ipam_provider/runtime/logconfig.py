"""Logging set-up: every record, the controller's (structlog) and the libraries' (stdlib `logging`), goes through
one handler on stderr and is rendered by the same renderer.

JSON mode prints one JSON object per line with at least `event`, `level`, `timestamp` (ISO 8601, UTC) and
`logger` (the module or library logger name), plus the record's key-value pairs. A record with an exception
carries it as `exception`: a list of structured tracebacks, the exception raised first and then its causes
(`is_cause` true) or contexts, each with `exc_type`, `exc_value`, `exc_notes`, `syntax_error`, `is_group`,
`exceptions` (an exception group's members) and `frames` (`filename`, `lineno`, `name`; innermost call last);
frame locals are never included (they may hold credentials). Console mode prints one readable
line per record and a plain traceback below it. Python warnings are logged by the `py.warnings` logger.
"""

from __future__ import annotations

import logging
import sys

import structlog
from structlog.tracebacks import ExceptionDictTransformer

# Libraries that log every request or connection at INFO/DEBUG; they stay at the library level (WARNING unless a
# high --v asks for more), while the controller's own records follow --log-level.
NOISY_LIBRARIES = (
    "aiohttp",
    "asyncio",
    "kubernetes_asyncio",
    "pynetbox",
    "infoblox_client",
    "requests",
    "urllib3",
)


def library_level(verbosity: int | None) -> str:
    """The level of `NOISY_LIBRARIES` for a klog verbosity (--v): warning, info from 5 on, debug from 6 on (klog
    logs requests from 6)."""
    if verbosity is None or verbosity < 5:
        return "warning"
    return "info" if verbosity == 5 else "debug"


def _level(name: str) -> int:
    return int(getattr(logging, name.upper(), logging.INFO))


def _strip_event(_: object, __: str, event_dict: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """A library message without its trailing newline (Python warnings end with one)."""
    if isinstance(event_dict.get("event"), str):
        event_dict["event"] = event_dict["event"].rstrip()
    return event_dict


def _renderer(fmt: str) -> list[structlog.typing.Processor]:
    if fmt == "json":
        tracebacks = structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))
        return [tracebacks, structlog.processors.JSONRenderer()]
    return [structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)]


def configure_logging(fmt: str = "console", level: str = "info", library_level: str = "warning") -> None:
    """Log as `fmt` ("json" or "console") to stderr: the controller's records from `level` on, those of
    `NOISY_LIBRARIES` from `library_level` on (never below `level`), every other stdlib logger's from `level` on.
    Call it once, before the first record: loggers cache their configuration on first use."""
    numeric = _level(level)
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _strip_event],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *_renderer(fmt)],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    logging.basicConfig(handlers=[handler], level=numeric, force=True)
    for name in NOISY_LIBRARIES:
        logging.getLogger(name).setLevel(max(numeric, _level(library_level)))
    logging.captureWarnings(True)
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
