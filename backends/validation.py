"""How the backends refuse a pool's spec: `PoolSpecError`, and the message of a spec their pydantic models refuse."""

from __future__ import annotations

from pydantic import ValidationError


class PoolSpecError(ValueError):
    """A pool spec its backend refuses: `messages`, every problem found, each saying what to fix and naming the
    field, joined by `; ` in `str(error)`."""

    def __init__(self, *messages: str) -> None:
        if not messages:
            raise ValueError("PoolSpecError needs at least one message")
        self.messages = messages
        super().__init__("; ".join(messages))


def spec_error(error: ValidationError) -> str:
    """The first problem pydantic found in a spec, as `spec.<field path>: <message>` (the path in the model's
    field names or aliases, as pydantic reports them)."""
    first = error.errors()[0]
    return f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
