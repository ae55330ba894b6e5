"""A tiny local HTTP server that records the headers of every request and answers each with one fixed reply.

For checks of what a client sends (its User-Agent) where the real server keeps no record of it: a NetBox that
refuses every token, or an API server address a KubeClient is pointed at.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Recorder:
    """What the server saw: (method, path, headers) of every request, oldest first."""

    status: int
    body: Any
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    url: str = ""

    def user_agents(self) -> set[str]:
        return {headers.get("User-Agent", "") for _, _, headers in self.requests}


@contextmanager
def recording_server(status: int = 403, body: Any = None) -> Iterator[Recorder]:
    """Serve on 127.0.0.1 (a free port) until the block ends, answering every request `status` with `body` (JSON)."""
    recorder = Recorder(status, body if body is not None else {"detail": "Invalid token"})
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            with lock:
                recorder.requests.append((self.command, self.path, dict(self.headers.items())))
            payload = json.dumps(recorder.body).encode()
            self.send_response(recorder.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="recording-server", daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
