"""An HTTPS relay between the controllers and the API server, which can end their watches and cut connections.

The controllers' kubeconfig names the relay's port; the relay serves the API server's own certificate (issued for
127.0.0.1, where both listen), so the kubeconfig's CA and token are unchanged. Every request is forwarded as it
came and every answer streamed back as it comes (compressed bodies untouched).

- `end_watches()` ends every watch stream in flight *cleanly* (the final chunk), as the API server does when a
  watch's timeout is reached: a client then resumes its watch from the last resourceVersion it saw. After an etcd
  compaction that resourceVersion is gone and the API server (without a watch cache) answers 410 Gone.
- `expired` counts the watch answers carrying a 410 ERROR event that went through the relay.
- `cut()` aborts every connection in flight, as a network blip would.
While the API server is down the relay answers 503, as a load balancer in front of it would.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"})
EXPIRED_MARK = b'"code":410'


class Link:
    def __init__(self, upstream: str, ca: Path, cert: Path, key: Path) -> None:
        """`upstream`: the API server's https URL; `ca` verifies it; `cert`/`key` are served to the clients."""
        self.upstream = upstream.rstrip("/")
        self.port = 0
        self.expired = 0
        self.expiry_seen = asyncio.Event()  # set at each 410 answer relayed
        self._client_tls = ssl.create_default_context(cafile=str(ca))
        self._server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_tls.load_cert_chain(str(cert), str(key))
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._watches: set[asyncio.Task[None]] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self._transports: set[asyncio.Transport] = set()

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(ssl=self._client_tls, limit=0)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._server_tls)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Close the upstream side first (so that every stream in flight ends at once), then the server."""
        if self._session is not None:
            await self._session.close()
        for pump in list(self._pumps):
            pump.cancel()
        self.cut()
        if self._runner is not None:
            await self._runner.cleanup()

    def end_watches(self) -> int:
        """End every watch stream in flight cleanly; answers how many."""
        watches = list(self._watches)
        for pump in watches:
            pump.cancel()
        return len(watches)

    def cut(self) -> int:
        """Abort every connection with a request in flight; answers how many."""
        transports = list(self._transports)
        for transport in transports:
            transport.abort()
        self._transports.clear()
        return len(transports)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        transport = request.transport
        if transport is not None:
            self._transports.add(transport)
        try:
            upstream = await self._session.request(
                request.method,
                self.upstream + request.rel_url.raw_path_qs,
                headers=headers,
                data=body or None,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            self._transports.discard(transport)
            return web.json_response(_status(503, f"the API server is unreachable: {error}"), status=503)
        try:
            return await self._relay(request, upstream)
        finally:
            upstream.close()
            self._transports.discard(transport)

    async def _relay(self, request: web.Request, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for name, value in upstream.headers.items():
            if name.lower() not in HOP_BY_HOP:
                response.headers.add(name, value)
        try:
            await response.prepare(request)
        except ConnectionError:  # the client went away meanwhile (a controller was killed)
            return response
        watch = request.query.get("watch") in ("true", "1")
        pump = asyncio.create_task(self._pump(upstream, response, watch))
        self._pumps.add(pump)
        if watch:
            self._watches.add(pump)
        try:
            await asyncio.wait({pump})
        finally:
            self._watches.discard(pump)
            self._pumps.discard(pump)
            if not pump.done():
                pump.cancel()
        with contextlib.suppress(ConnectionError, RuntimeError):
            if pump.cancelled() or pump.exception() is None:
                await response.write_eof()
        return response

    async def _pump(self, upstream: aiohttp.ClientResponse, response: web.StreamResponse, watch: bool) -> None:
        async for chunk in upstream.content.iter_any():
            if watch and EXPIRED_MARK in chunk.replace(b" ", b""):
                self.expired += 1
                self.expiry_seen.set()
            await response.write(chunk)


def _status(code: int, message: str) -> dict[str, object]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}
