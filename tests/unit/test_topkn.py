"""Count windows (top-k of the last n) against their definition, evaluated by brute force."""

from collections.abc import Callable

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.matching.kinds import Arrivals, KindStates, NumericColumns, Selected, topkn
from veil.matching.stored import encode_subscription
from veil.pipeline.worker_state import State
from veil.protocol import ProtocolError, parse_subscribe
from veil.protocol.limits import DEFAULT, Limits


def brute_force(k: int, n: int, arrivals: list[tuple[int, int, float | None]]) -> dict[int, int]:
    """At each arrival that can be ranked the window is the last n of those, and its k best (score,
    then the newer first) are judged by sorting it; the first moment a publication is among them
    counts."""
    window: list[tuple[int, float]] = []
    first: dict[int, int] = {}
    for seq, time, value in arrivals:
        if value is None:
            continue
        window = [*window, (seq, value)][-n:]
        for kept, _ in sorted(window, key=lambda item: (item[1], -item[0]))[:k]:
            first.setdefault(kept, time)
    return first


@st.composite
def streams(draw):
    """Runs of arrivals (one call each) with few distinct scores (ties), some unrankable, and the
    times of the log (several publications may share one); each run reaches a random subset of the
    subscriptions, and states are sometimes restored from their snapshots between runs."""
    subscriptions = draw(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 12)), min_size=1, max_size=3))
    runs, seq, time = [], 0, 0
    for _ in range(draw(st.integers(0, 12))):
        run = []
        for _ in range(draw(st.integers(1, 20))):
            time += draw(st.integers(0, 2))
            run.append((seq, time, draw(st.one_of(st.none(), st.integers(0, 5).map(float)))))
            seq += 1
        wanted = draw(st.lists(st.sampled_from(range(len(subscriptions))), unique=True))
        runs.append((run, wanted, draw(st.integers(0, 4)) == 0))
    return subscriptions, runs


@settings(max_examples=1500, deadline=None)
@given(streams())
def test_count_windows_deliver_what_the_definition_does(case):
    subscriptions, runs = case
    engine = KindStates()
    for number, (k, n) in enumerate(subscriptions):
        engine.add(number, *engine.spec({"k": k, "n": n, "score": [{"key": "v", "prefer": "low"}]}))
    got: dict[int, list[Selected]] = {number: [] for number in range(len(subscriptions))}
    for run, wanted, restart in runs:
        assert engine.advance(run[-1][1]) == []  # the clock alone moves no count (within 30 days)
        documents = NumericColumns([{"v": "x" if value is None else value} for _, _, value in run])
        for number in wanted:
            arrivals = Arrivals([s for s, _, _ in run], [t for _, t, _ in run], documents, np.arange(len(run)), {})
            got[number].extend(engine.arrive(number, arrivals))
        if restart:
            for number, state in list(engine.states.items()):
                engine.restore(number, msgspec.msgpack.decode(msgspec.msgpack.encode(state.snapshot())))
    for number, (k, n) in enumerate(subscriptions):
        mine = [arrival for run, wanted, _ in runs if number in wanted for arrival in run]
        expected = brute_force(k, n, mine)
        assert {s.seq: s.time for s in got[number]} == expected
        assert len(got[number]) == len(expected)  # exactly once
        times = [s.time for s in got[number]]
        assert times == sorted(times)
        window = [seq for seq, _, value in mine if value is not None][-n:]
        assert set(engine.states[number].held()) <= set(window)  # nothing outside the window is kept


def one_by_one(engine: KindStates, number: int) -> Callable[[int, int, float], list[Selected]]:
    """Arrivals of single publications holding `v`, for subscription `number`."""

    def arrive(seq: int, time: int, value: float) -> list[Selected]:
        return engine.arrive(number, Arrivals([seq], [time], NumericColumns([{"v": value}]), np.arange(1), {}))

    return arrive


def test_a_better_one_leaving_the_window_promotes_the_next_at_the_arrival_that_pushed_it_out():
    engine = KindStates()
    engine.add(7, *engine.spec({"k": 1, "n": 2, "score": [{"key": "v", "prefer": "high"}]}))
    arrive = one_by_one(engine, 7)

    assert arrive(1, 100, 9.0) == [Selected(1, 100)]
    assert arrive(2, 200, 5.0) == []  # 9 is still among the last 2
    assert arrive(3, 300, 1.0) == [Selected(2, 300)]  # 9 left as 3 came: 5 is the best of {5, 1}
    assert engine.states[7].held() == [2, 3]  # best first; 3 may be the best once 2 leaves


