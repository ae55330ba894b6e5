"""A small HTTP(S) proxy in front of the real NetBox, for faults NetBox itself cannot be asked to make.

`NetboxProxy(upstream)` listens on 127.0.0.1 and forwards every request to NetBox unchanged. Faults:
- `lose_next(method, path_part)`: the next matching request IS forwarded (NetBox carries it out), but the proxy
  then closes the connection without answering: the client sees a lost answer, an outcome it cannot know.
- `delay_next(method, path_part, seconds, before=False)`: the next matching request's answer is held back for
  `seconds` (after NetBox carried the request out); with `before=True` the request itself is held back that long
  before it reaches NetBox (a request NetBox carries out late, after the client gave up on it).
- `tls=True` serves HTTPS with a fresh self-signed certificate (`ca_pem`), to test TLS verification.
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

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


@dataclass
class Faults:
    lose: list[tuple[str, str]] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    delays: list[tuple[str, str, float, bool]] = field(default_factory=list)
    delayed: list[str] = field(default_factory=list)
    forwarded: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, method: str, path: str) -> bool:
        with self.lock:
            self.seen.append(f"{method} {path}")
            for index, (m, part) in enumerate(self.lose):
                if m == method and part in path:
                    del self.lose[index]
                    self.lost.append(f"{method} {path}")
                    return True
        return False

    def delay(self, method: str, path: str) -> tuple[float, bool]:
        """(seconds, before) for the next matching delay rule, taken; (0, False) if none matches."""
        with self.lock:
            for index, (m, part, seconds, before) in enumerate(self.delays):
                if m == method and part in path:
                    del self.delays[index]
                    self.delayed.append(f"{method} {path}")
                    return seconds, before
        return 0.0, False


def _handler(upstream: str, faults: Faults) -> type[http.server.BaseHTTPRequestHandler]:
    session = requests.Session()
    session_lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            lose = faults.take(self.command, self.path)
            seconds, before = faults.delay(self.command, self.path)
            if before:
                time.sleep(seconds)
            with session_lock:
                answer = session.request(self.command, upstream + self.path, data=body, headers=headers, timeout=60)
            with faults.lock:
                faults.forwarded.append(f"{self.command} {self.path}")
            if seconds and not before:
                time.sleep(seconds)
            if lose:
                self.close_connection = True
                self.connection.shutdown(2)
                return
            payload = answer.content
            self.send_response(answer.status_code)
            for key, value in answer.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _forward

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a connection the proxy dropped on purpose ends in an error: not worth a traceback


class NetboxProxy:
    def __init__(self, upstream: str, *, tls: bool = False) -> None:
        self.faults = Faults()
        self.server = _Server(("127.0.0.1", 0), _handler(upstream.rstrip("/"), self.faults))
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

    def lose_next(self, method: str, path_part: str) -> None:
        with self.faults.lock:
            self.faults.lose.append((method, path_part))

    def delay_next(self, method: str, path_part: str, seconds: float, *, before: bool = False) -> None:
        with self.faults.lock:
            self.faults.delays.append((method, path_part, seconds, before))

    def __enter__(self) -> NetboxProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
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
