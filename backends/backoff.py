"""The wait between attempts of a retried call to an external system, shared by the backends' clients."""

from __future__ import annotations

import random


def backoff_delay(attempt: int, base: float, ceiling: float) -> float:
    """Seconds to wait after failed attempt `attempt` (0-based): `base`, doubled with each attempt and at most
    `ceiling`, with ±20 % jitter."""
    return float(min(ceiling, base * 2**attempt) * random.uniform(0.8, 1.2))


CONTENDED_WAIT_SECONDS = 0.5  # between listings of a contended requested address by the oldest object's creator
RACE_RETRY_SECONDS = (1.0, 3.0)  # bounds of the random retry of a claim that gave way to a racer


def race_retry_seconds() -> float:
    """When a claim that gave way to a racer for a requested address asks again: soon, at a random moment, so that
    racers drift apart."""
    return random.uniform(*RACE_RETRY_SECONDS)
