"""The k-skyband against the definition of top-k/w delivery, evaluated by brute force."""

import itertools
import math
from unittest import mock

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.matching.kinds import Arrivals, KindStates, NumericColumns, Selected, topkw
from veil.matching.kinds.scoring import Term, ranked, score, score_many
from veil.matching.kinds.topkw import Skyband


def brute_force(k: int, window: float, events: list[tuple]) -> dict[int, float]:
    """Every moment (each arrival, each distinct expiry time, expiries before arrivals of the same
    instant) the k best of the window are judged by sorting it; the first moment counts."""
    held: list[tuple[int, float, float]] = []  # (seq, arrival, score)
    first: dict[int, float] = {}
    clock = -math.inf

    def judge(now: float) -> None:
        window = [item for item in held if item[1] + window_size > now]
        for seq, _, _ in sorted(window, key=lambda item: (item[2], -item[0]))[:k]:
            first.setdefault(seq, now)

    def expire_until(now: float) -> None:
        for moment in sorted({t + window_size for _, t, _ in held if clock < t + window_size <= now}):
            judge(moment)

    window_size = window
    for event in events:
        if event[0] == "arrive":
            _, seq, time, value = event
            expire_until(time)
            held.append((seq, time, value))
            judge(time)
        else:
            expire_until(event[1])
        clock = event[-2] if event[0] == "arrive" else event[1]
    return first


@st.composite
def streams(draw):
    """Arrivals with few distinct scores (ties) and small time steps (simultaneous events), mixed
    with clock advances; each arrival passes the filters of a random subset of subscriptions."""
    subscriptions = draw(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 12)), min_size=1, max_size=3))
    events, time = [], 0
    for seq in range(draw(st.integers(0, 60))):
        time += draw(st.integers(0, 4))
        if draw(st.booleans()):
            events.append(("advance", time))
            time += draw(st.integers(0, 3))
        wanted = draw(st.lists(st.sampled_from(range(len(subscriptions))), unique=True))
        events.append(("arrive", seq, time, draw(st.integers(0, 5)), wanted))
        if draw(st.integers(0, 9)) == 0:
            events.append(("restore",))
    events.append(("advance", time + 20))
    return subscriptions, events


def arrivals(seqs: list[int], times: list[float], values: list[object]) -> Arrivals:
    """Matches whose documents hold `v`."""
    return Arrivals(seqs, times, NumericColumns([{"v": v} for v in values]), np.arange(len(seqs)), {})


def restored(engine: KindStates) -> None:
    """Each state from its snapshot, through msgpack: as after a restart."""
    for number, state in list(engine.states.items()):
        engine.restore(number, msgspec.msgpack.decode(msgspec.msgpack.encode(state.snapshot())))


@settings(max_examples=2000, deadline=None)
@given(streams())
def test_the_skyband_delivers_what_the_definition_does(case):
    subscriptions, events = case
    engine = KindStates()
    for number, (k, window) in enumerate(subscriptions):
        engine.add(number, *engine.spec({"k": k, "w": window, "score": [{"key": "v", "prefer": "low"}]}))
    got: dict[int, list[Selected]] = {number: [] for number in range(len(subscriptions))}
    for event in events:
        if event[0] == "arrive":
            _, seq, time, value, wanted = event
            for number, delivery in engine.advance(time):  # the broker advances before each batch
                got[number].append(delivery)
            for number in wanted:
                got[number].extend(engine.arrive(number, arrivals([seq], [time], [float(value)])))
        elif event[0] == "restore":
            restored(engine)
        else:
            for number, delivery in engine.advance(event[1]):
                got[number].append(delivery)
    assert engine.next_due() is None  # the last advance is past every expiry
    for number, (k, window) in enumerate(subscriptions):
        own = [
            ("arrive", e[1], e[2], e[3]) if e[0] == "arrive" else e
            for e in events
            if e[0] == "advance" or (e[0] == "arrive" and number in e[4])
        ]
        expected = brute_force(k, window, own)
        assert {d.seq: d.time for d in got[number]} == expected
        assert len(got[number]) == len(expected)  # exactly once
        times = [d.time for d in got[number]]
        assert times == sorted(times)


