"""What the monitoring views (the SELIS channel, /metrics) read from the store: the totals, and how
long the pipeline's rounds took."""

from __future__ import annotations

from typing import NamedTuple

from veil.store import BatchDurations, Totals


class StoreFigures(NamedTuple):
    totals: Totals
    batches: BatchDurations
