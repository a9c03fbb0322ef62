"""Memory the gateway gives back to the system once a burst is over.

glibc serves large allocations with mmap, and returns them at once when freed; but after the first
such free it raises that threshold (up to 32 MiB), so that the arrays of the next large feed entry
come from the heap and stay resident, fragmented, after they are freed. Fixing the threshold keeps
large, short-lived arrays out of the heap; trimming after a connection closes returns what its
queues held. Elsewhere than on glibc both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
MMAP_THRESHOLD = 256 * 1024  # bytes: larger allocations are mapped, and unmapped when freed
TRIM_INTERVAL = 1.0  # seconds at least between two trims (each walks the heap)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


_LIBC = _libc()


def map_large_allocations() -> None:
    if _LIBC is not None:
        _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


_trimmed = 0.0


def give_back() -> None:
    """Return the heap's free pages to the system (unless that was done less than TRIM_INTERVAL ago)."""
    global _trimmed
    now = time.monotonic()
    if _LIBC is not None and now - _trimmed >= TRIM_INTERVAL:
        _trimmed = now
        _LIBC.malloc_trim(0)
