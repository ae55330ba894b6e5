"""A hostile client of the admission webhook's port, run as its own process (`python -m tests.support.webhook_flood
--port P --seconds S`), so that its CPU is not the measuring side's: for `--seconds` it keeps up, at once,

- `--big` loops posting 8 MiB bodies with their Content-Length, `--chunked` loops posting 8 MiB chunked bodies and
  `--bombs` loops posting gzip bombs (32 KiB that inflate to 32 MiB): each answer's status is counted (0: the
  connection closed without one);
- `--slow` slowloris connections (TLS, then a request's headers a byte a second), reopened when dropped: their
  lifetimes are kept;
- `--idle` plain TCP connections that never start their TLS handshake, reopened when closed: those closed at once
  (the server was full) and the others are counted.

It prints one JSON object of those figures on stdout when done. `test_webhook_load.py` and
`benchmarks/webhook_flood.py` run it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import ssl
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.objects import claim

PATH = "/validate-ipam-cluster-x-k8s-io-v1alpha2-inclusterippool"
BODY = 8 * 1024 * 1024  # over the 7 MiB limit
BOMB_INFLATED = 32 * 1024 * 1024
CHUNK = 256 * 1024
ANSWER_SECONDS = 15.0
POSTS = ("big", "chunked", "bomb")
AT_ONCE_SECONDS = 0.2  # an idle connection closed sooner was refused at its accept


@dataclass
class Figures:
    statuses: dict[str, Counter[int]] = field(
        default_factory=lambda: {k: Counter() for k in ("big", "chunked", "bomb")}
    )
    slow_lifetimes: list[float] = field(default_factory=list)
    idle_refused: int = 0
    idle_dropped: int = 0

    def summary(self, seconds: float) -> dict[str, Any]:
        lifetimes = sorted(self.slow_lifetimes)
        return {
            "seconds": round(seconds, 1),
            "statuses": {kind: {str(k): v for k, v in counts.items()} for kind, counts in self.statuses.items()},
            "slow_dropped": len(lifetimes),
            "slow_max_seconds": round(lifetimes[-1], 2) if lifetimes else None,
            "idle_refused": self.idle_refused,
            "idle_dropped": self.idle_dropped,
        }


def client_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def head(length: int | None, *headers: str) -> bytes:
    lines = [f"POST {PATH} HTTP/1.1", "Host: webhook", "Content-Type: application/json", *headers]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def post(port: int, start: bytes, pieces: list[bytes]) -> int:
    """Send `start` then `pieces` while reading the answer; its status, 0 when the connection closed without one."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context())
    answer = asyncio.ensure_future(reader.readline())
    try:
        writer.write(start)
        for piece in pieces:
            if answer.done():
                break
            writer.write(piece)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    try:
        line = await asyncio.wait_for(answer, ANSWER_SECONDS)
    except (ConnectionError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError):
        line = b""
    finally:
        writer.close()
    return int(line.split()[1]) if line.startswith(b"HTTP/") else 0


def chunks_of(body: bytes, chunked: bool) -> list[bytes]:
    pieces = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]
    if chunked:
        pieces = [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces] + [b"0\r\n\r\n"]
    return pieces


async def posting(port: int, kind: str, figures: Figures, until: float) -> None:
    body = b"{" + b" " * BODY + b"}"
    if kind == "bomb":
        body = gzip.compress(b"{" + b" " * BOMB_INFLATED + b"}", compresslevel=9)
    start = {
        "big": head(len(body)),
        "chunked": head(None),
        "bomb": head(len(body), "Content-Encoding: gzip"),
    }[kind]
    pieces = chunks_of(body, kind == "chunked")
    while time.monotonic() < until:
        try:
            status = await post(port, start, pieces)
        except OSError:
            status = -1  # could not connect
            await asyncio.sleep(0.1)
        figures.statuses[kind][status] += 1


async def slowloris(port: int, figures: Figures, until: float) -> None:
    while time.monotonic() < until:
        opened = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context())
        except OSError:
            await asyncio.sleep(0.5)
            continue
        try:
            writer.write(f"POST {PATH} HTTP/1.1\r\nHost: webhook\r\nX-Slow: ".encode())
            while time.monotonic() < until and not reader.at_eof():
                writer.write(b"x")
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1), 1.0)  # b"" once the server closed
            figures.slow_lifetimes.append(time.monotonic() - opened)
        except (ConnectionError, ssl.SSLError):
            figures.slow_lifetimes.append(time.monotonic() - opened)
        finally:
            writer.close()


