"""Errors raised by the Kubernetes client facade."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A non-2xx answer from the API server, with its Status `reason` and `message`."""

    def __init__(self, status: int, reason: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def conflict(self) -> bool:
        """An optimistic-concurrency conflict (stale resourceVersion or a failed precondition)."""
        return self.status == 409 and self.reason != "AlreadyExists"

    @property
    def throttled(self) -> bool:
        """429: the API server asks to come back later (its rate limits, or storage still initialising)."""
        return self.status == 429

    @property
    def gone(self) -> bool:
        return self.status == 410


class KubeconfigError(Exception):
    """No usable client configuration: the message is one line naming what is missing and how to give it."""
