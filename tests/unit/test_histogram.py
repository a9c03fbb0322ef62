"""The numpy histogram counts exactly what prometheus-client's own Histogram counts, one value at a
time, for any values, bounds included (a bucket holds values up to its bound)."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client import Histogram as ClientHistogram

from veil.monitoring.histogram import LATENCY_BOUNDS, Histogram

VALUES = st.one_of(st.sampled_from(LATENCY_BOUNDS), st.floats(0, 100, allow_nan=False))


def exposition(histogram: Histogram) -> dict[str, float]:
    family = histogram.family("h", "test")
    return {s.name + str(s.labels.get("le", "")): s.value for s in family.samples}


@given(st.lists(st.lists(VALUES, max_size=50), max_size=5))
def test_chunks_count_as_prometheus_counts_one_by_one(chunks):
    ours = Histogram(LATENCY_BOUNDS)
    registry = CollectorRegistry()
    theirs = ClientHistogram("h", "test", buckets=LATENCY_BOUNDS, registry=registry)
    for chunk in chunks:
        ours.observe(np.array(chunk, np.float64))
        for value in chunk:
            theirs.observe(value)
    expected = {
        s.name + str(s.labels.get("le", "")): s.value
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }
    got = exposition(ours)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert abs(got[name] - value) <= 1e-9 * max(1.0, abs(value)), name


@given(st.lists(st.tuples(VALUES, st.integers(0, 5000)), max_size=50))
def test_a_value_counted_n_times_is_n_observations_of_it(weighed):
    """A line to many subscriptions is one latency counted as many deliveries."""
    once = Histogram(LATENCY_BOUNDS)
    once.observe(np.array([value for value, n in weighed for _ in range(n)], np.float64))
    counted = Histogram(LATENCY_BOUNDS)
    counted.observe(np.array([v for v, _ in weighed], np.float64), np.array([n for _, n in weighed], np.int64))
    assert counted.counts.tolist() == once.counts.tolist()
    assert abs(counted.total - once.total) <= 1e-9 * max(1.0, once.total)
