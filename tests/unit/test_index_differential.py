"""The index against the reference semantics: random subscriptions and publications over every
operator and type, adds and removes interleaved, publications matched in batches."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from veil.matching import Predicate, SubscriptionIndex, matches

KEYS = ["a", "b", "c", "d.[0]", "e.f"]
numbers = st.one_of(
    st.integers(-5, 5),
    st.floats(-5, 5, allow_nan=False).map(lambda f: round(f, 1)),
    st.sampled_from([2**53 + 1, -(2**60), 2**53]),
)
strings = st.sampled_from(["", "a", "ab", "abc", "b", "ba", "MED", "MED FRIGO", "é", "zz"])
booleans = st.booleans()
scalars = st.one_of(numbers, strings, booleans)


@st.composite
def predicates(draw: st.DrawFn) -> Predicate:
    key = draw(st.sampled_from(KEYS))
    kind = draw(st.sampled_from(["number", "string", "bool", "exists"]))
    if kind == "exists":
        return Predicate(key, "exists", None)
    if kind == "bool":
        op = draw(st.sampled_from(["eq", "ne", "in"]))
        return Predicate(
            key, op, draw(st.lists(booleans, min_size=1, max_size=2, unique=True)) if op == "in" else draw(booleans)
        )
    values = numbers if kind == "number" else strings
    ops = ["eq", "ne", "gt", "ge", "lt", "le", "between", "in"]
    if kind == "string":
        ops += ["contains", "starts_with", "ends_with"]
    op = draw(st.sampled_from(ops))
    if op == "between":
        low, high = sorted([draw(values), draw(values)])
        return Predicate(key, op, [low, high])
    if op == "in":
        items = draw(st.lists(values, min_size=1, max_size=3))
        unique = []
        for item in items:
            if item not in unique:
                unique.append(item)
        return Predicate(key, op, unique)
    return Predicate(key, op, draw(values))


publications = st.dictionaries(st.sampled_from([*KEYS, "other"]), scalars, max_size=5)
operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(0, 30),
            st.lists(predicates(), max_size=4) | st.lists(predicates(), min_size=5, max_size=40),
        ),
        st.tuples(st.just("remove"), st.integers(0, 30)),
        st.tuples(st.just("match"), st.lists(publications, min_size=1, max_size=8)),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_index_equals_brute_force(ops):
    index = SubscriptionIndex()
    reference: dict[str, list[Predicate]] = {}
    for op in ops:
        if op[0] == "add":
            sub_id = f"s{op[1]}"
            index.add(sub_id, op[2])
            reference[sub_id] = op[2]
        elif op[0] == "remove":
            index.remove(f"s{op[1]}")
            reference.pop(f"s{op[1]}", None)
        else:
            batch = op[1]
            got = index.match_batch(batch)
            for publication, found in zip(batch, got, strict=True):
                expected = sorted(s for s, p in reference.items() if matches(p, publication))
                assert sorted(found) == expected, publication
    assert len(index) == len(reference)


def test_many_updates_trigger_merges_and_rebuilds():
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
def test_long_subscriptions_fail_at_any_position(lengths, failures):
    """Verification drops pairs stage by stage: a publication failing a subscription's n-th
    predicate, for every n across the stage boundaries, matches exactly as the reference says."""
    index = SubscriptionIndex()
    reference = {}
    for i, length in enumerate(lengths):
        reference[f"s{i}"] = [Predicate(f"a{j}", "ge", 0) for j in range(length)]
        index.add(f"s{i}", reference[f"s{i}"])
    batch = [{f"a{j}": -1 if j == failing else 1 for j in range(45)} for failing in failures]
    for publication, found in zip(batch, index.match_batch(batch), strict=True):
        assert sorted(found) == sorted(s for s, p in reference.items() if matches(p, publication))
