import random

import pytest

from veil.matching import Predicate, SubscriptionIndex, evaluate, matches


@pytest.mark.parametrize(
    ("op", "target", "value", "expected"),
    [
        ("eq", 20, 20.0, True),
        ("eq", 1, True, False),
        ("eq", "20", 20, False),
        ("ne", 5, 6, True),
        ("ne", 5, "x", False),
        ("gt", 14, 14.5, True),
        ("gt", 14, 14, False),
        ("ge", 14, 14, True),
        ("lt", 2.5, 2, True),
        ("le", "b", "b", True),
        ("lt", "b", "a", True),
        ("gt", "b", "ab", False),
        ("gt", 1, "2", False),
        ("between", [1, 3], 3, True),
        ("between", [1, 3], 3.01, False),
        ("between", ["a", "c"], "b", True),
        ("in", [1, 2], 2.0, True),
        ("in", ["x"], "y", False),
        ("in", [1], True, False),
        ("contains", "FRIGO", "MED FRIGO", True),
        ("starts_with", "MED", "MED FRIGO", True),
        ("ends_with", "MED", "MED FRIGO", False),
        ("contains", "1", 10, False),
        ("eq", True, True, True),
        ("ne", True, False, True),
        ("exists", None, "anything", True),
    ],
)
def test_operator_semantics(op, target, value, expected):
    assert evaluate(op, target, value) is expected


def test_missing_key_is_false_even_for_ne():
    assert not matches([Predicate("a", "ne", 1)], {"b": 1})
    assert matches([], {"b": 1})


def random_predicate(rng: random.Random) -> Predicate:
    key = rng.choice("abcd")
    op = rng.choice(["eq", "ne", "gt", "lt", "ge", "le", "between", "in", "exists", "contains", "starts_with"])
    if op in ("contains", "starts_with"):
        return Predicate(key, op, rng.choice(["x", "y", "xy"]))
    if op == "between":
        low = rng.randint(0, 8)
        return Predicate(key, op, [low, low + rng.randint(0, 4)])
    if op == "in":
        return Predicate(key, op, rng.sample(range(10), 3))
    if op == "exists":
        return Predicate(key, op, None)
    return Predicate(key, op, rng.choice([rng.randint(0, 10), rng.random() * 10, "x", True]))


def random_publication(rng: random.Random) -> dict:
    return {
        k: rng.choice([rng.randint(0, 10), rng.random() * 10, "x", "xy", "yx", False, True])
        for k in rng.sample("abcde", rng.randint(0, 5))
    }


def test_index_agrees_with_reference_semantics():
    rng = random.Random(7)
    index = SubscriptionIndex()
    subscriptions: dict[str, list[Predicate]] = {}
    for step in range(3000):
        action = rng.random()
        if action < 0.3:
            sub_id = f"s{rng.randint(0, 150)}"
            predicates = [random_predicate(rng) for _ in range(rng.randint(0, 3))]
            index.add(sub_id, predicates)
            subscriptions[sub_id] = predicates
        elif action < 0.4 and subscriptions:
            sub_id = rng.choice(sorted(subscriptions))
            index.remove(sub_id)
            del subscriptions[sub_id]
        else:
            publication = random_publication(rng)
            expected = {s for s, p in subscriptions.items() if matches(p, publication)}
            assert set(index.match(publication)) == expected, (step, publication)
    assert len(index) == len(subscriptions)


def test_duplicate_equality_predicates_count_separately():
    index = SubscriptionIndex()
    index.add("s", [Predicate("a", "eq", 5), Predicate("a", "in", [5, 6])])
    assert index.match({"a": 5}) == ["s"]
    assert index.match({"a": 6}) == []


def test_removing_a_range_subscription_leaves_a_clean_index():
    index = SubscriptionIndex()
    box = [Predicate("lat", "ge", 1), Predicate("lat", "le", 5), Predicate("lon", "between", [0, 9])]
    index.add("s", box)
    index.remove("s")
    index.add("s", box)
    assert index.match({"lat": 3, "lon": 3}) == ["s"]
    index.remove("s")
    assert len(index) == 0 and index.match({"lat": 3, "lon": 3}) == []
