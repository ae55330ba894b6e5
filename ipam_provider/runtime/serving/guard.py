"""What one HTTPS server (the admission webhook, the metrics endpoint) lets a client hold, as controller-runtime's
servers bound it: a body of at most MAX_BODY bytes once any Content-Encoding is undone (413; from Content-Length at
once, before any of the body is read); a TLS handshake within `Limits.header_seconds` of the accept, then request
headers within as long of its end or of the request's first byte (as Go's servers time both), else the connection
is dropped; a
connection idle between requests closed after `Limits.idle_seconds`; at most HEADER_BYTES of request line and
headers in all (400); and at most `Limits.connections` connections open at once, handshakes included: one more is
closed as soon as it is accepted, and counted in `Listener.refused`.

`Listener` accepts for an aiohttp `AppRunner` (set up, no site) on its own sockets, so that a connection counts from
its accept until its socket closes, whatever becomes of its handshake.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = structlog.get_logger(__name__)

MAX_BODY = 7 * 1024 * 1024  # controller-runtime's webhook limit; counted after any Content-Encoding is undone
HEADER_SECONDS = 32.0  # controller-runtime's ReadHeaderTimeout
IDLE_SECONDS = 90.0  # controller-runtime's IdleTimeout
CONNECTIONS = 128
HEADER_BYTES = 1 << 20  # Go's DefaultMaxHeaderBytes, which controller-runtime keeps: the request line and headers
REQUEST_LINE_BYTES = 8192
HEADERS = 32
HEADER_LINE_BYTES = (HEADER_BYTES - REQUEST_LINE_BYTES) // HEADERS  # name and value of one header
LINGER_SECONDS = 0.5  # an unread body is drained this long before the close, so that the client reads the answer
SHUTDOWN_SECONDS = 5.0  # a TLS close_notify is waited for this long
BACKLOG = 128
ACCEPT_RETRY_SECONDS = 1.0  # after an accept failed (out of descriptors), as asyncio's own servers wait
FULL_REPORT_SECONDS = 10.0  # at most one warning this often while connections are refused


@dataclass(frozen=True)
class Limits:
    header_seconds: float = HEADER_SECONDS
    idle_seconds: float = IDLE_SECONDS
    connections: int = CONNECTIONS


DEFAULT_LIMITS = Limits()


class GuardedHandler(web.RequestHandler):
    """aiohttp's connection handler, closing a connection whose request headers take longer than `header_seconds`
    to arrive; `released` is called once when the connection is lost. `request_started` and `request_done` are
    called by `track_requests` around each request's handling."""

    def __init__(self, manager: web.Server, *, header_seconds: float, released: Callable[[], None], **kw: Any) -> None:
        super().__init__(manager, **kw)
        self._header_seconds = header_seconds
        self._released = released
        self._header_timer: asyncio.TimerHandle | None = None
        self._idle = True  # between requests: the next byte starts one

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._idle and self._header_timer is None:
            self._start_header_timer()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)
        self._released()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A request that does not parse (headers too long or too many, bad syntax, a body that does not decode) or
        whose client went away while it was read is the client's doing: one debug line, not an error with a
        traceback per request of a flood."""
        error = kw.get("exc_info")
        if isinstance(error, HttpProcessingError | web.RequestPayloadError | ConnectionError):
            log.debug("bad HTTP request", error=str(error) or type(error).__name__)
            return
        super().log_exception(*args, **kw)

    def request_started(self) -> None:
        self._idle = False
        self._stop_header_timer()

    def request_done(self) -> None:
        self._idle = True

    def _start_header_timer(self) -> None:
        self._header_timer = asyncio.get_running_loop().call_later(self._header_seconds, self._headers_late)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        transport = self.transport
        if transport is not None:
            transport.abort()  # a hostile client: no TLS close_notify to wait for
        self.force_close()


class BodyTooLarge(Exception):
    """A request body is longer than MAX_BODY."""


def too_large() -> web.Response:
    """413, and the connection closed once the answer is sent."""
    response = web.Response(status=413, text=f"the body is longer than {MAX_BODY} bytes\n")
    response.force_close()
    return response


async def read_body(request: web.Request, limit: int = MAX_BODY) -> bytes:
    """The request's body as the handler sees it (decompressed). Raises BodyTooLarge as soon as more than `limit`
    bytes came, holding at most one decompressed chunk more."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


