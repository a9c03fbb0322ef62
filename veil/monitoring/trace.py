"""Hand-over times on the publish → deliver path, for `python -m bench.latency`.

Off unless the environment's VEIL_TRACE names a directory (read once, at import; the broker's
processes, Spark's Python workers among them, inherit it). Then every process appends lines
`stage low high nanoseconds` to a file of its own: log offsets (low, high] reached `stage` then.
There is one line per hand-over of a range (a group commit, a matching round, a feed entry, a write
to a connection), a few per round and per send, so tracing does not change what it
measures. Files are line-buffered: Spark may kill its Python workers without letting them flush.
"""

from __future__ import annotations

import os
import time
from typing import IO

DIRECTORY = os.environ.get("VEIL_TRACE") or None

_out: IO[str] | None = None
_pid = 0


def mark(stage: str, low: int, high: int, at_ns: int | None = None) -> None:
    """Offsets (low, high] reached `stage` at `at_ns` (now if not given)."""
    if DIRECTORY is None:
        return
    global _out, _pid
    if _pid != os.getpid():  # a forked Python worker writes a file of its own
        _out = open(os.path.join(DIRECTORY, f"{os.getpid()}.trace"), "a", buffering=1)  # noqa: SIM115 (lives with the process)
        _pid = os.getpid()
    assert _out is not None
    _out.write(f"{stage} {low} {high} {at_ns or time.time_ns()}\n")
