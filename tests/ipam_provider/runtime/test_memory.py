"""A fixed mmap threshold keeps a large block off the heap after a larger one was freed."""

from __future__ import annotations

import subprocess
import sys

# Frees a 4 MiB mapped block (which raises glibc's dynamic threshold to 4 MiB), then allocates 1 MiB and prints by
# how many bytes the heap (brk) grew for it.
PROBE = """
import ctypes, sys
from ipam_provider.runtime.memory import map_large_blocks
fixed = sys.argv[1] == "fixed" and map_large_blocks()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def heap_bytes():
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith("[heap]"):
            start, end = line.split()[0].split("-")
            return int(end, 16) - int(start, 16)
    return 0
libc.free(libc.malloc(4 << 20))
before = heap_bytes()
block = libc.malloc(1 << 20)
print(fixed, heap_bytes() - before)
"""


def heap_growth(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    fixed, grown = out.split()
    return fixed, int(grown)


def test_a_large_block_is_mapped_on_its_own_after_a_larger_one_was_freed() -> None:
    assert heap_growth("fixed") == ("True", 0)


def test_without_the_fixed_threshold_the_heap_takes_the_block() -> None:
    """The probe can tell: glibc's dynamic threshold puts the same block on the heap."""
    fixed, grown = heap_growth("dynamic")
    assert fixed == "False"
    assert grown >= 1 << 20
