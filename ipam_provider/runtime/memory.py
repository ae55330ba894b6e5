"""The C library's allocator, set for a process that runs for months.

The image runs the controller under jemalloc (ALLOCATOR_ENV, which the Dockerfile sets): as objects come and go,
glibc's heap keeps growing although what the process holds does not, and jemalloc's grows less (docs/performance.md,
Soak). Where the controller runs under glibc's malloc all the same (a pip install), `map_large_blocks` limits that:
glibc serves a block below its mmap threshold from the heap, which it can give back only from the top. Its threshold
is dynamic: once a mapped block is freed, it rises to that block's size (up to 32 MiB), so a burst's large buffers
(response bodies, decoded lists) later come from the heap, and one long-lived small block above them keeps their
pages resident. A fixed threshold maps every large block on its own and unmaps it when freed.
"""

from __future__ import annotations

import ctypes

ALLOCATOR_ENV = {"LD_PRELOAD": "libjemalloc.so.2", "MALLOC_CONF": "narenas:1"}
"""The environment that runs a process under jemalloc (Debian's libjemalloc2), with one arena: most allocations
come from the event loop's thread, and under jemalloc's defaults each other thread that allocates (the blocking
clients' threads) would get an arena of its own, holding memory of its own."""
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD = 64 * 1024
"""Blocks of this many bytes or more are mapped on their own (glibc starts at 128 KiB, then rises)."""


def map_large_blocks(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes; False, and nothing changed, under another C library."""
    libc = ctypes.CDLL(None)
    try:
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - musl has a mallopt that ignores this parameter
    except AttributeError:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
