"""The pace of a repair pass's listing requests (the `Pacer` of `ipam_provider.backend.repair`)."""

from __future__ import annotations

from aiolimiter import AsyncLimiter


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
