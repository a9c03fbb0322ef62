"""How the micro-benchmarks time a call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def per_call(call: Callable[[], object], repeat: int = 200) -> float:
    """Median microseconds of one call, over `repeat` timed calls."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6
