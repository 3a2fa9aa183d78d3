"""Keep large transient buffers from pinning memory in a long-running process.

Every finalize of a long rollout allocates tens of MB (token arrays, the
encoded answer) and frees them again. glibc raises its mmap threshold each
time such a block is freed, so later blocks of that size come from the heap,
where freed memory stays resident: RSS ratchets up by about the size of one
large answer. Pinning the threshold keeps large blocks on mmap, which returns
them to the OS on free.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

from token_finalizer._constants import MALLOC_MMAP_THRESHOLD_BYTES

__all__ = ["pin_mmap_threshold"]

_M_MMAP_THRESHOLD = -3  # from glibc's malloc.h


def pin_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold; False (and no change) on other C libraries."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES))
