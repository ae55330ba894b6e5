"""A small HTTP(S) proxy in front of the real NetBox, for faults NetBox itself cannot be asked to make.

`NetboxProxy(upstream)` listens on 127.0.0.1 and forwards every request to NetBox unchanged. Faults:
- `lose_next(method, path_part)`: the next matching request IS forwarded (NetBox carries it out), but the proxy
  then closes the connection without answering: the client sees a lost answer, an outcome it cannot know.
- `delay_next(method, path_part, seconds, before=False)`: the next matching request's answer is held back for
  `seconds` (after NetBox carried the request out); with `before=True` the request itself is held back that long
  before it reaches NetBox (a request NetBox carries out late, after the client gave up on it).
- `answer_next(status, count, method, path_part)`: the next `count` matching requests are answered `status`
  (503, 502, …) by the proxy itself and never reach NetBox: NetBox did nothing.
- `drop_next(method, path_part, count)`: the next `count` matching requests are dropped unanswered and never reach
  NetBox (a connection reset before NetBox saw anything).
- `tls=True` serves HTTPS with a fresh self-signed certificate (`ca_pem`), to test TLS verification.

`method=None` or `path_part=""` matches any. Each fault method answers the fault it queued: `pending(fault)` says how
many matching requests it will still meet (0 once it fired), `withdraw(fault)` takes back what is left of it.

Every request is logged in `log` (an `Event` with its monotonic start and end and what the proxy did with it), so
tests can see attempts, the delays between them, and requests that were in NetBox's hands at the same time
(`peak_in_flight`). Requests are forwarded concurrently, each proxy thread
with its own upstream session (tools/netbox_sessions.py: only an idempotent request whose pooled connection NetBox
closed under it is sent to NetBox again).
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tools.netbox_sessions import netbox_session

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


@dataclass
class Event:
    """One request the proxy saw: `outcome` is "forwarded <status>", "answered <status>", "dropped" or "lost"
    (forwarded, then dropped unanswered); `start`/`end` (time.monotonic) bracket the proxy's handling. Both
    `outcome` and `end` are set before the client sees the answer."""

    method: str
    path: str
    start: float
    end: float = 0.0
    outcome: str = ""

    def matches(self, method: str | None, path_part: str) -> bool:
        return (method is None or method == self.method) and path_part in self.path


@dataclass
class Rule:
    """Answer (`status`) or drop (`status` None) the next `count` matching requests without forwarding them."""

    method: str | None
    path_part: str
    count: int
    status: int | None


# What a fault method answers, for `pending` and `withdraw`: the rule, or the queued lose/delay entry itself.
Fault = Rule | tuple[str | None, str] | tuple[str | None, str, float, bool]


@dataclass
class Faults:
    rules: list[Rule] = field(default_factory=list)
    log: list[Event] = field(default_factory=list)
    lose: list[tuple[str | None, str]] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    delays: list[tuple[str | None, str, float, bool]] = field(default_factory=list)
    delayed: list[str] = field(default_factory=list)
    forwarded: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rule(self, method: str, path: str) -> Rule | None:
        """The first rule matching the request, with one use taken; None if none matches."""
        with self.lock:
            for rule in self.rules:
                if rule.count > 0 and (rule.method in (None, method)) and rule.path_part in path:
                    rule.count -= 1
                    return rule
        return None

    def take(self, method: str, path: str) -> bool:
        with self.lock:
            self.seen.append(f"{method} {path}")
            for index, (m, part) in enumerate(self.lose):
                if m in (None, method) and part in path:
                    del self.lose[index]
                    self.lost.append(f"{method} {path}")
                    return True
        return False

    def delay(self, method: str, path: str) -> tuple[float, bool]:
        """(seconds, before) for the next matching delay rule, taken; (0, False) if none matches."""
        with self.lock:
            for index, (m, part, seconds, before) in enumerate(self.delays):
                if m in (None, method) and part in path:
                    del self.delays[index]
                    self.delayed.append(f"{method} {path}")
                    return seconds, before
        return 0.0, False


def _handler(
    upstream: str, faults: Faults, sessions: list[requests.Session]
) -> type[http.server.BaseHTTPRequestHandler]:
    local = threading.local()

    def session() -> requests.Session:
        """This proxy thread's own upstream session: requests are forwarded concurrently, never serialised."""
        mine: requests.Session | None = getattr(local, "session", None)
        if mine is None:
            mine = local.session = netbox_session()
            with faults.lock:
                sessions.append(mine)
        return mine

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _drop(self) -> None:
            self.close_connection = True
            self.connection.shutdown(2)

        def _answer(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in headers.items():
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _forward(self) -> None:
            event = Event(self.command, self.path, time.monotonic())
            with faults.lock:
                faults.log.append(event)
            try:
                self._handle(event)
            finally:
                event.end = event.end or time.monotonic()

        def _handle(self, event: Event) -> None:
            """Serve one request; `event.outcome` is set before the client can see the answer (or the drop), so a
            test reading the log right after its call returned finds it."""
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            rule = faults.rule(self.command, self.path)
            if rule is not None and rule.status is None:
                event.outcome = "dropped"
                event.end = time.monotonic()
                self._drop()
                return
            if rule is not None and rule.status is not None:
                reason = http.HTTPStatus(rule.status).phrase
                event.outcome = f"answered {rule.status}"
                event.end = time.monotonic()
                self._answer(rule.status, f"<html><body>{rule.status} {reason}</body></html>".encode(), {})
                return
            lose = faults.take(self.command, self.path)
            seconds, before = faults.delay(self.command, self.path)
            if before:
                time.sleep(seconds)
            answer = session().request(self.command, upstream + self.path, data=body, headers=headers, timeout=60)
            with faults.lock:
                faults.forwarded.append(f"{self.command} {self.path}")
            if seconds and not before:
                time.sleep(seconds)
            if lose:
                event.outcome = "lost"
                event.end = time.monotonic()
                self._drop()
                return
            event.outcome = f"forwarded {answer.status_code}"
            event.end = time.monotonic()
            self._answer(answer.status_code, answer.content, dict(answer.headers))

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _forward

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a connection the proxy dropped on purpose ends in an error: not worth a traceback


class NetboxProxy:
    def __init__(self, upstream: str, *, tls: bool = False) -> None:
        self.faults = Faults()
        self._sessions: list[requests.Session] = []
        self.server = _Server(("127.0.0.1", 0), _handler(upstream.rstrip("/"), self.faults, self._sessions))
        self.ca_pem = ""
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        if tls:
            self._dir = tempfile.TemporaryDirectory(prefix="netbox-proxy-")
            cert, key = self_signed(Path(self._dir.name))
            self.ca_pem = Path(cert).read_text()
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def lose_next(self, method: str | None, path_part: str) -> Fault:
        entry = (method, path_part)
        with self.faults.lock:
            self.faults.lose.append(entry)
        return entry

    def delay_next(self, method: str | None, path_part: str, seconds: float, *, before: bool = False) -> Fault:
        entry = (method, path_part, seconds, before)
        with self.faults.lock:
            self.faults.delays.append(entry)
        return entry

    def answer_next(self, status: int, count: int = 1, method: str | None = None, path_part: str = "") -> Fault:
        rule = Rule(method, path_part, count, status)
        with self.faults.lock:
            self.faults.rules.append(rule)
        return rule

    def drop_next(self, method: str | None = None, path_part: str = "", count: int = 1) -> Fault:
        rule = Rule(method, path_part, count, None)
        with self.faults.lock:
            self.faults.rules.append(rule)
        return rule

    def pending(self, fault: Fault) -> int:
        """How many more requests `fault` (as a fault method answered it) will still meet: 0 once it fired."""
        with self.faults.lock:
            if isinstance(fault, Rule):
                return fault.count
            return sum(entry is fault for entry in [*self.faults.lose, *self.faults.delays])

    def withdraw(self, fault: Fault) -> int:
        """Takes back what is left of `fault` (it meets no further request); answers how many uses were left."""
        with self.faults.lock:
            if isinstance(fault, Rule):
                left, fault.count = fault.count, 0
                return left
            before = len(self.faults.lose) + len(self.faults.delays)
            self.faults.lose = [entry for entry in self.faults.lose if entry is not fault]
            self.faults.delays = [entry for entry in self.faults.delays if entry is not fault]
            return before - len(self.faults.lose) - len(self.faults.delays)

    def events(self, method: str | None = None, path_part: str = "") -> list[Event]:
        """The logged requests matching `method` and `path_part`, in arrival order."""
        with self.faults.lock:
            return [e for e in self.faults.log if e.matches(method, path_part)]

    def peak_in_flight(self, method: str | None = None, path_part: str = "") -> int:
        """The most matching requests the proxy was handling at one moment."""
        edges = sorted(
            [(e.start, 1) for e in self.events(method, path_part)]
            + [(e.end or time.monotonic(), -1) for e in self.events(method, path_part)]
        )
        peak = current = 0
        for _, step in edges:  # at equal times an end (-1) sorts before a start (+1): touching is not overlapping
            current += step
            peak = max(peak, current)
        return peak

    def __enter__(self) -> NetboxProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        for session in self._sessions:
            session.close()
        if self._dir is not None:
            self._dir.cleanup()


def self_signed(directory: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (and localhost), signed by itself; returns (cert path, key path)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "netbox-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)
