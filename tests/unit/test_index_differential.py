"""The index against an oracle written here from the README's semantics, sharing no code with the
matcher: subscriptions in their wire form (parsed by the protocol as a gateway parses them), tens of
them live while others are added, replaced and removed, and batches of publications matched against
them, many of them built on a live subscription's own values so that bounds are hit. Most numbers
fit float64 exactly, so the index's own vectorised paths decide most comparisons; the integers
beyond 2**53 reach the exact path it keeps for them. A second property crowds values on both sides
of where float64 rounds; an exhaustive test files every operator at every bound both as the
constraint the index finds candidates by and as one its verification decides: a random draw seldom
puts a value exactly on a bound behind another constraint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from veil.matching import Predicate, SubscriptionIndex
from veil.protocol.subscriptions import parse_predicate

KEYS = ["a", "b", "c", "d.[0]", "e.f"]
EXACT = 2**53
# numbers float64 holds exactly, around the values the other strategies use and at the exact limit
# (1e20 is a float beyond 2**53 that float64 holds exactly: the vectorised path decides it)
ORDINARY_NUMBERS = st.one_of(
    st.integers(-2, 2),
    st.integers(-4, 4).map(lambda halves: halves / 2),
    st.sampled_from([EXACT, -EXACT, EXACT - 1, float(EXACT), 1e20]),
)
# integers float64 cannot hold: 2**53 + 1 and 10**20 + 1 round to neighbours drawn above
HUGE_INTEGERS = st.sampled_from([EXACT + 1, -EXACT - 1, EXACT + 2, 10**20, 10**20 + 1, -(2**64)])
ONE_IN_TWENTY = st.integers(0, 19)
# where float64 rounds: each integer beyond 2**53 here shares its float64 with a value here that is
# exact, or with another integer here
NEAR_THE_LIMITS = st.sampled_from(
    [EXACT - 1, EXACT, float(EXACT), EXACT + 1, EXACT + 2, -EXACT, -EXACT - 1, 1e20, 10**20 - 1, 10**20, 10**20 + 1]
)
# code point order differs from UTF-16 order between U+FFFF and U+1F600
STRINGS = st.sampled_from(["", "a", "ab", "abc", "b", "ba", "MED", "MED FRIGO", "é", "zz", "\uffff", "\U0001f600"])
BOOLEANS = st.booleans()
SUBSCRIPTION_SHAPE = st.integers(0, 29)
SHORT, LONG = st.integers(1, 4), st.integers(5, 12)
POPULATION_SIZE = st.integers(10, 60)
STEPS = st.sampled_from(["add", "replace", "remove", "match", "match", "match"])
THREE_IN_FOUR = st.sampled_from([True, True, True, False])
NUMBER_OPS = ["eq", "ne", "gt", "ge", "lt", "le", "between", "in"]
STRING_OPS = [*NUMBER_OPS, "contains", "starts_with", "ends_with"]
BOOLEAN_OPS = ["eq", "ne", "in"]


@st.composite
def number(draw: st.DrawFn) -> int | float:
    """One number in twenty beyond float64's exact integers."""
    return draw(HUGE_INTEGERS if draw(ONE_IN_TWENTY) == 0 else ORDINARY_NUMBERS)


NUMBERS = number()


def value_class(values: st.SearchStrategy, ops: list[str]) -> tuple[st.SearchStrategy, ...]:
    """A class of values as constraints use it: its values, its operators, lists of its values."""
    return values, st.sampled_from(ops), st.lists(values, min_size=1, max_size=3)


@st.composite
def constraint(draw: st.DrawFn, keys: st.SearchStrategy, kinds: st.SearchStrategy, classes: dict[str, tuple]) -> dict:
    """One constraint as a client sends it: {"key", "val", "op"}."""
    key, kind = draw(keys), draw(kinds)
    if kind == "any":
        return {"key": key, "val": "*", "op": "eq"}
    values, ops, lists = classes[kind]
    op = draw(ops)
    if op == "between":
        return {"key": key, "val": sorted([draw(values), draw(values)], key=order_key), "op": op}
    return {"key": key, "val": draw(lists if op == "in" else values), "op": op}


@st.composite
def subscription(draw: st.DrawFn, constraints: st.SearchStrategy) -> list[dict]:
    """Mostly short conjunctions, which match often; some long ones, verified in stages; rarely the
    empty one, which matches everything."""
    shape = draw(SUBSCRIPTION_SHAPE)
    if shape == 0:
        return []
    return [draw(constraints) for _ in range(draw(LONG if shape < 5 else SHORT))]


