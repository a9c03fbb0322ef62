"""Memory the gateway gives back to the system once a burst is over.

glibc serves large allocations with mmap, and returns them at once when freed; but after the first
such free it raises that threshold (up to 32 MiB), so that the arrays of the next large feed entry
come from the heap and stay resident, fragmented, after they are freed. Fixing the threshold keeps
large, short-lived arrays out of the heap; trimming after connections close returns what their
subscriptions and queues held. A trim walks the whole heap on the event loop (glibc holds the main
arena's lock meanwhile, so a thread would not spare the loop): tens of milliseconds on a large
fragmented heap, so it runs at most once per TRIM_INTERVAL, however often clients come and go.
Elsewhere than on glibc both are no-ops.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
MMAP_THRESHOLD = 256 * 1024  # bytes: larger allocations are mapped, and unmapped when freed
TRIM_DELAY = 1.0  # seconds from a connection closing to the trim that gives its memory back
TRIM_INTERVAL = 10.0  # seconds at least between two trims


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
_last = -TRIM_INTERVAL  # loop time of the last trim


def give_back() -> None:
    """Return the heap's free pages to the system TRIM_DELAY after this call, or TRIM_INTERVAL after
    the last trim if that is later: one trim for a burst of calls, and always one after the last."""
    global _trim
    if _LIBC is None or _trim is not None:
        return
    loop = asyncio.get_running_loop()
    _trim = loop.call_at(max(loop.time() + TRIM_DELAY, _last + TRIM_INTERVAL), _trimmed)


def _trimmed() -> None:
    global _trim, _last
    _trim = None
    _last = asyncio.get_running_loop().time()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
