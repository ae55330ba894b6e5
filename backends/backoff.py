"""The wait between attempts of a retried call to an external system, shared by the backends' clients."""

from __future__ import annotations

import random


def backoff_delay(attempt: int, base: float, ceiling: float) -> float:
    """Seconds to wait after failed attempt `attempt` (0-based): `base`, doubled with each attempt and at most
    `ceiling`, with ±20 % jitter."""
    return float(min(ceiling, base * 2**attempt) * random.uniform(0.8, 1.2))
