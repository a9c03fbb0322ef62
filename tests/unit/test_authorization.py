"""The pipeline's match + authorize path against the one-pair-at-a-time oracle of SPEC §6: random
users, groups, rules, policies, cropping rules, subscriptions and publications. The code under test
is what a matcher task runs (its partition state and the round core), without Spark."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_scopes import oracle_visible
from veil.matching import Predicate, matches
from veil.matching.stored import encode_subscription
from veil.pipeline.match import match_round
from veil.pipeline.worker_state import State
from veil.protocol import ProtocolError, flatten
from veil.protocol.reserved import SCOPE
from veil.security.authorization import crop, decide
from veil.security.registry import ANONYMOUS, parse_registry, secret_digest
from veil.security.scopes import WORLD
from veil.store import KIND_PUBLICATION, LogEntry

USERS = ["u0", "u1", "u2", "u3", ANONYMOUS]
PUBLISHERS = ["p0", "p1", ANONYMOUS]
GROUPS = ["g0", "g1", "g2"]
VALUES = {"_type": ["sale", "gps"], "country": ["FR", "GB"], "amount": [1, 5, 9], "id": ["truck-a", "truck-b"]}
FIELDS = ["amount", "country", "meta.secret", "meta"]
SCOPES = ["customs", "customs-fr", "sales"]


@st.composite
def constraints(draw: st.DrawFn, most: int = 2) -> list[dict]:
    out = []
    for key in draw(st.lists(st.sampled_from(sorted(VALUES)), max_size=most, unique=True)):
        value = draw(st.sampled_from(VALUES[key]))
        op = draw(st.sampled_from(["eq", "ne"] + (["gt", "le"] if key == "amount" else [])))
        out.append({"key": key, "val": value, "op": op})
    return out


@st.composite
def policies(draw: st.DrawFn) -> list[dict]:
    return [
        {"data": draw(constraints()), "group": draw(st.sampled_from([*GROUPS, "*"]))}
        for _ in range(draw(st.integers(0, 2)))
    ]


@st.composite
def registries(draw: st.DrawFn) -> dict:
    named = [u for u in USERS if u]
    doc: dict = {"users": {u: {"groups": draw(st.lists(st.sampled_from(GROUPS), unique=True))} for u in named}}
    doc["rules"] = {
        user: draw(st.lists(constraints(), max_size=2))
        for user in draw(st.lists(st.sampled_from([*named, "*"]), unique=True))
    }
    doc["policies"] = {publisher: draw(policies()) for publisher in ("p0", "p1")}
    # what publishers set themselves: policies that hold beside the admins'
    doc["publishers"] = {publisher: {"policies": draw(policies())} for publisher in ("p0", "p1") if draw(st.booleans())}
    doc["cropping"] = {
        publisher: [
            {
                "data": draw(constraints(1)),
                "fields": draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=2, unique=True)),
                "users": draw(st.lists(st.sampled_from(named), max_size=1)),
                "groups": draw(st.lists(st.sampled_from(GROUPS), min_size=1, max_size=1)),
            }
            for _ in range(draw(st.integers(0, 2)))
        ]
        for publisher in ("p0", "p1")
    }
    if draw(st.booleans()):
        doc["scopes"] = {
            name: {
                "users": draw(st.lists(st.sampled_from(named), unique=True, max_size=2)),
                "groups": draw(st.lists(st.sampled_from(GROUPS), unique=True, max_size=1)),
                "scopes": draw(st.lists(st.sampled_from(SCOPES[i + 1 :]), unique=True)) if i + 1 < len(SCOPES) else [],
                "export": draw(st.lists(constraints(1), max_size=1)),
                "import": draw(st.lists(constraints(1), max_size=1)),
            }
            for i, name in enumerate(SCOPES)
        }
    return doc


@st.composite
def publications(draw: st.DrawFn) -> tuple[str, dict]:
    doc = {key: draw(st.sampled_from(values)) for key, values in VALUES.items() if draw(st.booleans())}
    if draw(st.booleans()):
        doc["meta"] = {"secret": draw(st.integers(0, 3)), "open": 1}
    if draw(st.booleans()):
        doc[SCOPE] = draw(st.sampled_from([*SCOPES, "gone"]))
    return draw(st.sampled_from(PUBLISHERS)), doc


def without(doc: dict, fields: frozenset[str], prefix: str = "") -> dict:
    """The document rebuilt member by member, leaving out every member whose dotted path from the
    root is a cropped field: written apart from the pipeline's `crop`, which deletes the fields from
    a parsed copy, so that the two can disagree."""
    kept = {}
    for name, value in doc.items():
        path = prefix + name
        if path not in fields:
            kept[name] = without(value, fields, f"{path}.") if isinstance(value, dict) else value
    return kept


subscriptions = st.tuples(st.sampled_from(USERS), constraints(), st.sampled_from(["", *SCOPES]), st.booleans())


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    registries(),
    st.booleans(),
    st.lists(subscriptions, max_size=8),
    st.lists(publications(), min_size=1, max_size=12),
)
def test_pipeline_delivers_exactly_what_the_oracle_allows(registry_doc, with_authorization, subscriptions, published):
    """Scopes included: the oracle's visibility is the path enumeration of the scope tests."""
    registry = parse_registry(registry_doc)
    state = State(orjson.dumps(registry_doc), with_authorization)
    for number, (owner, data, scope, admitted) in enumerate(subscriptions):
        predicates = [[c["key"], c["op"], c["val"]] for c in data]
        state.add(f"s{number}", number, owner, encode_subscription(predicates, scope=scope, admitted=admitted))
    bodies = [orjson.dumps(doc) for _, doc in published]
    entries = [
        LogEntry(offset, KIND_PUBLICATION, None, body, publisher, 0)
        for offset, ((publisher, _), body) in enumerate(zip(published, bodies, strict=True), start=1)
    ]
    done = match_round(state, entries, len(entries))
    cropped = {(offset, sub_no): copy for sub_no, offset, copy in done.copies}
    delivered = {
        (offset, sub_no): cropped.get((offset, sub_no))
        for sub_no, offset in zip(np.asarray(done.sub_nos).tolist(), np.asarray(done.pubs).tolist(), strict=True)
    }
    assert len(delivered) == len(done.pubs)  # each pair once
    expected = {}
    for offset, (publisher, doc) in enumerate(published, start=1):
        attributes = flatten(doc)
        for number, (owner, data, scope, admitted) in enumerate(subscriptions):
            if not matches([Predicate(c["key"], c["op"], c["val"]) for c in data], attributes):
                continue
            allowed, cropped = decide(registry, with_authorization, publisher, attributes, owner, scope, admitted)
            origin = doc.get(SCOPE, WORLD)
            known = origin == WORLD or origin in registry.scopes.by_name
            visible = known and oracle_visible(registry_doc.get("scopes", {}), origin, scope, attributes)
            member = registry.scopes.is_member(scope, owner, registry.groups_of(owner), frozenset({scope} if admitted else ()))
            if not (visible and member):
                assert not allowed
            if allowed:
                expected[(offset, number)] = (without(doc, cropped) if cropped else None, cropped)
    assert delivered.keys() == expected.keys()  # no leak, no loss
    for pair, copy in delivered.items():
        expected_copy, removed = expected[pair]
        assert (copy is None) == (expected_copy is None), pair
        if copy is not None:
            assert orjson.loads(copy) == expected_copy
            kept = flatten(orjson.loads(copy))
            assert not any(key == name or key.startswith(name + ".") for key in kept for name in removed)