def test_a_better_reading_leaving_the_window_promotes_the_next():
    band = Skyband(k=1, window=10)
    assert band.arrive(1, 0, 5.0) == [Selected(1, 0)]
    assert band.arrive(2, 1, 9.0) == []  # not the best while 1 is in the window
    assert band.next_expiry() == 10
    assert band.advance(9.9) == []
    assert band.advance(30) == [Selected(2, 10)]  # at the moment 1 left, not when noticed


def test_dominated_readings_are_dropped():
    band = Skyband(k=2, window=100)
    for seq, value in enumerate([9.0, 8.0, 1.0, 2.0]):
        band.arrive(seq, seq, value)
    assert sorted(band.seqs) == [2, 3]  # 9 and 8 are outranked by two younger ones: never top 2 again


def test_scores():
    terms = (Term("lat", target=45.8), Term("lon", target=15.9), Term("NO2", weight=0.5, prefer="high"))
    assert score(terms, {"lat": 45.9, "lon": 15.9, "NO2": 40}) == pytest.approx(0.1 - 20)
    assert score(terms, {"lat": 45.9, "lon": 15.9}) is None
    assert score(terms, {"lat": "x", "lon": 15.9, "NO2": 1}) is None
    assert score((Term("t", prefer="low"),), {"t": True}) is None


def test_many_dropped_readings_do_not_hide_an_expiry():
    band = Skyband(k=1, window=1000)
    band.arrive(1, 0, 0.0)
    for seq in range(2, 50):  # each better than the ones after 1: the band holds 1 and the newest
        band.arrive(seq, seq, 100.0 - seq)
    assert sorted(band.seqs) == [1, 49] and len(band.arrivals) < 14
    assert band.next_expiry() == 1000
    assert band.advance(1000) == [Selected(49, 1000)]


@settings(max_examples=500, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 30),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), max_size=120),
    st.lists(st.integers(1, 40), max_size=8),
)
def test_arrivals_counted_together_match_arrivals_one_by_one(k, window, steps, cuts):
    """The same stream (time steps and scores) fed one publication at a time and in batches."""
    times = list(itertools.accumulate(step for step, _ in steps))
    scores = [float(value) for _, value in steps]
    one = Skyband(k, window)
    expected = [d for seq, (t, v) in enumerate(zip(times, scores, strict=True)) for d in one.arrive(seq, t, v)]
    for vector_from in (1, topkw.VECTOR_FROM):  # counting used for every segment, and as configured
        many, got, low = Skyband(k, window), [], 0
        with mock.patch.object(topkw, "VECTOR_FROM", vector_from):
            for high in [*itertools.accumulate(cuts), len(steps)]:
                high = min(high, len(steps))
                if high > low:
                    got += many.arrive_many(list(range(low, high)), times[low:high], np.array(scores[low:high]))
                    low = high
        assert got == expected
        assert many.state()[:8] == one.state()[:8]


def test_scores_by_column_match_scores_one_by_one():
    documents = [{"a": 1, "b": 2.5}, {"a": True, "b": 1}, {"b": 3}, {"a": float("inf"), "b": 0}, {"a": -4, "b": "x"}]
    terms = (Term("a", weight=2, prefer="high"), Term("b", target=1.0))
    got = score_many(terms, NumericColumns(documents), np.arange(len(documents)))
    for value, document in zip(got.tolist(), documents, strict=True):
        expected = score(terms, document)
        assert (math.isnan(value) and expected is None) or value == pytest.approx(expected)


def test_unrankable_and_cropped_matches_are_judged_on_what_the_subscriber_sees():
    terms = (Term("v", prefer="low"),)
    documents = [{"v": 1}, {"v": "x"}, {"v": 3}, {"w": 1}]
    got = ranked(terms, Arrivals([10, 11, 12, 13], [0, 1, 2, 3], NumericColumns(documents), np.arange(4), {2: {}}))
    assert got[0] == [10] and got[1] == [0] and got[2].tolist() == [1.0]  # 11, 13 unrankable; 12 cropped of v
