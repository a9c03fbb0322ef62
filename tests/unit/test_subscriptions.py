import orjson
import pytest

from veil.matching import Predicate, Unsatisfiable, check_satisfiable
from veil.protocol import ProtocolError, parse_handshake, parse_subscribe, parse_unsubscribe


def sub(*data, **extra):
    return orjson.dumps({"authHash": "h", "data": list(data), **extra})


def test_seed_subscription():
    req = parse_subscribe(
        sub({"key": "lat", "val": 14, "type": "int", "op": "gt"}, {"key": "lon", "val": 53, "type": "int", "op": "lt"})
    )
    assert req.auth_hash == "h" and req.subscription_id is None
    assert req.predicates == [("lat", "gt", 14), ("lon", "lt", 53)]


@pytest.mark.parametrize(
    ("op", "canonical"),
    [("EQ", "eq"), ("lq", "le"), ("ss", "contains"), (">=", "ge"), ("Starts_With", "starts_with"), ("ne", "ne")],
)
def test_operator_aliases(op, canonical):
    assert parse_subscribe(sub({"key": "k", "val": "v", "op": op})).predicates[0][1] == canonical


def test_values_converted_by_declared_type_and_wildcard():
    req = parse_subscribe(
        sub(
            {"key": "a", "val": "14", "type": "int", "op": "gt"},
            {"key": "b", "val": ["1", "2.5"], "type": "float", "op": "between"},
            {"key": "c", "val": [1, 2, 1], "op": "in"},
            {"key": "d", "val": "*", "op": "eq"},
        )
    )
    assert req.predicates == [("a", "gt", 14), ("b", "between", [1.0, 2.5]), ("c", "in", [1, 2]), ("d", "exists", None)]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"key": "a", "val": 1, "op": "like"}, "data[0].op"),
        ({"key": "a", "val": True, "op": "gt"}, "data[0].op"),
        ({"key": "a", "val": 1, "op": "contains"}, "data[0].op"),
        ({"key": "a", "val": [1], "op": "between"}, "data[0].val"),
        ({"key": "a", "val": 3, "op": "in"}, "data[0].val"),
        ({"key": "a", "val": [1, "x"], "op": "in"}, "data[0].val"),
        ({"key": "", "val": 1}, "data[0].key"),
        ({"key": "a", "val": None}, "data[0].val"),
        ({"key": "a", "val": "x", "type": "int"}, "data[0].val"),
        ({"key": "a", "val": {"x": 1}}, "data[0].val"),
        ("lat > 3", "data[0]"),
    ],
)
def test_invalid_constraints_name_the_field(data, field):
    with pytest.raises(ProtocolError) as err:
        parse_subscribe(sub(data))
    assert err.value.field == field


def test_request_level_errors():
    import orjson

    with pytest.raises(ProtocolError, match="authHash"):
        parse_subscribe(orjson.dumps({"authHash": 7, "data": []}))
    with pytest.raises(ProtocolError, match="data"):
        parse_subscribe(orjson.dumps({"authHash": "h"}))
    with pytest.raises(ProtocolError, match="subscriptionId"):
        parse_subscribe(orjson.dumps({"authHash": "h", "subscriptionId": 5, "data": []}))
    with pytest.raises(ProtocolError, match="subscriptionId"):
        parse_unsubscribe(orjson.dumps({"authHash": "h"}))
    assert parse_subscribe(orjson.dumps({"data": []})).auth_hash is None  # a certificate or token may prove it


@pytest.mark.parametrize(
    "predicates",
    [
        [("a", "gt", 5), ("a", "lt", 3)],
        [("a", "gt", 5), ("a", "le", 5)],
        [("a", "eq", 1), ("a", "eq", 2)],
        [("a", "eq", 1), ("a", "ne", 1)],
        [("a", "in", [1, 2]), ("a", "gt", 2)],
        [("a", "eq", "x"), ("a", "gt", 1)],
        [("a", "eq", True), ("a", "eq", False)],
        [("a", "starts_with", "ab"), ("a", "starts_with", "b")],
        [("a", "starts_with", "b"), ("a", "lt", "a")],
        [("a", "between", [5, 1])],
        [("a", "ge", 2), ("a", "le", 2), ("a", "ne", 2)],
        [("a", "lt", "")],
        [("a", "le", ""), ("a", "ne", "")],
        [("a", "le", ""), ("a", "contains", "x")],
        [("a", "contains", "x"), ("a", "eq", "abc")],
    ],
)
def test_unsatisfiable(predicates):
    with pytest.raises(Unsatisfiable) as err:
        check_satisfiable([Predicate(*p) for p in predicates])
    assert err.value.key == "a"


