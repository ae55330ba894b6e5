"""A TCP relay between the controllers and the API server, whose connections the runner can cut.

The controllers' kubeconfig names the relay's port; TLS passes through untouched (the API server's certificate is
for 127.0.0.1, where the relay listens too). `cut()` closes every relayed connection at once, as a network blip
would: each controller's watches end and resume from the last resourceVersion they saw, and every request in
flight fails. New connections are accepted again at once.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

log = structlog.get_logger(__name__)
CHUNK = 65536


class Link:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self.cut()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
        for task in list(self._tasks):
            task.cancel()

    def cut(self) -> int:
        """Close every relayed connection; answers how many there were (client sides)."""
        count = 0
        for writer in list(self._writers):
            count += 1
            writer.transport.abort()
        self._writers.clear()
        return count // 2

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers |= {client_writer, upstream_writer}
        pumps = [
            asyncio.create_task(_pump(client_reader, upstream_writer)),
            asyncio.create_task(_pump(upstream_reader, client_writer)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
                self._tasks.discard(task)
            for writer in (client_writer, upstream_writer):
                self._writers.discard(writer)
                writer.transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