@st.composite
def population(draw: st.DrawFn, subscriptions: st.SearchStrategy) -> list[list[dict]]:
    """Tens of subscriptions, spread evenly over 10 to 60 rather than skewed to the smallest lists."""
    return [draw(subscriptions) for _ in range(draw(POPULATION_SIZE))]


ALL_CONSTRAINTS = constraint(
    st.sampled_from(KEYS),
    st.sampled_from(["number", "number", "string", "bool", "any"]),
    {
        "number": value_class(NUMBERS, NUMBER_OPS),
        "string": value_class(STRINGS, STRING_OPS),
        "bool": value_class(BOOLEANS, BOOLEAN_OPS),
    },
)
ALL_SUBSCRIPTIONS = subscription(ALL_CONSTRAINTS)
ALL_BATCHES = st.lists(
    st.dictionaries(st.sampled_from([*KEYS, "other"]), st.one_of(NUMBERS, STRINGS, BOOLEANS), min_size=1, max_size=6),
    min_size=1,
    max_size=8,
)

NEAR_KEYS = ["a", "b"]
NEAR_CONSTRAINTS = constraint(
    st.sampled_from(NEAR_KEYS), st.just("number"), {"number": value_class(NEAR_THE_LIMITS, NUMBER_OPS)}
)
NEAR_SUBSCRIPTIONS = subscription(NEAR_CONSTRAINTS)
NEAR_BATCHES = st.lists(
    st.dictionaries(st.sampled_from(NEAR_KEYS), NEAR_THE_LIMITS, min_size=1), min_size=1, max_size=8
)


# --- the oracle ------------------------------------------------------------------------------------
def kind_of(value: object) -> str | None:
    """The class of value a constraint compares with: booleans are not numbers here, unlike Python."""
    if value is True or value is False:
        return "boolean"
    if type(value) in (int, float):
        return "number"
    if type(value) is str:
        return "string"
    return None


def order_key(value: object) -> Fraction | tuple[int, ...] | bool:
    """Numbers as exact fractions (no rounding to float64 at any size), strings as code points."""
    if kind_of(value) == "number":
        return Fraction(value)  # type: ignore[arg-type]
    if kind_of(value) == "string":
        return tuple(ord(c) for c in value)  # type: ignore[union-attr]
    return value  # type: ignore[return-value]


def occurs_at(text: str, part: str, start: int) -> bool:
    return 0 <= start <= len(text) - len(part) and all(text[start + i] == c for i, c in enumerate(part))


def satisfied(constraint: Mapping[str, object], publication: Mapping[str, object]) -> bool:
    key, op, target = constraint["key"], constraint["op"], constraint["val"]
    if key not in publication:
        return False
    value = publication[key]  # type: ignore[index]
    if op == "eq" and target == "*":
        return True
    listed = target if op in ("in", "between") else [target]
    if kind_of(value) != kind_of(listed[0]):  # type: ignore[index]
        return False
    have = order_key(value)
    if op in ("eq", "ne", "in"):
        found = any(have == order_key(t) for t in listed)  # type: ignore[union-attr]
        return not found if op == "ne" else found
    if op == "contains":
        return any(occurs_at(value, target, i) for i in range(len(value) + 1))  # type: ignore[arg-type]
    if op == "starts_with":
        return occurs_at(value, target, 0)  # type: ignore[arg-type]
    if op == "ends_with":
        return occurs_at(value, target, len(value) - len(target))  # type: ignore[arg-type]
    if op == "between":
        low, high = (order_key(t) for t in listed)  # type: ignore[union-attr]
        return low <= have <= high  # type: ignore[operator]
    want = order_key(target)
    return {"gt": have > want, "ge": have >= want, "lt": have < want, "le": have <= want}[op]  # type: ignore[operator]


def expected_matches(live: Mapping[str, list[dict]], publication: Mapping[str, object]) -> list[str]:
    return sorted(sub_id for sub_id, wire in live.items() if all(satisfied(c, publication) for c in wire))


def parsed(wire: Sequence[dict]) -> list[Predicate]:
    return [Predicate(*parse_predicate(c, f"data[{i}]")) for i, c in enumerate(wire)]


def neighbours(value: object) -> list[object]:
    """A value a constraint names and values just either side of it."""
    if kind_of(value) == "boolean":
        return [True, False]
    if kind_of(value) == "number":
        return [value - 1, value, value + 1]  # type: ignore[operator]
    return [value, f"{value}a", value[1:]]  # type: ignore[index]


