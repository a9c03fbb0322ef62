"""Memory the gateway gives back to the system once a burst is over.

glibc serves large allocations with mmap, and returns them at once when freed; but after the first
such free it raises that threshold (up to 32 MiB), so that the arrays of the next large feed entry
come from the heap and stay resident, fragmented, after they are freed. Fixing the threshold keeps
large, short-lived arrays out of the heap; trimming after a connection closes returns what its
queues held. Elsewhere than on glibc both are no-ops.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
MMAP_THRESHOLD = 256 * 1024  # bytes: larger allocations are mapped, and unmapped when freed
TRIM_DELAY = 1.0  # seconds from a connection closing to the trim that gives its memory back


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


_trim: asyncio.TimerHandle | None = None
_again = False  # give_back was called while a trim was pending: trim once more after it


def give_back() -> None:
    """Return the heap's free pages to the system TRIM_DELAY after this call: at most once per
    TRIM_DELAY for a burst of calls (each trim walks the heap), and always after the last of them."""
    global _trim, _again
    if _LIBC is None:
        return
    if _trim is None:
        _trim = asyncio.get_running_loop().call_later(TRIM_DELAY, _trimmed)
    else:
        _again = True


def _trimmed() -> None:
    global _trim, _again
    _trim = None
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    if _again:
        _again = False
        _trim = asyncio.get_running_loop().call_later(TRIM_DELAY, _trimmed)
