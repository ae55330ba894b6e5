"""Which pools of a backend exist, as the watch tells it, so that the backend keeps per-pool state (a parsed spec,
an index, resolved ids) for those only, even from an operation that ends, or starts, after its pool's deletion.

- `observe(ref, exists)` is called from the backend's `observe_pool`: a pool that exists is live; a deleted one is
  not, and its state is forgotten at once (the `forget` callback).
- Every operation of a pool runs inside `operation(ref)`; when it ends, a pool that is not live has its state
  forgotten again.
- A backend never told of an existing pool (called directly, as some tests do) keeps state for every pool until
  its deletion is observed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from ipam_provider.backend.contract import PoolRef


class LivePools:
    """The live pools of one backend, and the callback that forgets a pool's state."""

    def __init__(self, forget: Callable[[PoolRef], None]) -> None:
        self._forget = forget
        self._live: set[PoolRef] = set()
        self._watched = False  # told of an existing pool at least once

    def observe(self, ref: PoolRef, exists: bool) -> None:
        if exists:
            self._watched = True
            self._live.add(ref)
            return
        self._live.discard(ref)
        self._forget(ref)

    @contextlib.contextmanager
    def operation(self, ref: PoolRef) -> Iterator[None]:
        """Run one operation of pool `ref`; what it kept is forgotten when it ends unless the pool is live."""
        try:
            yield
        finally:
            if self._watched and ref not in self._live:
                self._forget(ref)