def around(data: st.DataObject, live: Mapping[str, list[dict]], publication: dict) -> dict:
    """Most of the time, the publication takes for the keys of one live subscription values that
    subscription names or their neighbours: at a bound, where an inclusive and an exclusive
    comparison differ, and just either side of it, instead of where a random value rarely falls."""
    if not data.draw(THREE_IN_FOUR, label="around a subscription"):
        return publication
    wire = live[data.draw(st.sampled_from(sorted(live)), label="subscription")]
    named: dict[str, list[object]] = {}
    for c in wire:
        if c["val"] != "*":
            for value in c["val"] if isinstance(c["val"], list) else [c["val"]]:
                named.setdefault(c["key"], []).extend(neighbours(value))
    return publication | {key: data.draw(st.sampled_from(values), label=key) for key, values in named.items()}


def run_against_the_oracle(
    data: st.DataObject, initial: list[list[dict]], subscriptions: st.SearchStrategy, batches: st.SearchStrategy
) -> None:
    """Fill an index, then add, replace, remove and match in a drawn order, never below ten live
    subscriptions: every match compares the index with the oracle over all of them."""
    index = SubscriptionIndex()
    live: dict[str, list[dict]] = {}
    for number, wire in enumerate(initial):
        index.add(f"s{number}", parsed(wire))
        live[f"s{number}"] = wire
    fresh = len(initial)
    for _ in range(data.draw(st.integers(4, 12), label="steps")):
        step = data.draw(STEPS, label="step")
        if step == "match" or (step == "remove" and len(live) <= 10):
            batch = [around(data, live, publication) for publication in data.draw(batches, label="batch")]
            for publication, found in zip(batch, index.match_batch(batch), strict=True):
                assert sorted(found) == expected_matches(live, publication), publication
        elif step == "remove":
            sub_id = data.draw(st.sampled_from(sorted(live)), label="removed")
            index.remove(sub_id)
            del live[sub_id]
        else:
            if step == "add":
                sub_id, fresh = f"s{fresh}", fresh + 1
            else:
                sub_id = data.draw(st.sampled_from(sorted(live)), label="replaced")
            wire = data.draw(subscriptions, label="subscription")
            index.add(sub_id, parsed(wire))
            live[sub_id] = wire
        assert len(index) == len(live)


# --- the tests -------------------------------------------------------------------------------------
def test_the_oracle_reads_the_semantics_as_written() -> None:
    """The oracle is the reference: its corner cases are pinned here by hand."""
    cases = [
        ({"key": "a", "val": "*", "op": "eq"}, {"a": False}, True),
        ({"key": "a", "val": "*", "op": "eq"}, {"b": 1}, False),
        ({"key": "a", "val": 1, "op": "ne"}, {}, False),
        ({"key": "a", "val": 1, "op": "ne"}, {"a": "1"}, False),
        ({"key": "a", "val": 1, "op": "eq"}, {"a": True}, False),
        ({"key": "a", "val": [True], "op": "in"}, {"a": 1}, False),
        ({"key": "a", "val": 1, "op": "eq"}, {"a": 1.0}, True),
        ({"key": "a", "val": EXACT + 1, "op": "eq"}, {"a": float(EXACT)}, False),
        ({"key": "a", "val": EXACT + 1, "op": "gt"}, {"a": float(EXACT)}, False),
        ({"key": "a", "val": 10**20 + 1, "op": "gt"}, {"a": 1e20}, False),
        ({"key": "a", "val": 10**20, "op": "eq"}, {"a": 1e20}, True),
        ({"key": "a", "val": "\uffff", "op": "lt"}, {"a": "\U0001f600"}, False),
        ({"key": "a", "val": "", "op": "ends_with"}, {"a": "ab"}, True),
        ({"key": "a", "val": "ba", "op": "contains"}, {"a": "abab"}, True),
        ({"key": "a", "val": "abc", "op": "ends_with"}, {"a": "bc"}, False),
        ({"key": "a", "val": [1, 2.5], "op": "between"}, {"a": 2.5}, True),
    ]
    for constraint, publication, outcome in cases:
        assert satisfied(constraint, publication) is outcome, (constraint, publication)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(initial=population(ALL_SUBSCRIPTIONS), data=st.data())
def test_index_equals_the_oracle(initial: list[list[dict]], data: st.DataObject) -> None:
    """Range bounds added since the last match are inserted into the sorted arrays by the next one:
    adds, replacements and removals between matches insert a few or many bounds into arrays of
    every size, beside those of removed subscriptions."""
    run_against_the_oracle(data, initial, ALL_SUBSCRIPTIONS, ALL_BATCHES)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(initial=population(NEAR_SUBSCRIPTIONS), data=st.data())
