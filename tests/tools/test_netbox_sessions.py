"""The tests' own sessions to NetBox (tools/netbox_sessions.py): an idempotent request whose reused keep-alive
connection the server closed under it is sent once more on a new connection; a POST never is, and neither is a
request that timed out.

No NetBox here: a small local server makes the close happen at the worst moment, every time. It answers the first
request on a connection, keeps the connection open, waits for the next request and closes the connection with that
request unread. That is what a server closing idle keep-alive connections does when a request arrives just as it
closes one (gunicorn with its default 2 s keep-alive, hack/netbox/web.sh explains it): the kernel answers the
unread request with a reset, and the client gets ``ConnectionResetError``.
"""

from __future__ import annotations

import itertools
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import requests

from tests.support.netbox import NetBoxServer
from tools.netbox_sessions import netbox_session

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass
class ClosingServer:
    """HTTP/1.1 on 127.0.0.1. Per connection: the first request is answered (``answer=False``: held unanswered
    until the test ends), any later one is left unread and the connection closed. ``seen`` lists
    ``(connection number, method, path, outcome)`` in order; each entry is written before the client can see the
    outcome."""

    answer: bool = True
    seen: list[tuple[int, str, str, str]] = field(default_factory=list)
    listener: socket.socket = field(default_factory=lambda: socket.create_server(("127.0.0.1", 0)))
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self.done.set()
        self.listener.close()

    def _record(self, number: int, head: bytes, outcome: str) -> None:
        method, path = head.split(b"\r\n", 1)[0].decode().split(" ")[:2]
        with self.lock:
            self.seen.append((number, method, path, outcome))

    def _accept(self) -> None:
        for number in itertools.count(1):
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        with conn:
            head = _read_request(conn)
            if head is None:
                return
            if not self.answer:
                self._record(number, head, "held")
                self.done.wait(30)
                return
            self._record(number, head, "answered")
            conn.sendall(OK)
            readable, _, _ = select.select([conn], [], [], 30)
            if readable:
                unread = conn.recv(65536, socket.MSG_PEEK)  # peeked, not read: the close below resets
                if unread:
                    self._record(number, unread, "closed unread")
        # Closed here with the peeked request still unread: Linux answers with RST.


def _read_request(conn: socket.socket) -> bytes | None:
    """One request's head (its body, if any, is read and dropped); None if the client closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head


@pytest.fixture
def server() -> Iterator[ClosingServer]:
    instance = ClosingServer()
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture
def holding_server() -> Iterator[ClosingServer]:
    instance = ClosingServer(answer=False)
    instance.start()
    yield instance
    instance.stop()


def test_the_close_is_a_reset_for_a_plain_session(server: ClosingServer) -> None:
    """The mechanism, without the fix: a plain ``requests`` session reusing the connection gets the reset."""
    with requests.Session() as session:
        assert session.get(f"{server.url}/a", timeout=10).status_code == 200
        with pytest.raises(requests.ConnectionError, match="Connection aborted"):
            session.get(f"{server.url}/b", timeout=10)
    assert server.seen == [(1, "GET", "/a", "answered"), (1, "GET", "/b", "closed unread")]


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_an_idempotent_request_is_sent_again_on_a_new_connection(server: ClosingServer, method: str) -> None:
    with netbox_session() as session:
        assert session.request(method, f"{server.url}/a", timeout=10).status_code == 200
        assert session.request(method, f"{server.url}/b", json={"x": 1}, timeout=10).status_code == 200
    assert server.seen == [
        (1, method, "/a", "answered"),
        (1, method, "/b", "closed unread"),
        (2, method, "/b", "answered"),
    ]


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_a_post_or_patch_is_never_sent_again(server: ClosingServer, method: str) -> None:
    """The server may have carried the request out: the test must see that it cannot know."""
    with netbox_session() as session:
        assert session.request(method, f"{server.url}/a", json={"x": 1}, timeout=10).status_code == 200
        with pytest.raises(requests.ConnectionError, match="Connection aborted"):
            session.request(method, f"{server.url}/b", json={"x": 2}, timeout=10)
    assert server.seen == [(1, method, "/a", "answered"), (1, method, "/b", "closed unread")]


def test_a_timeout_is_not_retried(holding_server: ClosingServer) -> None:
    with netbox_session() as session, pytest.raises(requests.ReadTimeout):
        session.get(f"{holding_server.url}/slow", timeout=(5, 0.5))
    assert holding_server.seen == [(1, "GET", "/slow", "held")]


def test_a_refused_connection_is_not_retried() -> None:
    unused = socket.create_server(("127.0.0.1", 0))
    port = unused.getsockname()[1]
    unused.close()
    with netbox_session() as session, pytest.raises(requests.ConnectionError, match="refused"):
        session.get(f"http://127.0.0.1:{port}/", timeout=5)


def test_the_harness_pynetbox_client_uses_it(server: ClosingServer) -> None:
    """``NetBoxServer.api()``, the client tests use for their own NetBox calls, reconnects the same way."""
    api = NetBoxServer(url=server.url, token="nbt_unused.unused").api()
    assert api.status() == {}
    assert api.status() == {}
    assert [(number, outcome) for number, _, _, outcome in server.seen] == [
        (1, "answered"),
        (1, "closed unread"),
        (2, "answered"),
    ]
