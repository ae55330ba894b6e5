"""Fault injection and the request log.

Contract:

* a :class:`FaultRule` selects requests by HTTP method and WAPI object type (``None`` = any; the object type
  of a reference is the part before its first ``/``) and fires either for its next ``count`` matching
  requests or, with ``rate``, on each matching request with that probability (seeded, so runs repeat);
* kinds:

  - ``latency``: sleep ``delay`` seconds before handling (every matching latency rule adds up);
  - ``status``: answer ``status`` (503 by default) without handling the request;
  - ``drop``: close the connection without answering and without handling the request;
  - ``drop_after_commit``: handle the request (the object is created/changed/deleted), then close the
    connection without answering; it fires only for requests that succeeded (2xx);

* ``status`` and ``drop`` rules are checked in the order they were added; the first that fires wins;
* a rule can be taken back with :meth:`FaultInjector.remove` (the chaos runner ends its faults that way);
* :class:`RequestLog` records every request that reached the server, with its outcome, and counts them by
  ``(method, object type)`` so tests and benchmarks can count WAPI requests per allocation.

Both classes are thread-safe.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

FAULT_KINDS = ("latency", "status", "drop", "drop_after_commit")

DEFAULT_503_BODY = (
    b'<!DOCTYPE HTML PUBLIC "-//IETF//DTD HTML 2.0//EN">\n<html><head>\n<title>503 Service Unavailable</title>\n'
    b"</head><body>\n<h1>Service Unavailable</h1>\n<p>The server is temporarily unable to service your request."
    b"</p>\n</body></html>\n"
)


@dataclass
class FaultRule:
    """One injected fault (see module docstring)."""

    kind: str
    methods: frozenset[str] | None = None
    object_types: frozenset[str] | None = None
    count: int | None = 1
    rate: float | None = None
    status: int = 503
    body: bytes | None = None
    delay: float = 0.0
    fired: int = 0

    def matches(self, method: str, object_type: str | None) -> bool:
        """Whether the rule selects this request (ignoring count and rate)."""
        if self.methods is not None and method not in self.methods:
            return False
        return self.object_types is None or object_type in self.object_types


def _selector(values: str | list[str] | tuple[str, ...] | None, upper: bool = False) -> frozenset[str] | None:
    if values is None:
        return None
    items = [values] if isinstance(values, str) else list(values)
    return frozenset(v.upper() if upper else v for v in items)


class FaultInjector:
    """The active fault rules of one simulator."""

    def __init__(self, seed: int = 0) -> None:
        self._rules: list[FaultRule] = []
        self._lock = threading.Lock()
        self._random = random.Random(seed)

    def add(
        self,
        kind: str,
        *,
        count: int | None = 1,
        rate: float | None = None,
        methods: str | list[str] | tuple[str, ...] | None = None,
        object_types: str | list[str] | tuple[str, ...] | None = None,
        status: int = 503,
        body: bytes | None = None,
        delay: float = 0.0,
    ) -> FaultRule:
        """Add a rule. With ``rate`` set, ``count`` caps how often it fires (``None`` = no cap)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
        rule = FaultRule(
            kind, _selector(methods, upper=True), _selector(object_types), count, rate, status, body, delay
        )
        with self._lock:
            self._rules.append(rule)
        return rule

    def fail_next(
        self,
        count: int = 1,
        *,
        status: int = 503,
        body: bytes | None = None,
        methods: str | list[str] | None = None,
        object_types: str | list[str] | None = None,
    ) -> FaultRule:
        """The next ``count`` matching requests answer ``status`` (default 503) unhandled."""
        return self.add("status", count=count, status=status, body=body, methods=methods, object_types=object_types)

    def fail_rate(
        self,
        rate: float,
        *,
        status: int = 503,
        methods: str | list[str] | None = None,
        object_types: str | list[str] | None = None,
    ) -> FaultRule:
        """Each matching request answers ``status`` unhandled with probability ``rate``."""
        return self.add("status", count=None, rate=rate, status=status, methods=methods, object_types=object_types)

    def add_latency(
        self,
        delay: float,
        *,
        count: int | None = None,
        methods: str | list[str] | None = None,
        object_types: str | list[str] | None = None,
    ) -> FaultRule:
        """Matching requests wait ``delay`` seconds first (all of them unless ``count`` is given)."""
        return self.add("latency", count=count, delay=delay, methods=methods, object_types=object_types)

    def drop_next(
        self, count: int = 1, *, methods: str | list[str] | None = None, object_types: str | list[str] | None = None
    ) -> FaultRule:
        """The next ``count`` matching requests get their connection closed, unhandled and unanswered."""
        return self.add("drop", count=count, methods=methods, object_types=object_types)

    def drop_rate(
        self, rate: float, *, methods: str | list[str] | None = None, object_types: str | list[str] | None = None
    ) -> FaultRule:
        """Each matching request is dropped (unhandled) with probability ``rate``."""
        return self.add("drop", count=None, rate=rate, methods=methods, object_types=object_types)

    def drop_reply_after_commit(
        self, count: int = 1, *, methods: str | list[str] | None = None, object_types: str | list[str] | None = None
    ) -> FaultRule:
        """The next ``count`` matching successful requests are handled, then left unanswered."""
        return self.add("drop_after_commit", count=count, methods=methods, object_types=object_types)

    def remove(self, rule: FaultRule) -> int:
        """Remove one rule (as `add` answered it), fired or not; answers how many more times it would have fired
        (-1 for a rule without a cap)."""
        with self._lock:
            self._rules = [r for r in self._rules if r is not rule]
            return -1 if rule.count is None else max(rule.count - rule.fired, 0)

    def clear(self) -> None:
        """Remove every rule."""
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> list[FaultRule]:
        """A copy of the active rules."""
        with self._lock:
            return list(self._rules)

    def _fire(self, rule: FaultRule) -> bool:
        if rule.count is not None and rule.fired >= rule.count:
            return False
        if rule.rate is not None and self._random.random() >= rule.rate:
            return False
        rule.fired += 1
        return True

    def latency(self, method: str, object_type: str | None) -> float:
        """Total added delay for this request."""
        with self._lock:
            return sum(
                r.delay for r in self._rules if r.kind == "latency" and r.matches(method, object_type) and self._fire(r)
            )

    def before(self, method: str, object_type: str | None) -> FaultRule | None:
        """The ``status`` or ``drop`` rule that fires for this request, if any."""
        with self._lock:
            for rule in self._rules:
                if rule.kind in ("status", "drop") and rule.matches(method, object_type) and self._fire(rule):
                    return rule
        return None

    def after(self, method: str, object_type: str | None, status: int) -> bool:
        """Whether to drop the reply of a handled request."""
        if not 200 <= status < 300:
            return False
        with self._lock:
            return any(
                r.kind == "drop_after_commit" and r.matches(method, object_type) and self._fire(r) for r in self._rules
            )


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server saw it (path percent-decoded once, raw query, raw body).

    ``status`` is ``None`` when the connection was dropped; ``auth`` is how it authenticated (``basic``,
    ``cookie`` or ``none``); ``fault`` names the injected fault that answered it, if any; ``user_agent`` is its
    User-Agent header.
    """

    method: str
    object_type: str | None
    path: str
    query: str
    status: int | None
    auth: str
    fault: str | None = None
    is_ref: bool = False
    body: bytes = b""
    user_agent: str | None = None

    def json(self) -> Any:
        """The request body decoded as JSON (``None`` when empty)."""
        return json.loads(self.body) if self.body.strip() else None


@dataclass
class RequestLog:
    """Every request the simulator received."""

    _entries: list[LoggedRequest] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, entry: LoggedRequest) -> None:
        """Append one request."""
        with self._lock:
            self._entries.append(entry)

    @property
    def entries(self) -> list[LoggedRequest]:
        """A copy of all entries, oldest first."""
        with self._lock:
            return list(self._entries)

    def count(self, method: str | None = None, object_type: str | None = None) -> int:
        """How many requests matched ``method`` and ``object_type`` (``None`` = any)."""
        return sum(
            1
            for e in self.entries
            if (method is None or e.method == method.upper()) and (object_type is None or e.object_type == object_type)
        )

    def counts(self) -> Counter[tuple[str, str | None]]:
        """Request counts by ``(method, object type)``."""
        return Counter((e.method, e.object_type) for e in self.entries)

    def reset(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