@web.middleware
async def track_requests(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Tells the request's GuardedHandler when its headers were read and when its handling ended; a request whose
    Content-Length is over MAX_BODY is answered 413 at once."""
    protocol = request.protocol
    guarded = protocol if isinstance(protocol, GuardedHandler) else None
    if guarded is not None:
        guarded.request_started()
    try:
        if (request.content_length or 0) > MAX_BODY:
            return too_large()
        return await handler(request)
    finally:
        if guarded is not None:
            guarded.request_done()


class Listener:
    """Accepts connections on host:port for `runner` (set up, with `track_requests` among its middlewares), over TLS
    with `context` (None: plain HTTP), within `limits`."""

    def __init__(self, runner: web.AppRunner, context: ssl.SSLContext | None, limits: Limits) -> None:
        self.limits = limits
        self.open = 0  # connections accepted and not yet closed
        self.refused = 0  # connections closed at once: `limits.connections` were open
        self.port = 0
        self._runner, self._context = runner, context
        self._sockets: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._reported = float("-inf")

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port (port 0: any free one, then in `port`). Raises OSError when it cannot bind."""
        self._sockets = await listening_sockets(host, port)
        self.port = int(self._sockets[0].getsockname()[1])
        for sock in self._sockets:
            self._spawn(self._accept(sock))

    async def close(self) -> None:
        """Stop accepting, abandon the handshakes under way, and close the sockets (the runner's cleanup closes the
        connections it serves)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as error:  # EMFILE, ENFILE, ENOBUFS: wait rather than spin
                log.warning("cannot accept a connection", error=str(error), port=self.port)
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            if self.open >= self.limits.connections:
                conn.close()
                self._refuse()
                continue
            self.open += 1
            self._spawn(self._connect(conn))

    def _refuse(self) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._reported >= FULL_REPORT_SECONDS:
            self._reported = now
            log.warning("too many connections; closing new ones", port=self.port, open=self.open, refused=self.refused)

    async def _connect(self, conn: socket.socket) -> None:
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open -= 1

        server = self._runner.server
        assert server is not None, "the runner is set up before it listens"
        loop = asyncio.get_running_loop()
        tls = self._context is not None
        try:
            await loop.connect_accepted_socket(
                lambda: self._handler(server, release),
                conn,
                ssl=self._context,
                ssl_handshake_timeout=self.limits.header_seconds if tls else None,
                ssl_shutdown_timeout=SHUTDOWN_SECONDS if tls else None,
            )
        except asyncio.CancelledError:  # the listener closing
            conn.close()
            release()
            raise
        except Exception:  # a failed or slow handshake, a reset: nothing to answer
            conn.close()
            release()

    def _handler(self, server: web.Server, release: Callable[[], None]) -> GuardedHandler:
        return GuardedHandler(
            server,
            loop=asyncio.get_running_loop(),
            header_seconds=self.limits.header_seconds,
            released=release,
            keepalive_timeout=self.limits.idle_seconds,
            max_line_size=REQUEST_LINE_BYTES,
            max_field_size=HEADER_LINE_BYTES,
            max_headers=HEADERS,
            lingering_time=LINGER_SECONDS,
            access_log=None,
        )


async def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for host:port ("" every interface), on one port for all addresses.
    Raises OSError (socket.gaierror for a name that does not resolve)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if len(sockets) > 1:  # port 0: the others on the first one's port
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets
