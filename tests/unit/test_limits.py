"""Limits at the door, and the match task's isolation of entries it cannot process."""

from __future__ import annotations

import time

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from veil.matching import Predicate, Unsatisfiable, check_satisfiable
from veil.matching.predicates import evaluate
from veil.matching.satisfiable import _any_satisfies, _interval
from veil.pipeline.guard import isolate
from veil.protocol import ProtocolError, flatten, parse_handshake, parse_publication, parse_subscribe, parse_valid_for
from veil.protocol.limits import Limits, load_json


def refused(call, *args) -> ProtocolError:  # type: ignore[no-untyped-def]
    with pytest.raises(ProtocolError) as error:
        call(*args)
    return error.value


def test_nesting_is_bounded_and_flattening_never_recurses():
    deep = b'{"d":' + b'{"a":' * 999 + b"1" + b"}" * 1000
    assert "nested deeper than 32" in refused(parse_publication, deep).problem
    doc = orjson.loads(deep)
    assert list(flatten(doc).values()) == [1]  # the pipeline copes even with what the door refuses
    assert parse_publication(b'{"d":' + b"[" * 31 + b"1" + b"]" * 31 + b"}")


def test_duplicate_keys_are_refused_even_next_to_colons_in_strings():
    assert refused(parse_publication, b'{"type": "y", "type": "x"}').problem == "key 'type' given twice in one object"
    assert refused(parse_publication, b'{"t": "12:30", "a": {"b": 1, "b": 2}}').field == "body"
    assert parse_publication(b'{"t": "12:30:00", "a": {"b": 1, "c": "x:y"}}')
    assert parse_publication(b'{"a:b": "c:d", "e": ["f:g", {"h:": 1}]}')  # colons in keys and in arrays
    assert refused(parse_publication, b'{"t": "a\\u003ab", "a": 1, "a": 2}').field == "body"  # an escaped colon
    assert parse_publication(b'{"t\\u003a": 1, "x": 2}')


def test_publication_size_limits_name_the_bound():
    limits = Limits(keys=3, key_length=4)
    assert refused(parse_publication, b'{"a": [1, 2, 3, 4]}', limits).status == 413
    assert "at most 4" in refused(parse_publication, b'{"abcde": 1}', limits).problem
    assert parse_publication(b'{"a": [1, 2, null, 3]}', limits)  # nulls are not attributes


def test_subscription_limits_and_linear_deduplication():
    many = orjson.dumps({"data": [{"key": "x", "op": "in", "val": [str(i % 50_000) for i in range(100_000)]}]})
    assert refused(parse_subscribe, many).field == "data[0].val"
    values = orjson.dumps({"data": [{"key": "x", "op": "in", "val": [1, 1.0, True, 2] * 2000}]})
    with pytest.raises(ProtocolError):  # a boolean among numbers
        parse_subscribe(values)
    started = time.monotonic()
    unique = parse_subscribe(orjson.dumps({"data": [{"key": "x", "op": "in", "val": [i % 5000 for i in range(10_000)]}]}))
    assert len(unique.predicates[0][2]) == 5000 and time.monotonic() - started < 1
    same = parse_subscribe(orjson.dumps({"data": [{"key": "a", "val": 1}, {"key": "a", "val": True}, {"key": "a", "val": 1}]}))
    assert same.predicates == [("a", "eq", 1), ("a", "eq", True)]  # 1 == True, yet not the same constraint
    assert refused(parse_subscribe, orjson.dumps({"data": [{"key": f"k{i}", "val": 1} for i in range(1025)]})).status == 413
    assert refused(parse_subscribe, b'{"data": [{"key": "n", "val": "99999999999999999999", "type": "int"}]}').field == (
        "data[0].val"
    )


@pytest.mark.parametrize(("window", "ok"), [(1e308, False), (0.0001, False), (0, False), (1, True), (2_592_000_000, True)])
def test_top_k_windows_are_whole_milliseconds_the_clock_can_hold(window, ok):
    raw = orjson.dumps({"data": [], "topk": {"k": 1, "w": window, "score": [{"key": "v", "prefer": "high"}]}})
    if ok:
        assert parse_subscribe(raw).topk["w"] == window  # type: ignore[index]
    else:
        assert refused(parse_subscribe, raw).field == "topk.w"


