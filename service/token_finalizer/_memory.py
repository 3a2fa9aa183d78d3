"""Keep large transient buffers from pinning memory in a long-running process.

Every finalize of a long rollout allocates tens of MB (token arrays, the
encoded answer) and frees them again, often on worker threads. Two glibc
defaults make RSS ratchet up under that pattern:

- the mmap threshold rises each time such a block is freed, so later blocks
  of that size come from the heap, where freed memory stays resident;
- every thread that allocates may get an arena of its own (up to eight per
  core), and memory freed in one arena is not reused by another.

Capping the arenas keeps the heap from fragmenting per thread. Pinning the
threshold would keep large blocks on mmap, which returns them to the OS on
free, but every large allocation then pays fresh page faults: measured with
`python -m bench.allocator` it made large finalizes 1.6-1.8x slower and did
not lower their peak, while capping the arenas alone was as fast as glibc's
defaults with a 8-28% lower peak. So only the arenas are capped by default.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

from token_finalizer._constants import MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_BYTES

__all__ = ["tune_allocator"]

# From glibc's malloc.h.
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def tune_allocator(*, pin_mmap_threshold: bool = False) -> bool:
    """Cap glibc's arenas (and pin its mmap threshold); False (no change) on other C libraries."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    pinned = not pin_mmap_threshold or mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES)
    capped = mallopt(_M_ARENA_MAX, MALLOC_ARENA_MAX)
    return bool(pinned and capped)
