"""Covering against the semantics: whenever `covers` says yes, every publication the subscription
matches is matched by the filter (checked over every combination of the values that matter, with the
matching oracle of the index's differential test rather than the matcher's own predicates).

Each subscription is built around a witness publication it matches (so it is satisfiable and the
check is never vacuous), and each filter constraint on the key of one of its constraints, with an
operator that constraint can imply and values at or just beside its own: most examples are ones
`covers` accepts, and the rest ones it only just must refuse, where a wrong yes would be."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.unit.test_index_differential import satisfied
from veil.matching import Predicate, check_satisfiable
from veil.matching.covering import covered_by_any, covers

KEYS = ("a", "b")
NUMBERS = [-2, -1, 0, 0.5, 1, 1.5, 2]
STRINGS = ["", "a", "ab", "abc", "b", "ba", "MED", "MED FRIGO", "é", "zz", "x"]
NUMBER_OPS = ["eq", "ne", "gt", "ge", "lt", "le", "between", "in"]
CLASSES: dict[str, tuple[list, list[str]]] = {
    "number": (NUMBERS, NUMBER_OPS),
    "string": (STRINGS, [*NUMBER_OPS, "contains", "starts_with", "ends_with"]),
    "bool": ([True, False], ["eq", "ne", "in"]),
}


def class_of(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else "string"


def named(predicate: Predicate) -> list[object]:
    return predicate.value if isinstance(predicate.value, list) else [predicate.value]  # type: ignore[return-value]


def near(value: object) -> list[object]:
    """A value, values just either side of it, and for a string the shorter and longer strings that
    prefix, suffix and substring constraints tell apart."""
    if isinstance(value, bool):
        return [True, False]
    if isinstance(value, int | float):
        return [value - 1, value - 0.5, value, value + 0.5, value + 1]
    text = str(value)
    return [text, text[1:], text[:-1], f"{text}x", f"x{text}"]


@st.composite
def predicate(
    draw: st.DrawFn, key: str, kind: str, pool: list[object], ops: st.SearchStrategy | None = None
) -> Predicate:
    """A constraint on `key` over values from `pool`, with one of `ops` or any operator its class
    allows."""
    if kind == "exists":
        return Predicate(key, "exists", None)
    op = draw(ops if ops is not None else st.sampled_from(CLASSES[kind][1]))
    values = st.sampled_from(pool)
    if op == "between":
        low, high = sorted([draw(values), draw(values)])  # type: ignore[type-var]
        return Predicate(key, op, [low, high])
    if op == "in":
        return Predicate(key, op, draw(st.lists(values, min_size=1, max_size=3, unique=True)))
    return Predicate(key, op, draw(values))


NEGATION = {"eq": "ne", "ne": "eq", "gt": "le", "ge": "lt", "lt": "ge", "le": "gt"}
KINDS = st.sampled_from(["number", "number", "string", "string", "bool"])
ONE_IN_SIX, ONE_IN_TWENTY = st.integers(0, 5), st.integers(0, 19)
THREE_IN_FOUR = st.sampled_from([True, True, True, False])
MOSTLY_ONE = st.sampled_from([1, 1, 1, 2])


def made_to_hold(constraint: Predicate, value: object) -> Predicate:
    """The constraint, or the nearest one that `value` (of the constraint's class) satisfies."""
    key, op, target = constraint
    if holds([constraint], {key: value}):
        return constraint
    if op == "eq":
        return Predicate(key, op, value)
    if op == "in":
        return Predicate(key, op, [*target, value])  # type: ignore[misc]
    if op in NEGATION:
        return Predicate(key, NEGATION[op], target)
    if op == "between":
        ordered = sorted([*target, value])  # type: ignore[misc]
        return Predicate(key, op, [ordered[0], ordered[-1]])
    text, length = str(value), len(target)  # type: ignore[arg-type]
    pattern = {"starts_with": text[:length], "ends_with": text[len(text) - length :], "contains": text[1:][:length]}
    return Predicate(key, op, pattern[op])


@st.composite
def witness(draw: st.DrawFn) -> dict[str, object]:
    """A publication the subscription is then built to match, so that it is satisfiable and the
    check below never holds vacuously."""
    return {key: draw(st.sampled_from(CLASSES[draw(KINDS)][0])) for key in KEYS}


@st.composite
def subscription(draw: st.DrawFn, seen: dict[str, object]) -> list[Predicate]:
    """One to three constraints that the witness `seen` satisfies, around its values."""
    wanted = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(KEYS))
        value = seen[key]
        if draw(ONE_IN_SIX) == 0:
            wanted.append(Predicate(key, "exists", None))
            continue
        kind = class_of(value)
        pool = sorted({(type(v), v): v for v in [*CLASSES[kind][0], *near(value)]}.values(), key=repr)
        wanted.append(made_to_hold(draw(predicate(key, kind, pool)), value))
    return wanted