@pytest.mark.parametrize("header", ["\uff12", "\u0663", "1_000", "-1", "0", "2592000001", "1" * 40, ""])
def test_validity_takes_ascii_digits_within_bounds(header):
    assert refused(parse_valid_for, header).field == "X-Valid-For"


def test_sequence_numbers_stay_within_64_bits():
    assert parse_handshake(b'{"subscriptionId": "s", "resumeAfter": 9223372036854775807}').resume_after == 2**63 - 1
    assert refused(parse_handshake, b'{"subscriptionId": "s", "resumeAfter": 9223372036854775808}').field == "resumeAfter"


def test_load_json_keeps_the_field_name():
    assert refused(load_json, b'{"a": 1, "a": 1}', "handshake").field == "handshake"


def test_isolate_finds_each_failing_entry_in_three_attempts():
    poison = {17, 2000, 4095}
    calls = []

    def work(lo: int, hi: int) -> int:
        calls.append((lo, hi))
        if poison & set(range(lo, hi)):
            raise ValueError("poison")
        return hi - lo

    done, failed = isolate(0, 4096, 0, work)
    assert [position for position, _ in failed] == sorted(poison)
    assert all("ValueError: poison" in error for _, error in failed)
    assert sum(result for _, _, result in done) == 4096 - len(poison)
    assert [lo for lo, _, _ in done] == sorted(lo for lo, _, _ in done)  # in order
    assert len(calls) == 1 + 64 + 3 * 64


def test_isolate_bounds_time_in_the_main_thread():
    def work(lo: int, hi: int) -> int:
        if lo <= 3 < hi:
            while True:
                time.sleep(0.01)
        return hi - lo

    started = time.monotonic()
    done, failed = isolate(0, 8, 0.2, work)
    assert [position for position, _ in failed] == [3] and "EntryTimeout" in failed[0][1]
    assert sum(result for _, _, result in done) == 7 and time.monotonic() - started < 5


NUMBER_OPS = ["eq", "ne", "gt", "ge", "lt", "le", "between", "in"]
STRING_OPS = [*NUMBER_OPS, "contains", "starts_with", "ends_with"]


@st.composite
def one_class_constraints(draw: st.DrawFn) -> tuple[list[Predicate], list]:
    """Constraints on one key sharing a class of values, and candidate values of that class."""
    numbers = draw(st.booleans())
    value = st.integers(-3, 3) | st.sampled_from([-0.5, 0.5, 1.0, 2.5]) if numbers else st.text("ab", max_size=3)
    predicates = []
    for op in draw(st.lists(st.sampled_from(NUMBER_OPS if numbers else STRING_OPS), min_size=1, max_size=6)):
        if op == "between":
            target: object = sorted(draw(st.lists(value, min_size=2, max_size=2)))
        elif op == "in":
            target = draw(st.lists(value, min_size=1, max_size=4))
        else:
            target = draw(value)
        predicates.append(Predicate("x", op, target))
    return predicates, draw(st.lists(value, max_size=8))


@given(one_class_constraints())
def test_set_and_interval_checks_agree_with_testing_every_candidate(case):
    predicates, candidates = case
    expected = any(all(evaluate(p.op, p.value, v) for p in predicates) for v in candidates)
    assert _any_satisfies(predicates, candidates, *_interval(predicates)) == expected


def test_hostile_satisfiability_checks_take_linear_time():
    """Up to the limits at the door: 10,000 `in` values against 1,023 ordering or inequality
    constraints that every value passes but the last (before, 4.6 s each)."""
    values = [{"key": "x", "op": "in", "val": list(range(10_000))}]
    for op in ("gt", "ne"):
        data = values + [{"key": "x", "op": op, "val": -i - 1} for i in range(1022)] + [{"key": "x", "op": "lt", "val": 0}]
        predicates = [Predicate(*p) for p in parse_subscribe(orjson.dumps({"data": data})).predicates]
        started = time.monotonic()
        with pytest.raises(Unsatisfiable):
            check_satisfiable(predicates)
        assert time.monotonic() - started < 0.5
