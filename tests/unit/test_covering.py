"""Covering against the semantics: whenever `covers` says yes, every publication the subscription
matches is matched by the filter (checked over every combination of the values that matter)."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_index_differential import predicates
from veil.matching import Predicate, check_satisfiable, matches
from veil.matching.covering import covered_by_any, covers
from veil.matching.satisfiable import Unsatisfiable

KEYS = ("a", "b")
STRINGS = ["", "a", "ab", "abc", "b", "ba", "MED", "MED FRIGO", "é", "zz", "x"]


def universe(predicates: list[Predicate]) -> list[object]:
    """Values on both sides of every bound and around every pattern the predicates name."""
    values: list[object] = [True, False, *STRINGS, -6, 6, 2**61]
    for _, _, value in predicates:
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, bool):
                continue
            if isinstance(v, int | float):
                values += [v, v - 0.05, v + 0.05, v - 1, v + 1]
            elif isinstance(v, str):
                values += [v, v + "x", "x" + v, "x" + v + "x", v[:-1], v + "\U0010ffff"]
    return values


def on_keys(draw_predicates: list[Predicate]) -> list[Predicate]:
    return [Predicate(KEYS[hash(p.key) % 2], p.op, p.value) for p in draw_predicates]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(predicates(), max_size=2), st.lists(predicates(), min_size=1, max_size=4))
def test_a_covered_subscription_never_matches_outside_the_filter(allowed, wanted):
    allowed, wanted = on_keys(allowed), on_keys(wanted)
    try:
        check_satisfiable(wanted)
    except Unsatisfiable:
        return
    if not covers(allowed, wanted):
        return
    values = universe(allowed + wanted)
    for a, b in itertools.product([None, *values], repeat=2):
        publication = {k: v for k, v in zip(KEYS, (a, b), strict=True) if v is not None}
        if matches(wanted, publication):
            assert matches(allowed, publication), (allowed, wanted, publication)


def p(key: str, op: str, value: object) -> Predicate:
    return Predicate(key, op, value)


def test_what_is_covered():
    country_fr = [p("country", "eq", "FR")]
    assert covers(country_fr, [p("country", "eq", "FR"), p("lat", "gt", 3)])
    assert covers([], [p("anything", "eq", 1)])  # the empty filter allows everything
    assert covers([p("t", "ge", 0)], [p("t", "between", [0, 10])])
    assert covers([p("t", "between", [0, 10])], [p("t", "gt", 1), p("t", "lt", 9.5)])
    assert covers([p("c", "in", ["FR", "DE"])], [p("c", "eq", "DE")])
    assert covers([p("c", "ne", "FR")], [p("c", "in", ["DE", "IT"])])
    assert covers([p("id", "starts_with", "tr")], [p("id", "starts_with", "truck-")])
    assert covers([p("id", "contains", "ck")], [p("id", "ends_with", "truck")])
    assert covers([p("id", "exists", None)], [p("id", "eq", 3)])
    assert covered_by_any([country_fr, [p("country", "eq", "DE")]], [p("country", "eq", "DE")])


def test_what_is_not_covered():
    assert not covers([p("country", "eq", "FR")], [])  # everything
    assert not covers([p("country", "eq", "FR")], [p("country", "ne", "DE")])
    assert not covers([p("country", "eq", "FR")], [p("lat", "gt", 3)])  # another key
    assert not covers([p("t", "ge", 0)], [p("t", "ge", -1)])
    assert not covers([p("t", "le", 5)], [p("t", "eq", "five")])  # a value of another class
    assert not covers([p("t", "ne", 5)], [p("t", "exists", None)])  # any value, strings too
    assert not covers([p("id", "starts_with", "tr")], [p("id", "contains", "tr")])
    assert not covered_by_any([], [p("a", "eq", 1)])