# for each operator of a subscription's constraint, the operators of the constraints it can imply
# (a non-strict bound listed twice: with the constraint's own value, it is the one that is implied)
WEAKER = {
    "eq": ["eq", "in", "ne", "gt", "ge", "lt", "le", "between", "contains", "starts_with", "ends_with"],
    "in": ["in", "ne", "ge", "le", "between"],
    "gt": ["gt", "ge", "ne"],
    "ge": ["gt", "ge", "ge", "ne"],
    "lt": ["lt", "le", "ne"],
    "le": ["lt", "le", "le", "ne"],
    "between": ["gt", "ge", "lt", "le", "between", "ne"],
    "ne": ["ne"],
    "starts_with": ["starts_with", "contains", "ge"],
    "ends_with": ["ends_with", "contains"],
    "contains": ["contains"],
}


@st.composite
def filter_around(draw: st.DrawFn, wanted: list[Predicate]) -> list[Predicate]:
    """Mostly one constraint, sometimes two, each on the key of a constraint of `wanted`, with an
    operator that constraint can imply and its values or values just either side of them: implied or
    only just not, where a wrong yes would be. One in twenty is drawn freely instead, of any class or
    a presence test."""
    allowed = []
    for _ in range(draw(MOSTLY_ONE)):
        base = draw(st.sampled_from(wanted))
        if base.op == "exists" or draw(ONE_IN_TWENTY) == 0:
            kind = "exists" if base.op == "exists" else draw(st.sampled_from([*CLASSES, "exists"]))
            allowed.append(draw(predicate(base.key, kind, CLASSES[kind][0] if kind in CLASSES else [])))
            continue
        kind = class_of(named(base)[0])
        op = draw(st.sampled_from([op for op in WEAKER[base.op] if op in CLASSES[kind][1]]))
        own = named(base)
        nearby = st.sampled_from(sorted({v for w in own for v in near(w)}, key=repr))
        if op == "in":  # the base's values, now and then one short, and a few more
            kept = own if draw(THREE_IN_FOUR) else own[1:]
            more = draw(st.lists(nearby, max_size=2))
            target: object = list({(type(v), v): v for v in [*kept, *more]}.values()) or own
        elif op == "between":
            target = sorted([draw(nearby), draw(nearby)])  # type: ignore[type-var]
        else:
            target = draw(st.sampled_from(own) if draw(THREE_IN_FOUR) else nearby)
        allowed.append(Predicate(base.key, op, target))
    return allowed


def universe(predicates: list[Predicate]) -> list[object]:
    """Values on both sides of every bound and around every pattern the predicates name."""
    values: list[object] = [True, False, *STRINGS, -6, 6, 2**61]
    for p in predicates:
        if p.op != "exists":
            for v in named(p):
                values += [v] if isinstance(v, bool) else near(v)
                if isinstance(v, int | float) and not isinstance(v, bool):
                    values += [v - 0.05, v + 0.05]
    return list({(type(v), v): v for v in values}.values())  # False == 0, yet both are needed


def holds(predicates: list[Predicate], publication: dict[str, object]) -> bool:
    wire = [
        {"key": p.key, "op": "eq", "val": "*"} if p.op == "exists" else {"key": p.key, "op": p.op, "val": p.value}
        for p in predicates
    ]
    return all(satisfied(c, publication) for c in wire)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_covered_subscription_never_matches_outside_the_filter(data: st.DataObject) -> None:
    seen = data.draw(witness(), label="witness")
    wanted = data.draw(subscription(seen), label="wanted")
    allowed = data.draw(filter_around(wanted), label="allowed")
    assert holds(wanted, seen)
    check_satisfiable(wanted)  # the witness matches it: refusing it would be wrong
    if not covers(allowed, wanted):
        event("not covered")
        return
    event("covered: checked against the semantics")
    values = universe(allowed + wanted)
    for a, b in itertools.product([None, *values], repeat=2):
        publication = {k: v for k, v in zip(KEYS, (a, b), strict=True) if v is not None}
        if holds(wanted, publication):
            assert holds(allowed, publication), (allowed, wanted, publication)
    assert holds(allowed, seen), (allowed, wanted, seen)


def p(key: str, op: str, value: object) -> Predicate:
    return Predicate(key, op, value)


def test_what_is_covered() -> None:
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


def test_what_is_not_covered() -> None:
    assert not covers([p("country", "eq", "FR")], [])  # everything
    assert not covers([p("country", "eq", "FR")], [p("country", "ne", "DE")])
    assert not covers([p("country", "eq", "FR")], [p("lat", "gt", 3)])  # another key
    assert not covers([p("t", "ge", 0)], [p("t", "ge", -1)])
    assert not covers([p("t", "le", 5)], [p("t", "eq", "five")])  # a value of another class
    assert not covers([p("t", "ne", 5)], [p("t", "exists", None)])  # any value, strings too
    assert not covers([p("id", "starts_with", "tr")], [p("id", "contains", "tr")])
    assert not covered_by_any([], [p("a", "eq", 1)])