@pytest.mark.parametrize(
    "predicates",
    [
        [("a", "gt", 5), ("a", "lt", 6)],
        [("a", "ge", 5), ("a", "le", 5)],
        [("a", "le", ""), ("a", "ne", "x")],
        [("a", "eq", 1), ("a", "eq", 1.0)],
        [("a", "in", [1, 2]), ("a", "gt", 1)],
        [("a", "starts_with", "ab"), ("a", "starts_with", "a"), ("a", "ends_with", "z")],
        [("a", "exists", None), ("a", "eq", "x")],
        [("a", "eq", True), ("a", "ne", False)],
        [("a", "gt", 1), ("b", "lt", 0)],
        [],
    ],
)
def test_satisfiable(predicates):
    check_satisfiable([Predicate(*p) for p in predicates])


def test_handshake_extensions():
    hs = parse_handshake(b'{"authHash": "h", "subscriptionId": "s", "data": [], "ack": true, "resumeAfter": 7}')
    assert hs == ("h", "s", True, True, 7, None, "", (), None, False)
    with pytest.raises(ProtocolError, match="resumeAfter"):
        parse_handshake(b'{"authHash": "h", "subscriptionId": "s", "resumeAfter": -1}')
    with pytest.raises(ProtocolError, match="subscriptionId"):
        parse_handshake(b'{"authHash": "h"}')


@pytest.mark.parametrize(
    ("ids", "field"),
    [
        ([], "subscriptionIds"),
        ("s", "subscriptionIds"),
        (["a", 7], "subscriptionIds[1]"),
        (["a", ""], "subscriptionIds[1]"),
        (["a", "x" * 10_000], "subscriptionIds[1]"),
        (["a", "a"], "subscriptionIds"),
        ([f"s{i}" for i in range(2049)], "subscriptionIds"),
    ],
)
def test_a_multiplexed_handshake_names_what_is_wrong(ids, field):
    assert parse_handshake(orjson.dumps({"subscriptionIds": ["a", "b"]})).subscription_ids == ("a", "b")
    assert parse_handshake(orjson.dumps({"subscriptionIds": ["a"]})).envelope  # always enveloped
    with pytest.raises(ProtocolError) as refused:
        parse_handshake(orjson.dumps({"authHash": "h", "subscriptionIds": ids}))
    assert refused.value.field == field
    with pytest.raises(ProtocolError, match="instead of"):
        parse_handshake(orjson.dumps({"subscriptionIds": ["a"], "subscriptionId": "b"}))


def test_a_multiplexed_handshake_resumes_each_subscription_where_it_stopped():
    hs = parse_handshake(orjson.dumps({"subscriptionIds": ["a", "b", "c"], "resumeAfter": [9, None, 4]}))
    assert [hs.for_subscription(place).resume_after for place in range(3)] == [9, None, 4]
    assert [hs.for_subscription(place).subscription_id for place in range(3)] == ["a", "b", "c"]
    assert parse_handshake(orjson.dumps({"subscriptionIds": ["a"], "resumeAfter": 3})).for_subscription(0).resume_after == 3


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"subscriptionId": "a", "resumeAfter": [1]}, "resumeAfter"),
        ({"subscriptionIds": ["a"], "resumeAfter": [1, 2]}, "resumeAfter"),
        ({"subscriptionIds": ["a", "b"], "resumeAfter": [1]}, "resumeAfter"),
        ({"subscriptionIds": ["a", "b"], "resumeAfter": [1, -1]}, "resumeAfter[1]"),
        ({"subscriptionIds": ["a"], "resumeAfter": [2**63]}, "resumeAfter[0]"),
        ({"subscriptionIds": ["a"], "resumeAfter": [True]}, "resumeAfter[0]"),
        ({"subscriptionIds": ["a"], "resumeAfter": [[1]]}, "resumeAfter[0]"),
        ({"subscriptionIds": ["a"], "resumeAfter": {"a": 1}}, "resumeAfter"),
    ],
)
def test_a_resume_point_per_subscription_names_what_is_wrong(doc, field):
    with pytest.raises(ProtocolError) as refused:
        parse_handshake(orjson.dumps(doc))
    assert refused.value.field == field
