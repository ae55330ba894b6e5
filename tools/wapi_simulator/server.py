"""The HTTP(S) front of the simulator: a threading HTTP/1.1 server bound to 127.0.0.1.

Contract:

* :class:`WapiSimulator` serves ``/wapi/v2.<n>[.<m>]/...`` on ``127.0.0.1`` (never another interface) from a
  background thread, one thread per connection, keep-alive enabled; TLS (on by default, because
  infoblox-client always speaks https) uses a throwaway CA from :mod:`.tls`;
* each request goes: request log -> injected latency -> injected 503/drop -> authentication (401) ->
  WAPI version check -> :class:`~.api.WapiApi` -> optional drop-after-commit -> answer;
* other paths answer a plain 404; WAPI major versions other than 2 answer ``Version <v> not supported``;
* :meth:`WapiSimulator.stop` closes the listener and every open connection.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from . import errors
from .api import WapiApi, WapiRequest, WapiResponse
from .auth import Authenticator
from .errors import JSON_CONTENT_TYPE
from .faults import DEFAULT_503_BODY, FaultInjector, LoggedRequest, RequestLog
from .state import SimulatorState
from .store import ObjectStore
from .tls import TlsMaterial, make_tls_material, server_context

_WAPI_PATH = re.compile(r"^/wapi/v(\d+(?:\.\d+){1,2})/(.*)$", re.DOTALL)
_UNAUTHORIZED_BODY = (
    b'<!DOCTYPE HTML PUBLIC "-//IETF//DTD HTML 2.0//EN">\n<html><head>\n<title>401 Authorization Required'
    b"</title>\n</head><body>\n<h1>Authorization Required</h1>\n</body></html>\n"
)
LOOPBACK = "127.0.0.1"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, simulator: WapiSimulator, context: ssl.SSLContext | None) -> None:
        self.simulator = simulator
        self.ssl_context = context
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__((LOOPBACK, simulator.requested_port), _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        conn: socket.socket = request
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl_context is not None:
                conn.settimeout(10)
                conn = self.ssl_context.wrap_socket(conn, server_side=True)
                conn.settimeout(None)
        except (ssl.SSLError, OSError):
            conn.close()
            return
        with self.connections_lock:
            self.connections.add(conn)
        try:
            _Handler(conn, client_address, self)
        finally:
            with self.connections_lock:
                self.connections.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet when a client went away (timed out, or a fault dropped it); report anything else."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self.connections_lock:
            live = list(self.connections)
        for conn in live:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "WAPI-simulator"
    sys_version = ""
    timeout = 120
    wbufsize = 1 << 16  # buffered: headers and body leave in one write (flushed after each request)
    server: _Server

    def do_GET(self) -> None:
        self.server.simulator.serve(self)

    do_POST = do_PUT = do_DELETE = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        return

    def send(self, status: int, body: bytes, content_type: str, extra: list[tuple[str, str]] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra or []:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def drop(self) -> None:
        """Close the connection without answering."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class WapiSimulator:
    """A running (after :meth:`start`) simulated NIOS grid.

    Attributes for tests: ``state`` (seed and inspect), ``faults`` (inject faults), ``request_log`` (count
    requests), ``auth`` (sessions), ``url`` (WAPI base URL with the default version), ``ca_path`` (with TLS).
    """

    def __init__(
        self,
        *,
        port: int = 0,
        tls: bool = True,
        tls_material: TlsMaterial | None = None,
        username: str = "admin",
        password: str = "infoblox",
        wapi_version: str = "2.12",
        session_timeout: int = 600,
        seed: int = 0,
    ) -> None:
        self.requested_port = port
        self.username, self.password, self.wapi_version = username, password, wapi_version
        self.store = ObjectStore()
        self.state = SimulatorState(self.store)
        self.api = WapiApi(self.store)
        self.auth = Authenticator({username: password}, session_timeout)
        self.faults = FaultInjector(seed)
        self.request_log = RequestLog()
        self._tls = tls
        self._tls_material = tls_material
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> WapiSimulator:
        """Bind 127.0.0.1 and serve from a background thread."""
        context = None
        if self._tls:
            if self._tls_material is None:
                self._tmpdir = tempfile.TemporaryDirectory(prefix="wapi-sim-tls-")
                self._tls_material = make_tls_material(Path(self._tmpdir.name))
            context = server_context(self._tls_material)
        self._server = _Server(self, context)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="wapi-simulator", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every connection."""
        if self._server is not None:
            self._server.shutdown()
            self._server.close_connections()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> WapiSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses -----------------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """Always ``127.0.0.1``."""
        return LOOPBACK

    @property
    def port(self) -> int:
        """The bound port."""
        if self._server is None:
            raise RuntimeError("the simulator is not running")
        return int(self._server.server_address[1])

    @property
    def netloc(self) -> str:
        """``127.0.0.1:<port>`` (what infoblox-client wants as ``host``)."""
        return f"{self.host}:{self.port}"

    @property
    def scheme(self) -> str:
        """``https`` or ``http``."""
        return "https" if self._tls else "http"

    @property
    def base_url(self) -> str:
        """``<scheme>://127.0.0.1:<port>``."""
        return f"{self.scheme}://{self.netloc}"

    @property
    def url(self) -> str:
        """The WAPI base URL with the default version, ending in ``/``."""
        return self.wapi_url()

    def wapi_url(self, version: str | None = None) -> str:
        """The WAPI base URL for ``version`` (default: the simulator's ``wapi_version``)."""
        return f"{self.base_url}/wapi/v{version or self.wapi_version}/"

    @property
    def ca_path(self) -> Path | None:
        """The CA certificate to verify the server with (``None`` without TLS)."""
        return self._tls_material.ca_path if self._tls and self._tls_material is not None else None

    def connector_options(self, **overrides: Any) -> dict[str, Any]:
        """Options for ``infoblox_client.connector.Connector`` pointing here (CA verification on)."""
        options: dict[str, Any] = {
            "host": self.netloc,
            "username": self.username,
            "password": self.password,
            "wapi_version": self.wapi_version,
            "ssl_verify": str(self.ca_path) if self.ca_path is not None else False,
            "http_request_timeout": 10,
        }
        options.update(overrides)
        return options

    def connector(self, **overrides: Any) -> Any:
        """A real ``infoblox_client`` Connector for this simulator (plain HTTP: its URL is rewritten)."""
        from infoblox_client.connector import Connector

        connector = Connector(self.connector_options(**overrides))
        if not self._tls:
            connector.wapi_url = connector.wapi_url.replace("https://", "http://", 1)
        return connector

    # -- request handling ----------------------------------------------------------------------------------

    def serve(self, handler: _Handler) -> None:
        """Handle one HTTP request (called from the connection's thread).

        The request is logged before the answer is sent (or the connection dropped), so a client that has
        its answer always finds its request in :attr:`request_log`.
        """
        method = handler.command
        split = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length > 0 else b""
        match = _WAPI_PATH.match(split.path)
        path = unquote(match.group(2)) if match else split.path
        obj_type = (path.split("/", 1)[0] or None) if match else None

        def log(status: int | None, auth: str, fault: str | None = None) -> None:
            self.request_log.record(
                LoggedRequest(
                    method,
                    obj_type,
                    path,
                    split.query,
                    status,
                    auth,
                    fault,
                    bool(match) and "/" in path,
                    body,
                    handler.headers.get("User-Agent"),
                )
            )

        delay = self.faults.latency(method, obj_type)
        if delay > 0:
            time.sleep(delay)
        rule = self.faults.before(method, obj_type)
        if rule is not None and rule.kind == "drop":
            log(None, "none", "drop")
            handler.drop()
            return
        if rule is not None:
            payload = rule.body if rule.body is not None else DEFAULT_503_BODY
            content_type = JSON_CONTENT_TYPE if payload[:1] in (b"{", b"[") else "text/html"
            log(rule.status, "none", "status")
            handler.send(rule.status, payload, content_type)
            return
        auth = self.auth.authenticate(
            handler.headers.get("Authorization"), handler.headers.get("Cookie"), handler.client_address[0]
        )
        if not auth.ok:
            log(401, auth.method)
            challenge = [("WWW-Authenticate", 'Basic realm="InfoBlox ONE Platform"')]
            handler.send(401, _UNAUTHORIZED_BODY, "text/html", challenge)
            return
        response = self._respond(match, method, path, split.query, body)
        if self.faults.after(method, obj_type, response.status):
            log(None, auth.method, "drop_after_commit")
            handler.drop()
            return
        log(response.status, auth.method)
        extra = [("Set-Cookie", auth.set_cookie)] if auth.set_cookie else []
        handler.send(response.status, response.body(), JSON_CONTENT_TYPE, extra)

    def _respond(self, match: re.Match[str] | None, method: str, path: str, query: str, body: bytes) -> WapiResponse:
        if match is None:
            return WapiResponse(404, error=errors.WapiError(404, "Not Found", "Client.NotFound", "Not Found"))
        version = match.group(1)
        if not version.startswith("2."):
            return WapiResponse(400, error=errors.proto(f"Version {version} not supported"))
        pairs = parse_qsl(query, keep_blank_values=True)
        return self.api.handle(WapiRequest(method, path, pairs, body))
