"""Hand-over times on the publish → deliver path, for `python -m bench.latency`.

Off unless the environment's VEIL_TRACE names a directory (read once, at import; the broker's
processes, Spark's Python workers among them, inherit it). Then every process appends lines
`stage low high nanoseconds` to a file of its own: log offsets (low, high] reached `stage` then.
There is one line per hand-over of a range (a group commit, a matching round, a feed entry, a write
to a connection), a few per round and per send, so tracing does not change what it
measures. Files are line-buffered, as Spark may kill its Python workers without letting them flush;
a process that ends through its own cleanup (the gateway: `buffer_until_exit`) buffers them
instead. A line-buffered mark was a write system call on the event loop's thread per connection
written to: 11 % of that thread's samples at 3,000 publications/s with 128 connections and a
20 ms round gap.
"""

from __future__ import annotations

import atexit
import os
import time
from typing import IO

DIRECTORY = os.environ.get("VEIL_TRACE") or None

_out: IO[str] | None = None
_buffering = 1  # lines


def _forked() -> None:
    """A forked process (a Spark Python worker) writes a file of its own, line by line."""
    global _out, _buffering
    _out, _buffering = None, 1


os.register_at_fork(after_in_child=_forked)


def buffer_until_exit() -> None:
    """This process ends through its cleanup: its marks are written in blocks, the rest at exit."""
    global _buffering
    if DIRECTORY is not None and _out is None:
        _buffering = -1
        atexit.register(_flush)


def _flush() -> None:
    if _out is not None:
        _out.flush()


def mark(stage: str, low: int, high: int, at_ns: int | None = None) -> None:
    """Offsets (low, high] reached `stage` at `at_ns` (now if not given)."""
    if DIRECTORY is None:
        return
    global _out
    if _out is None:
        # (lives with the process)
        _out = open(os.path.join(DIRECTORY, f"{os.getpid()}.trace"), "a", buffering=_buffering)  # noqa: SIM115
    _out.write(f"{stage} {low} {high} {at_ns or time.time_ns()}\n")
