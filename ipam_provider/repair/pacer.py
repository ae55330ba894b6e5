"""The pace of a repair pass: its listing requests (the `Pacer` of `ipam_provider.backend.repair`), and its turns
on the event loop (`Turns`)."""

from __future__ import annotations

import asyncio
import time

from aiolimiter import AsyncLimiter

TURN_SECONDS = 0.005  # a pass's work on the event loop between two turns given to the other tasks


class RatePacer:
    """At most `per_second` requests a second, evenly spaced (no bursts): `wait()` returns when the next may go.
    Made on the event loop that uses it."""

    def __init__(self, per_second: float) -> None:
        if per_second <= 0:
            raise ValueError(f"the request rate must be greater than zero, got {per_second}")
        self.per_second = per_second
        self._limiter = AsyncLimiter(1, 1.0 / per_second)

    async def wait(self) -> None:
        await self._limiter.acquire()


class CountingPacer:
    """Counts the requests it paces and lets each go at once (for tests and for measuring a pass's cost)."""

    def __init__(self) -> None:
        self.waits = 0

    async def wait(self) -> None:
        self.waits += 1


class Turns:
    """Lets a long loop over pools give the event loop's other tasks (watches, workers) their turn: `take()` yields
    once `seconds` of work have gone by since the last yield (0: at every call)."""

    def __init__(self, seconds: float = TURN_SECONDS) -> None:
        self.seconds = seconds
        self.given = 0  # turns given so far
        self._since = time.perf_counter()

    async def take(self) -> None:
        if time.perf_counter() - self._since >= self.seconds:
            await asyncio.sleep(0)
            self.given += 1
            self._since = time.perf_counter()