def test_numbers_where_float64_rounds_compare_exactly(initial: list[list[dict]], data: st.DataObject) -> None:
    """2**53 + 1 is not 2**53 and 10**20 + 1 is above 1e20, whichever side holds the integer: a
    matcher comparing in float64 alone would confuse them."""
    run_against_the_oracle(data, initial, NEAR_SUBSCRIPTIONS, NEAR_BATCHES)


def test_every_operator_at_every_bound_alone_and_behind_an_equality() -> None:
    """Each constraint is filed twice: alone, where the index finds its candidates by it (a bucket, a
    sorted bound, a prefix), and behind an equality on another key that the index
    prefers (that key's many decoy values make it look the most selective), so that its vectorised
    verification decides it instead. Every value is then matched against every constraint, at and on
    both sides of each bound."""
    numbers = [-1, 0, 0.5, 1, 1.0, EXACT - 1, EXACT, float(EXACT), EXACT + 1, -EXACT - 1, 1e20, 10**20 + 1]
    strings = ["", "a", "ab", "b", "é", "\uffff", "\U0001f600"]
    targets: list[tuple[str, object]] = [("eq", "*")]
    for values, ops in [(numbers, NUMBER_OPS), (strings, STRING_OPS), ([True, False], BOOLEAN_OPS)]:
        for op in ops:
            if op == "between":
                targets += [(op, [low, high]) for low in values for high in values if order_key(low) <= order_key(high)]
            else:
                targets += [(op, [value] if op == "in" else value) for value in values]
    live: dict[str, list[dict]] = {f"decoy{i}": [{"key": "k", "val": f"off{i}", "op": "eq"}] for i in range(64)}
    for number, (op, target) in enumerate(targets):
        live[f"alone{number}"] = [{"key": "x", "val": target, "op": op}]
        live[f"behind{number}"] = [{"key": "k", "val": "on", "op": "eq"}, {"key": "x", "val": target, "op": op}]
    index = SubscriptionIndex()
    for sub_id, wire in live.items():
        index.add(sub_id, parsed(wire))
    batch = [{"x": value, "k": "on"} for value in [*numbers, *strings, True, False]] + [{"k": "on"}]
    for publication, found in zip(batch, index.match_batch(batch), strict=True):
        assert sorted(found) == expected_matches(live, publication), publication


def test_many_updates_trigger_merges_and_rebuilds() -> None:
    index = SubscriptionIndex()
    for i in range(5000):
        index.add(f"s{i}", [Predicate("x", "gt", i % 100), Predicate("y", "lt", "m")])
    for i in range(0, 5000, 2):
        index.remove(f"s{i}")
    for i in range(0, 3000, 3):
        index.add(f"s{i}", [Predicate("x", "le", i % 100)])
    replaced = set(range(0, 3000, 3))
    expected = {f"s{i}" for i in range(1, 5000, 2) if i % 100 < 50 and i not in replaced}
    expected |= {f"s{i}" for i in replaced if i % 100 >= 50}
    assert set(index.match({"x": 50, "y": "a"})) == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 45), min_size=1, max_size=30), st.lists(st.integers(-1, 45), min_size=1, max_size=20))
def test_long_subscriptions_fail_at_any_position(lengths: list[int], failures: list[int]) -> None:
    """Verification drops pairs stage by stage: a publication failing a subscription's n-th
    predicate, for every n across the stage boundaries, matches exactly the subscriptions too short
    to hold that predicate."""
    index = SubscriptionIndex()
    for i, length in enumerate(lengths):
        index.add(f"s{i}", [Predicate(f"a{j}", "ge", 0) for j in range(length)])
    batch = [{f"a{j}": -1 if j == failing else 1 for j in range(45)} for failing in failures]
    for failing, found in zip(failures, index.match_batch(batch), strict=True):
        assert sorted(found) == sorted(f"s{i}" for i, length in enumerate(lengths) if not 0 <= failing < length)


def test_long_subscriptions_of_many_lengths_are_checked_in_groups_of_one_width() -> None:
    """Past the last stage's start a pair's width is its length less 28: subscriptions of many
    lengths make more widths than the first stage's few, which are grouped by one sort."""
    live: dict[str, list[dict]] = {}
    for length in range(29, 45):
        for failing in (None, 0, length - 1):  # all hold, or the first or the last fails
            wire = [{"key": f"k{i}", "val": i, "op": "ge" if i != failing else "gt"} for i in range(length)]
            live[f"s{length}.{failing}"] = wire
    index = SubscriptionIndex()
    for sub_id, wire in live.items():
        index.add(sub_id, parsed(wire))
    batch = [{f"k{i}": i for i in range(n)} for n in (0, 30, 44, 50)]
    for publication, found in zip(batch, index.match_batch(batch), strict=True):
        assert sorted(found) == expected_matches(live, publication), publication