def test_a_publisher_cannot_lift_the_admins_policy_with_one_of_its_own():
    """An admin's policy keeps fleet's truck-bcd to group A; fleet's own policy opening it to anyone
    (or to another group) does not widen it, in the oracle and in the pipeline alike."""
    truck = [{"key": "id", "val": "truck-b", "op": "eq"}]
    for group, expected in (("*", [True, False]), ("g1", [False, False])):
        doc = {
            "users": {"u0": {"groups": ["g0"]}, "u1": {"groups": ["g1"]}},
            "rules": {"*": [[]]},
            "policies": {"fleet": [{"data": truck, "group": "g0"}]},
            "publishers": {"fleet": {"policies": [{"data": [], "group": group}]}},
        }
        registry = parse_registry(doc)
        attributes = {"id": "truck-b"}
        assert [decide(registry, True, "fleet", attributes, user)[0] for user in ("u0", "u1")] == expected
        state = State(orjson.dumps(doc), True)
        for number, user in enumerate(("u0", "u1")):
            state.add(f"s{number}", number, user, encode_subscription([], scope=""))
        done = match_round(state, [LogEntry(1, KIND_PUBLICATION, None, orjson.dumps(attributes), "fleet", 0)], 1)
        assert sorted(np.asarray(done.sub_nos).tolist()) == [n for n, allowed in enumerate(expected) if allowed]


