"""The HTTPS servers' limits (runtime/serving/guard.py), each on its own, over raw connections: bodies over 7 MiB are
413 (from Content-Length at once, else as soon as that much came, gzip undone), slow headers and idle connections
are closed, headers are capped, no body is read before the review's slot is held, and connections are counted from
their accept (a handshake never started counts too)."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from ipam_provider.cli import Endpoints
from ipam_provider.runtime.serving.certificates import CertificateFiles, ServingCertificate
from ipam_provider.runtime.serving.endpoint import MetricsEndpoint
from ipam_provider.runtime.serving.guard import MAX_BODY, Limits
from ipam_provider.runtime.serving.webhook import (
    ALLOWED,
    CONCURRENT_REVIEWS,
    ReviewRequest,
    Route,
    Verdict,
    WebhookServer,
)
from tests.support.cluster import wait_for

PATH = "/validate-example-com-v1-pool"
FAST = Limits(header_seconds=0.6, idle_seconds=1.5, connections=10)  # idle > header: each is seen alone


def review_body(**extra: object) -> bytes:
    request = {"uid": "u1", "operation": "CREATE", "kind": {"group": "example.com", "kind": "Pool"}, **extra}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


@dataclass
class Served:
    server: WebhookServer
    hold: asyncio.Event
    decided: list[str]

    async def wait_decided(self, count: int) -> None:
        async def enough() -> bool:
            return len(self.decided) >= count

        await wait_for(enough, timeout=30, interval=0.01, message=f"{count} reviews being decided")

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        return await asyncio.open_connection("127.0.0.1", self.server.port, ssl=context)

    async def exchange(self, head: bytes, body: bytes = b"", *, seconds: float = 10.0) -> int:
        """The status of the answer to `head` (the request line and headers, without the blank line) and `body`."""
        reader, writer = await self.connect()
        try:
            writer.write(head + b"\r\n\r\n" + body)
            await writer.drain()
            return await asyncio.wait_for(status_of(reader), seconds)
        finally:
            writer.close()


async def status_of(reader: asyncio.StreamReader) -> int:
    line = await reader.readline()
    return int(line.split()[1]) if line else 0  # 0: closed without an answer


def post(length: int | None, *headers: str, query: str = "") -> bytes:
    lines = [f"POST {PATH}{query} HTTP/1.1", "Host: webhook", "Content-Type: application/json", *headers]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    return "\r\n".join(lines).encode()


def chunked(body: bytes, size: int = 1 << 20) -> bytes:
    pieces = [b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)]
    return b"".join(pieces) + b"0\r\n\r\n"


@pytest_asyncio.fixture
async def served() -> AsyncIterator[Served]:
    hold, decided = asyncio.Event(), []
    hold.set()

    async def decide(request: ReviewRequest) -> Verdict:
        decided.append(request.uid)
        await hold.wait()
        return ALLOWED

    server = WebhookServer(ServingCertificate.load(CertificateFiles(None)), FAST)
    await server.start("127.0.0.1", 0)
    server.use({PATH: Route("Pool", decide)})
    try:
        yield Served(server, hold, decided)
    finally:
        hold.set()
        await server.close()


async def test_a_review_is_answered(served: Served) -> None:
    body = review_body()
    assert await served.exchange(post(len(body)), body) == 200
    assert await served.exchange(post(None), chunked(body)) == 200
    assert served.decided == ["u1", "u1"]


async def test_a_content_length_over_the_limit_is_413_before_any_body_came(served: Served) -> None:
    started = time.monotonic()
    assert await served.exchange(post(MAX_BODY + 1), seconds=10) == 413
    assert time.monotonic() - started < FAST.idle_seconds  # not after waiting in vain for the body
    assert served.decided == []


async def test_a_chunked_body_over_the_limit_is_413(served: Served) -> None:
    body = b"{" + b" " * MAX_BODY + b"}"  # JSON whitespace: decodable, were it read
    assert await served.exchange(post(None), chunked(body)) == 413
    assert served.decided == []


async def test_a_gzip_bomb_is_413_counted_after_decompression(served: Served) -> None:
    inner = review_body(padding=" " * (MAX_BODY + 1024))  # a valid review, once inflated
    bomb = gzip.compress(inner, compresslevel=9)
    assert len(bomb) < 64 * 1024
    assert await served.exchange(post(len(bomb), "Content-Encoding: gzip"), bomb) == 413
    small = gzip.compress(review_body())
    assert await served.exchange(post(len(small), "Content-Encoding: gzip"), small) == 200
    assert served.decided == ["u1"]


async def test_slow_headers_are_cut_off(served: Served) -> None:
    reader, writer = await served.connect()
    started = time.monotonic()
    try:
        writer.write(b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: webhook\r\n")
        for _ in range(40):  # a byte every 0.1 s: never idle, never done
            if reader.at_eof():
                break
            writer.write(b"X")
            await writer.drain()
            await asyncio.sleep(0.1)
        assert await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionError:
        pass  # aborted: as good as closed
    finally:
        writer.close()
    assert time.monotonic() - started < FAST.header_seconds + 2.9  # before the 4 s of trickling end


async def test_an_idle_connection_is_closed_and_a_busy_one_kept(served: Served) -> None:
    reader, writer = await served.connect()
    body = review_body()
    try:
        for _ in range(3):  # requests closer than the idle timeout keep the connection
            writer.write(post(len(body)) + b"\r\n\r\n" + body)
            assert await status_of(reader) == 200
            await reader.readuntil(b'"allowed": true}}')
            await asyncio.sleep(FAST.idle_seconds / 3)
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), FAST.idle_seconds + 10) == b""
        assert time.monotonic() - started < FAST.idle_seconds + 5  # long before anything else would close it
    finally:
        writer.close()


async def test_headers_are_capped_at_a_mebibyte_in_all(served: Served) -> None:
    body = review_body()
    many = [f"X-Header-{n}: {'v' * 100}" for n in range(40)]
    assert await served.exchange(post(len(body), *many), body) == 400
    assert await served.exchange(post(len(body), "X-Long: " + "v" * 40_000), body) == 400
    assert await served.exchange(post(len(body), "X-Long: " + "v" * 20_000), body) == 200  # 8 KiB is not the limit
    assert await served.exchange(post(len(body), *many[:25]), body) == 200


async def hold_every_slot(served: Served) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """CONCURRENT_REVIEWS reviews posted and decided, each kept in its slot until `served.hold` is set."""
    served.hold.clear()
    body = review_body()
    held = []
    for _ in range(CONCURRENT_REVIEWS):  # each request sent at once: its header timeout never runs out
        reader, writer = await served.connect()
        writer.write(post(len(body)) + b"\r\n\r\n" + body)
        held.append((reader, writer))
    await served.wait_decided(CONCURRENT_REVIEWS)
    return held


async def test_no_body_is_read_before_a_slot_is_held(served: Served) -> None:
    held = await hold_every_slot(served)
    reader, writer = await served.connect()
    try:
        writer.write(post(8, query="?timeout=30s") + b"\r\n\r\nnot json")  # a malformed body: 400 once read
        answer = asyncio.create_task(status_of(reader))
        await asyncio.sleep(0.5)
        assert not answer.done()  # not even read while every slot is held
        served.hold.set()
        assert await asyncio.wait_for(answer, 15) == 400
    finally:
        writer.close()
        for _, other in held:
            other.close()


async def test_a_review_without_a_slot_in_its_budget_is_429(served: Served) -> None:
    held = await hold_every_slot(served)
    body = review_body()
    try:
        assert await served.exchange(post(len(body), query="?timeout=1s"), body, seconds=15) == 429
    finally:
        for _, writer in held:
            writer.close()


async def test_connections_are_counted_from_their_accept(served: Served) -> None:
    silent = [await asyncio.open_connection("127.0.0.1", served.server.port) for _ in range(FAST.connections)]
    try:
        extra, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
        assert await asyncio.wait_for(extra.read(), 10) == b""  # one too many: closed at once
        writer.close()
        listener = served.server.listener
        assert listener is not None and listener.refused >= 1
        # The silent ones never start their TLS handshake: they are closed after the header timeout...
        for reader, _ in silent:
            assert await asyncio.wait_for(reader.read(), FAST.header_seconds + 10) == b""
    finally:
        for _, other in silent:
            other.close()
    # ...and their places are free again.
    body = review_body()
    assert await served.exchange(post(len(body)), body) == 200
    assert listener.open <= 1


async def test_the_metrics_endpoint_has_the_same_limits() -> None:
    endpoint = MetricsEndpoint(None, limits=FAST)  # plain HTTP
    await endpoint.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: m\r\n")  # never ends its headers
        assert await asyncio.wait_for(reader.read(), FAST.header_seconds + 10) == b""
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: m\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode())
        assert await asyncio.wait_for(status_of(reader), 10) == 413
        writer.close()
    finally:
        await endpoint.close()


async def test_a_client_that_goes_away_or_sends_bad_gzip_logs_no_error(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """Under a flood every such request would otherwise log an error with its traceback."""
    for head in (post(None), post(100)):
        _, writer = await served.connect()
        writer.write(head + b"\r\n\r\n" + (b"10\r\n{{{{" if b"chunked" in head else b"{{{{"))
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.transport.abort()  # gone, mid-body
    garbage = b"\x1f\x8b\x08\x00not gzip at all"
    assert await served.exchange(post(len(garbage), "Content-Encoding: gzip"), garbage) == 400
    await asyncio.sleep(0.2)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


async def test_the_probes_have_the_same_limits() -> None:
    endpoints = Endpoints()
    probes = await endpoints._serve_probes(("127.0.0.1", 0), "127.0.0.1:0", FAST)
    endpoints.probes = probes
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", probes.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: p\r\n")  # never ends its headers
        assert await asyncio.wait_for(reader.read(), FAST.header_seconds + 10) == b""
        writer.close()
    finally:
        await endpoints.close()
