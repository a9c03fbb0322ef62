"""Scopes: the registry section, and visibility against a brute-force oracle over random scope graphs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.matching import Predicate, matches
from veil.protocol import ProtocolError
from veil.security.registry import parse_registry
from veil.security.scopes import WORLD, Scopes

KEYS = ("kind", "level")
constraint = st.one_of(
    st.builds(lambda v: {"key": "kind", "op": "eq", "val": v}, st.sampled_from(["a", "b", "c"])),
    st.builds(lambda v: {"key": "level", "op": "ge", "val": v}, st.integers(0, 3)),
)
filters = st.lists(st.lists(constraint, max_size=2), max_size=2)


@st.composite
def graphs(draw: st.DrawFn) -> dict:
    """Up to six scopes; edges run from lower to higher numbers only, so the graph is acyclic."""
    count = draw(st.integers(1, 6))
    names = [f"s{i}" for i in range(count)]
    doc = {}
    for i, name in enumerate(names):
        children = draw(st.lists(st.sampled_from(names[i + 1 :]), unique=True)) if i + 1 < count else []
        doc[name] = {"scopes": children, "export": draw(filters), "import": draw(filters), "users": [f"u{i}"]}
    return doc


publications = st.fixed_dictionaries({}, optional={"kind": st.sampled_from(["a", "b", "c"]), "level": st.integers(0, 3)})


def oracle_visible(doc: dict, origin: str, target: str, publication: dict) -> bool:
    """Is there a path of border crossings from `origin` to `target`, each allowed by the interface
    it crosses? Every simple path is tried, one by one."""

    def passes(filters: list, attributes: dict) -> bool:
        return any(matches([Predicate(c["key"], c["op"], c["val"]) for c in f], attributes) for f in filters)

    parents = {name: [p for p, entry in doc.items() if name in entry["scopes"]] for name in doc}

    def moves(name: str) -> list[str]:
        out = []
        children = [n for n in doc if not parents[n]] if name == WORLD else doc[name]["scopes"]
        out += [c for c in children if passes(doc[c]["import"], publication)]
        if name != WORLD and passes(doc[name]["export"], publication):
            out += parents[name] or [WORLD]
        return out

    def paths(path: list[str]) -> bool:
        if path[-1] == target:
            return True
        return any(paths([*path, step]) for step in moves(path[-1]) if step not in path)

    return paths([origin])


@settings(max_examples=300, deadline=None)
@given(graphs(), publications, st.data())
def test_reach_is_every_scope_a_path_of_allowed_crossings_leads_to(doc, publication, data):
    scopes = parse_registry({"scopes": doc}).scopes
    names = [WORLD, *doc]
    origin = data.draw(st.sampled_from(names))
    reached = scopes.reach(origin, publication)
    for target in names:
        assert (target in reached) == oracle_visible(doc, origin, target, publication), (origin, target)


def test_a_scope_keeps_its_traffic_unless_its_interfaces_say_otherwise():
    scopes = parse_registry(
        {
            "scopes": {
                "customs": {"scopes": ["customs-fr"], "export": [[{"key": "kind", "op": "eq", "val": "summary"}]]},
                "customs-fr": {"import": [[{"key": "country", "op": "eq", "val": "FR"}]], "export": [[]]},
                "closed": {},
            }
        }
    ).scopes
    assert scopes.reach("closed", {"kind": "summary"}) == {"closed"}
    assert scopes.reach("customs", {"kind": "detail"}) == {"customs"}
    assert scopes.reach("customs", {"kind": "summary"}) == {"customs", WORLD}
    assert scopes.reach("customs", {"country": "FR"}) == {"customs", "customs-fr"}
    assert scopes.reach("customs-fr", {"kind": "detail"}) == {"customs-fr", "customs"}
    assert scopes.reach("customs-fr", {"kind": "summary"}) == {"customs-fr", "customs", WORLD}
    assert scopes.reach(WORLD, {"country": "FR"}) == {WORLD}  # no top-level scope imports
    assert scopes.reach("gone", {}) == frozenset()


def test_membership_by_registry_or_by_attributes():
    registry = parse_registry(
        {"groups": {"agents": ["bob"]}, "scopes": {"customs": {"users": ["alice"], "groups": ["agents"]}}}
    )
    scopes: Scopes = registry.scopes
    assert scopes.is_member("customs", "alice", frozenset())
    assert scopes.is_member("customs", "bob", registry.groups_of("bob"))
    assert not scopes.is_member("customs", "eve", frozenset())
    assert scopes.is_member("customs", "eve", frozenset(), admitted=frozenset({"customs"}))
    assert scopes.is_member(WORLD, "eve", frozenset())
    assert scopes.members("customs", registry.members) == {"alice", "bob"}
    assert "alice" in registry.users


@pytest.mark.parametrize(
    ("doc", "field", "problem"),
    [
        ({"a": {"scopes": ["b"]}, "b": {"scopes": ["a"]}}, "scopes.a.scopes", "cycle"),
        ({"a": {"scopes": ["a"]}}, "scopes.a.scopes", "itself"),
        ({"a": {"scopes": ["nowhere"]}}, "scopes.a.scopes[0]", "no scope 'nowhere'"),
        ({"a": {"export": [[{"key": "k", "op": "gt", "val": "x", "type": "int"}]]}}, "scopes.a.export[0][0].val", ""),
        ({"a": {"members": []}}, "scopes.a.members", "unknown field"),
        ({"a": {"keys": {"one": {}}}}, "scopes.a.keys.one", "whole number"),
        ({"a": {"keys": {"1": {"alice": "c2hvcnQ="}}}}, "scopes.a.keys.1.keyId", "signing key"),
        ({"a": {"keys": {"1": {"keyId": "k", "signature": "c2hvcnQ="}}}}, "scopes.a.keys.1.signature", "64 bytes"),
        ({"": {}}, "scopes.", "non-empty"),
    ],
)
def test_mistakes_name_their_field(doc, field, problem):
    with pytest.raises(ProtocolError) as caught:
        parse_registry({"scopes": doc})
    assert caught.value.field == field
    assert problem in caught.value.problem


def test_a_long_chain_of_scopes_parses_without_recursion():
    chain = {f"s{i}": {"scopes": [f"s{i + 1}"]} for i in range(5000)} | {"s5000": {}}
    assert parse_registry({"scopes": chain}).scopes.top == ("s0",)
