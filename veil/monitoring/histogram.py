"""Histograms observed many values at a time, exposed in Prometheus' format.

prometheus-client's Histogram takes one value per call, under a lock; deliveries leave the gateway
in numpy chunks of hundreds, so their latencies are counted into buckets with one `searchsorted`
and one `bincount` per chunk instead. The same exposition serves bucket counts read from the store
(the durations of the pipeline's rounds).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from prometheus_client.core import HistogramMetricFamily

# publish -> delivery latency buckets, seconds (Prometheus' `le`)
LATENCY_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = np.asarray(bounds, np.float64)
        self.counts = np.zeros(len(bounds) + 1, np.int64)  # per bucket; the last is past every bound
        self.total = 0.0

    def observe(self, values: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Each value observed once, or as many times as `counts` says."""
        buckets = np.searchsorted(self.bounds, values)
        if counts is None:
            self.counts += np.bincount(buckets, minlength=len(self.counts))
            self.total += float(values.sum())
        else:
            self.counts += np.bincount(buckets, counts, len(self.counts)).astype(np.int64)
            self.total += float(values @ counts)

    def family(self, name: str, text: str) -> HistogramMetricFamily:
        return family(name, text, self.bounds.tolist(), self.counts.tolist(), self.total)


def family(name: str, text: str, bounds: Sequence[float], counts: Sequence[int], total: float) -> HistogramMetricFamily:
    """A histogram metric from per-bucket counts (the last past every bound) and the sum."""
    cumulative = np.cumsum(counts).tolist()
    buckets = [(_le(bound), count) for bound, count in zip(bounds, cumulative[:-1], strict=True)]
    buckets.append(("+Inf", cumulative[-1]))
    return HistogramMetricFamily(name, text, buckets=buckets, sum_value=total)


def _le(bound: float) -> str:
    return repr(float(bound))
