"""Defence in depth for the match task: a log entry that makes processing raise, or run past a time
bound, is isolated and set aside (quarantined) while everything else in the round is processed
as usual.

The gateway refuses what it knows the pipeline cannot handle, but the delivery guarantee must not
rest on that alone: one entry that fails on every retry would otherwise stop the pipeline at its
offset for good. Work is tried as a whole first (the common case costs one `try`); when it fails,
it is retried in pieces of 1/64th, then one entry at a time, so an entry is found in three attempts
whatever the size of the run. The time bound is an interval timer: its signal interrupts Python code
between bytecodes (a loop that never ends, a sleep), which is how a hang becomes an exception here.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("veil.pipeline")
T = TypeVar("T")
SPLIT = 64  # pieces a failed run is retried in


class EntryTimeout(BaseException):
    """Raised by the interval timer; a BaseException so that no `except Exception` in the code it
    interrupts can swallow it."""


_bound = 0.0  # the bound of the deadline running now, for the message
_armed = False
_MAIN = threading.main_thread().ident


def _expired(signum: int, frame: object) -> None:
    raise EntryTimeout(f"took longer than {_bound:g} s")


def describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 500 else text[:497] + "..."


def attempt(seconds: float, work: Callable[[], T]) -> tuple[T | None, str | None]:
    """(result, None), or (None, what went wrong) when `work` raised or ran past `seconds`. Only the
    main thread of a process receives signals: elsewhere (in-process tests) `work` runs unbounded.
    The handler stays installed (the worker process runs nothing else that uses SIGALRM), so a bound
    costs two timer calls: it is set for every subscription ranked, thousands of times a batch."""
    global _bound, _armed
    timed = seconds > 0 and threading.get_ident() == _MAIN
    if timed:
        if signal.getsignal(signal.SIGALRM) is not _expired:
            signal.signal(signal.SIGALRM, _expired)
        _bound, _armed = seconds, True
        signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        return work(), None
    except (Exception, EntryTimeout) as exc:
        log.warning("isolating a failure after %.1f s: %s", time.monotonic() - started, describe(exc))
        return None, describe(exc)
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _armed = False


def rearm() -> None:
    """Restart the running bound: for work that is many entries in a row, each with a bound of its own,
    under one `attempt` (one timer call per entry instead of an attempt each)."""
    if _armed:
        signal.setitimer(signal.ITIMER_REAL, _bound)


def isolate(
    start: int, end: int, seconds: float, work: Callable[[int, int], T]
) -> tuple[list[tuple[int, int, T]], list[tuple[int, str]]]:
    """Run `work(lo, hi)` over [start, end), isolating failures: the (lo, hi, result) of the pieces
    that succeeded, in order, and the (position, error) of every single entry that failed alone."""
    result, error = attempt(seconds, lambda: work(start, end))
    if error is None:
        return [(start, end, result)], []  # type: ignore[list-item]  # no error: `work` returned a T
    if end - start == 1:
        return [], [(start, error)]
    done: list[tuple[int, int, T]] = []
    failed: list[tuple[int, str]] = []
    size = max(1, (end - start) // SPLIT) if end - start > SPLIT else 1
    for lo in range(start, end, size):
        pieces, errors = isolate(lo, min(end, lo + size), seconds, work)
        done += pieces
        failed += errors
    return done, failed


class Faults:
    """Fault injection for the tests of this guard: a publication (or subscription) whose bytes contain
    the marker in VEIL_FAULT_RAISE makes the match task raise, one with the marker in VEIL_FAULT_HANG
    makes it hang. Unset (always, in production), checking costs nothing."""

    def __init__(self) -> None:
        self.raise_on = os.environ.get("VEIL_FAULT_RAISE", "").encode() or None
        self.hang_on = os.environ.get("VEIL_FAULT_HANG", "").encode() or None

    def check(self, body: bytes) -> None:
        if self.raise_on is not None and self.raise_on in body:
            raise RuntimeError("fault injected (VEIL_FAULT_RAISE)")
        if self.hang_on is not None and self.hang_on in body:
            while True:
                time.sleep(1)


FAULTS = Faults()