async def idle_connection(port: int, figures: Figures, until: float) -> None:
    while time.monotonic() < until:
        opened = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.5)
            continue
        try:
            with contextlib.suppress(TimeoutError, ConnectionError):
                await asyncio.wait_for(reader.read(), max(until - time.monotonic(), 0.01))
        finally:
            writer.close()
        if time.monotonic() >= until:
            return
        if time.monotonic() - opened < AT_ONCE_SECONDS:
            figures.idle_refused += 1
            await asyncio.sleep(0.05)
        else:
            figures.idle_dropped += 1


async def flood(port: int, seconds: float, counts: argparse.Namespace) -> dict[str, Any]:
    figures = Figures()
    started = time.monotonic()
    until = started + seconds
    tasks = [
        *(posting(port, "big", figures, until) for _ in range(counts.big)),
        *(posting(port, "chunked", figures, until) for _ in range(counts.chunked)),
        *(posting(port, "bomb", figures, until) for _ in range(counts.bombs)),
        *(slowloris(port, figures, until) for _ in range(counts.slow)),
        *(idle_connection(port, figures, until) for _ in range(counts.idle)),
    ]
    await asyncio.gather(*tasks)
    return figures.summary(time.monotonic() - started)


# The measuring side: what the load test and the benchmark watch while the flood runs.


@dataclass
class Observed:
    renewals: list[float] = field(default_factory=list)  # each distinct renewTime of the lease, epoch seconds
    holders: set[str] = field(default_factory=set)
    rss_kib: list[int] = field(default_factory=list)

    def renewal_gaps(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.renewals, self.renewals[1:], strict=False)]


def rss_kib(pid: int) -> int:
    """The process's resident set, KiB (0 once it is gone)."""
    try:
        status = open(f"/proc/{pid}/status").read()  # noqa: SIM115 - one small read
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)


async def observe(read_lease: Any, pid: int, observed: Observed, stop: asyncio.Event) -> None:
    """Every 0.2 s until `stop`: the lease (through the coroutine function `read_lease`) and the RSS of `pid`."""
    while not stop.is_set():
        lease = await read_lease()
        spec = (lease or {}).get("spec") or {}
        renewed = spec.get("renewTime")
        if renewed:
            when = datetime.fromisoformat(str(renewed)).timestamp()
            if not observed.renewals or when != observed.renewals[-1]:
                observed.renewals.append(when)
        observed.holders.add(str(spec.get("holderIdentity") or ""))
        observed.rss_kib.append(rss_kib(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def run_flood(port: int, seconds: float, *flags: str) -> dict[str, Any]:
    """This module's flood in a process of its own; its figures."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.webhook_flood",
        f"--port={port}",
        f"--seconds={seconds}",
        *flags,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    assert process.returncode == 0, out
    result: dict[str, Any] = json.loads(out)
    return result


async def fulfilment_seconds(kube: KubeClient, namespace: str, name: str, pool_name: str, timeout: float) -> float:
    """Create a claim of the InClusterIPPool `pool_name` and wait for its status to name its IPAddress: the seconds
    it took. Raises TimeoutError after `timeout`."""
    started = time.monotonic()
    await kube.create(CLAIMS, claim(name, pool_name), namespace)
    async with asyncio.timeout(timeout):
        while True:
            found = await kube.get(CLAIMS, name, namespace)
            if ((found or {}).get("status") or {}).get("addressRef", {}).get("name"):
                return time.monotonic() - started
            await asyncio.sleep(0.05)


async def claims_at_pace(
    kube: KubeClient, namespace: str, prefix: str, count: int, every: float, timeout: float
) -> list[float]:
    """`count` claims of the pool `net`, one created every `every` seconds (not waiting for the one before): their
    latencies."""
    tasks = []
    for number in range(count):
        tasks.append(asyncio.create_task(fulfilment_seconds(kube, namespace, f"{prefix}-{number}", "net", timeout)))
        await asyncio.sleep(every)
    return list(await asyncio.gather(*tasks))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--big", type=int, default=2)
    parser.add_argument("--chunked", type=int, default=1)
    parser.add_argument("--bombs", type=int, default=2)
    parser.add_argument("--slow", type=int, default=40)
    parser.add_argument("--idle", type=int, default=150)
    args = parser.parse_args(argv)
    result = asyncio.run(flood(args.port, args.seconds, args))
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
