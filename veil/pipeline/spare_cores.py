"""How much of this machine's CPU went unused lately, from the kernel's counters (/proc/stat, Linux).

A matcher partition's rounds come closer together when the cores have room for what the extra
rounds cost (each is a store write, a feed entry and a write to every connection it reaches), and
stay `round_gap` apart when they do not: at full load the cost of more rounds is paid for by fewer
publications accepted. Where the counters cannot be read the room is unknown, and rounds are paced
as if there were none.
"""

from __future__ import annotations

import time

SAMPLE_EVERY = 0.25  # seconds: the shortest span the idle share is measured over


class SpareCores:
    """The share of the machine's CPU time idle since the previous sample (at least SAMPLE_EVERY
    ago): a look at the recent past, taken when a round is paced, cheap enough for every round."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self._path = path
        self._sampled: tuple[float, int, int] | None = None  # (monotonic time, idle ticks, all ticks)
        self._idle: float | None = None

    def idle(self) -> float | None:
        """The idle share (0 to 1) over the last sampled span; None where it is not known (yet)."""
        now = time.monotonic()
        if self._sampled is not None and now - self._sampled[0] < SAMPLE_EVERY:
            return self._idle
        ticks = _ticks(self._path)
        if ticks is None:
            return None
        if self._sampled is not None and ticks[1] > self._sampled[2]:
            self._idle = (ticks[0] - self._sampled[1]) / (ticks[1] - self._sampled[2])
        self._sampled = (now, *ticks)
        return self._idle


def _ticks(path: str) -> tuple[int, int] | None:
    """(idle, all) CPU ticks since boot, over every core: the first line of /proc/stat counts user,
    nice, system, idle, iowait, irq, softirq and steal time (guest time is within user time)."""
    try:
        with open(path, "rb") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != b"cpu":
        return None
    counts = [int(field) for field in fields[1:9]]
    return counts[3] + counts[4], sum(counts)
