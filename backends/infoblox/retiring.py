"""Closing connections that were taken out of use without pulling the ground from under calls still on them.

Contract:
- `retire(connection)` closes the connection (its client, its certificate and CA files) only after the longest a
  call on it can take (`client.longest_call_seconds`), so calls in flight finish on it.
- `close()` closes every retired connection at once (the process is stopping).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backends.infoblox.connections import Connection


class Retiring:
    """The connections waiting to be closed."""

    def __init__(self) -> None:
        self._closing: dict[asyncio.Task[None], Connection] = {}

    def retire(self, connection: Connection) -> None:
        task = asyncio.get_running_loop().create_task(_close_later(connection))
        self._closing[task] = connection
        task.add_done_callback(lambda done: self._closing.pop(done, None))

    async def close(self) -> None:
        for task, connection in list(self._closing.items()):
            task.cancel()
            await connection.close()


async def _close_later(connection: Connection) -> None:
    await asyncio.sleep(connection.client.longest_call_seconds)
    await connection.close()