def test_a_window_that_stops_filling_lets_its_publications_go_after_the_longest_time_window():
    """Otherwise the oldest one held, and the log under it, would be kept for ever."""
    engine = KindStates()
    engine.add(7, *engine.spec({"k": 1, "n": 3, "score": [{"key": "v", "prefer": "high"}]}))
    arrive = one_by_one(engine, 7)

    assert arrive(1, 0, 9.0) == [Selected(1, 0)]
    assert arrive(2, 10, 5.0) == []
    assert engine.next_due() == topkn.MAX_AGE_MS  # when 1 ages out
    assert engine.advance(topkn.MAX_AGE_MS - 1) == []
    assert engine.advance(topkn.MAX_AGE_MS) == [(7, Selected(2, topkn.MAX_AGE_MS))]  # the best of what is left
    assert engine.next_due() == 10 + topkn.MAX_AGE_MS
    restored = msgspec.msgpack.decode(msgspec.msgpack.encode(engine.states[7].snapshot()))
    engine.restore(7, restored)
    assert arrive(3, 20, 1.0) == []  # 2 (5) is still the best of the last three
    assert engine.advance(10 + topkn.MAX_AGE_MS) == [(7, Selected(3, 10 + topkn.MAX_AGE_MS))]
    assert engine.states[7].held() == [3] and engine.next_due() == 20 + topkn.MAX_AGE_MS
    assert engine.advance(20 + topkn.MAX_AGE_MS) == [] and engine.states[7].held() == []
    assert engine.next_due() is None


def test_the_protocol_takes_a_count_or_a_window_not_both():
    def topk(**fields: object) -> bytes:
        return msgspec.json.encode({"data": [], "topk": {"k": 2, "score": [{"key": "v", "prefer": "low"}], **fields}})

    assert parse_subscribe(topk(n=50)).topk == {"k": 2, "n": 50, "score": [{"key": "v", "weight": 1.0, "prefer": "low"}]}
    for fields, field in (({"n": 50, "w": 1000}, "topk"), ({}, "topk"), ({"n": 0}, "topk.n"), ({"n": 2.5}, "topk.n"),
                          ({"n": True}, "topk.n"), ({"n": DEFAULT.window_count + 1}, "topk.n")):  # fmt: skip
        try:
            parse_subscribe(topk(**fields))
        except ProtocolError as exc:
            assert exc.field == field, fields
        else:
            raise AssertionError(f"{fields} was taken")
    # the bound is the operator's (--max-window-count)
    assert parse_subscribe(topk(n=50_000), Limits(window_count=50_000)).topk["n"] == 50_000


def test_a_saved_state_of_another_kind_leaves_the_subscription_fresh():
    """A subscription replaced by one of the other kind keeps its number; a state rebuilt from
    before the replacement meets the new kind's saved state and starts afresh instead of failing."""

    class Saved:
        def subscription_states(self, numbers: list[int]) -> dict[int, bytes]:
            time_kind = KindStates()
            time_kind.add(5, *time_kind.spec({"k": 1, "w": 1000, "score": [{"key": "v", "prefer": "low"}]}))
            return {5: msgspec.msgpack.encode([time_kind.states[5].snapshot(), {}])}

    state = State(None, with_authorization=False)
    count = {"k": 1, "n": 2, "score": [{"key": "v", "prefer": "low"}]}
    state.add("s", 5, "alice", encode_subscription([], count))
    state.load_states(Saved())  # type: ignore[arg-type]  # the one store call it makes
    assert state.kinds.states[5].snapshot()[1] == 0  # a count window, nothing arrived


def test_a_window_at_the_largest_n_whose_scores_only_worsen_holds_it_all_and_decides_right():
    """The hostile stream the bound on n is for: nothing is ever outranked by a younger one, so the
    skyband holds all n, and each arrival pushes the oldest (the best) out and promotes the next."""
    n = DEFAULT.window_count
    engine = KindStates()
    engine.add(1, *engine.spec({"k": 1, "n": n, "score": [{"key": "v", "prefer": "low"}]}))
    seqs = np.arange(1, 3 * n + 1)
    documents = NumericColumns([{"v": float(seq)} for seq in seqs.tolist()])
    got = engine.arrive(1, Arrivals(seqs.tolist(), seqs.tolist(), documents, np.arange(len(seqs)), {}))
    # the first at once; from the (n+1)-th arrival on, each promotes the one after the one it pushed out
    assert got == [Selected(1, 1)] + [Selected(seq - n + 1, seq) for seq in range(n + 1, 3 * n + 1)]
    assert len(engine.states[1].held()) == n