def test_the_border_agency_example():
    """SPEC §6 / S0 §5.4: each agency sees only its country's sale statistics."""
    rule = [{"key": "_type", "val": "sale_statistics", "type": "string", "op": "eq"}]
    registry = parse_registry(
        {
            "rules": {
                "agency-fr": [[*rule, {"key": "country", "val": "FR", "type": "string", "op": "eq"}]],
                "agency-gb": [[*rule, {"key": "country", "val": "GB", "type": "string", "op": "eq"}]],
            }
        }
    )
    fr = {"_type": "sale_statistics", "country": "FR", "amount": "1000"}
    gb = {"_type": "sale_statistics", "country": "GB", "amount": "2000"}
    assert decide(registry, True, "company", fr, "agency-fr") == (True, frozenset())
    assert decide(registry, True, "company", gb, "agency-fr")[0] is False
    assert decide(registry, True, "company", gb, "agency-gb")[0] is True
    assert decide(registry, False, "company", gb, "agency-fr")[0] is True  # authorization off


def test_registry_mistakes_name_the_field():
    cases = [
        ({"users": {"a": {"group": ["x"]}}}, "users.a.group"),
        ({"rules": {"a": [[{"key": "k", "val": 1, "op": "like"}]]}}, "rules.a[0][0].op"),
        ({"policies": {"p": [{"data": []}]}}, "policies.p[0].group"),
        ({"cropping": {"p": [{"data": [], "fields": [], "users": ["a"]}]}}, "cropping.p[0].fields"),
        ({"cropping": {"p": [{"data": [], "fields": ["x"]}]}}, "cropping.p[0]"),
        ({"keys": {"p": {"k1": "not base64!"}}}, "keys.p.k1"),
        ({"groups": {"*": ["a"]}}, "groups.*"),
        ({"roles": {}}, "roles"),
    ]
    for doc, field in cases:
        with pytest.raises(ProtocolError) as error:
            parse_registry(doc)
        assert error.value.field == field, doc


def test_crop_reaches_into_nested_objects():
    body = b'{"a":1,"meta":{"secret":2,"open":3},"b.c":4}'
    assert orjson.loads(crop(body, ["meta.secret", "b.c", "missing.x"])) == {"a": 1, "meta": {"open": 3}}


def test_a_late_rule_of_many_still_allows():
    """Rules are checked chunk by chunk; the one that allows may be in any chunk."""
    rules = [[{"key": "n", "val": i, "op": "eq"}] for i in range(45)]
    doc = {"rules": {"u0": rules, "u1": rules[:3]}}
    state = State(orjson.dumps(doc), True)
    state.add("s0", 0, "u0", b"[]")
    state.add("s1", 1, "u1", b"[]")
    entries = [
        LogEntry(offset, KIND_PUBLICATION, None, orjson.dumps({"n": n}), "p", 0)
        for offset, n in enumerate([0, 17, 44, 45], start=1)
    ]
    done = match_round(state, entries, 4)
    pairs = zip(np.asarray(done.pubs).tolist(), np.asarray(done.sub_nos).tolist(), strict=True)
    assert sorted(pairs) == [(1, 0), (1, 1), (2, 0), (3, 0)]


def test_static_hashes_are_kept_as_digests_only():
    """A registry given clear secrets keeps (and so stores, logs and serves) only their SHA-256."""
    registry = parse_registry({"hashes": {"fleet-secret-1": "fleet", secret_digest("dev-secret-9"): "dev"}})
    assert registry.user_of_hash("fleet-secret-1") == "fleet" and registry.user_of_hash("dev-secret-9") == "dev"
    assert registry.user_of_hash(secret_digest("fleet-secret-1")) is None  # the digest proves nothing
    stored = registry.to_json()
    assert b"fleet-secret-1" not in stored and secret_digest("fleet-secret-1").encode() in stored
    assert parse_registry(orjson.loads(stored)).user_of_hash("fleet-secret-1") == "fleet"
    with pytest.raises(ProtocolError) as refused:
        parse_registry({"hashes": {"short": "x"}})
    assert refused.value.field == "hashes.shor..." and "sha256:" in refused.value.problem
