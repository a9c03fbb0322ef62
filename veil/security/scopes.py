"""Scopes (seed 003, SPEC §7): named groups of producers and consumers that bound where a
publication is visible, arranged as a directed acyclic graph, with interfaces saying what crosses
their borders.

A publication published into a scope (its `veil:scope` member) is visible in that scope. It moves
up to a scope's parents (or, from a scope without parents, to the world) when it matches one of the
scope's `export` filters, and down into a sub-scope when it matches one of the sub-scope's `import`
filters; it is visible wherever such moves take it. A publication without a scope is published in
the world, which every client is in, and enters top-level scopes through their `import` filters. A
subscription is made in one scope (the world by default) by a member of it and receives the
matching publications visible there. A scope without interfaces keeps its traffic in and lets
nothing in from outside.

Membership is the registry's (users, groups) or a client's attribute certificate or token claim
(`attributes`): the pipeline knows only the former, so a subscription admitted by attributes is
marked so when it is made. `keys` holds each version of the scope's sealing key: the roster its
manager signed (`rosters`) and the envelopes of the members who may still fetch them (`sealing`);
the broker keeps envelopes it cannot open, stored only through the scope key endpoints.

    scopes:
      customs:
        users: [alice]
        groups: [border-agents]
        scopes: [customs-fr]                             # sub-scopes
        export: [[{key: _type, val: summary, op: eq}]]   # what leaves it
        import: [[]]                                     # what enters it ([] = everything)
        subscribe: [[{key: country, val: FR, op: eq}]]   # filters its subscriptions must stay in
        managers: [carol]                                # who may store its key versions
        keys: {"1": {roster: {...}, keyId: carol-1, signature: ..., envelopes: {alice: <base64>}}}
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from veil.matching import Predicate, matches
from veil.protocol import ProtocolError
from veil.security.rosters import Roster, SignedRoster, envelope_digest, parse_signed
from veil.security.sealing import ENVELOPE_BYTES

WORLD = ""  # the scope of publications and subscriptions made in none
Filters = tuple[tuple[Predicate, ...], ...]


class KeyVersion(NamedTuple):
    """One version of a scope's key: its signed roster, and the envelopes still served."""

    signed: SignedRoster
    envelopes: Mapping[str, bytes]  # member -> envelope (those of departed members are pruned)

    @property
    def roster(self) -> Roster:
        return self.signed.roster

    def document(self) -> dict[str, Any]:
        envelopes = {m: base64.b64encode(e).decode() for m, e in self.envelopes.items()}
        return {**self.signed.document(), "envelopes": envelopes}


@dataclass(frozen=True)
class Scope:
    name: str
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    children: tuple[str, ...] = ()
    export: Filters = ()
    imports: Filters = ()
    subscribe: Filters | None = None  # None: the scope does not restrict subscriptions
    managers: frozenset[str] = frozenset()
    keys: Mapping[int, KeyVersion] = field(default_factory=dict)

    def exports(self, attributes: Mapping[str, object]) -> bool:
        return any(matches(list(f), attributes) for f in self.export)

    def admits(self, attributes: Mapping[str, object]) -> bool:
        return any(matches(list(f), attributes) for f in self.imports)


@dataclass(frozen=True)
class Scopes:
    by_name: Mapping[str, Scope] = field(default_factory=dict)
    parents: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # WORLD for top-level scopes
    top: tuple[str, ...] = ()  # the world's sub-scopes

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def children_of(self, name: str) -> tuple[str, ...]:
        return self.top if name == WORLD else self.by_name[name].children

    def reach(self, origin: str, attributes: Mapping[str, object]) -> frozenset[str]:
        """The scopes (WORLD among them) where a publication made in `origin` is visible; none for a
        scope that no longer exists."""
        if origin != WORLD and origin not in self.by_name:
            return frozenset()
        seen, todo = {origin}, [origin]
        while todo:
            name = todo.pop()
            moves = [c for c in self.children_of(name) if c not in seen and self.by_name[c].admits(attributes)]
            if name != WORLD and self.by_name[name].exports(attributes):
                moves += [p for p in self.parents[name] if p not in seen]
            for move in moves:
                seen.add(move)
                todo.append(move)
        return frozenset(seen)

    def is_member(self, name: str, user: str, groups: frozenset[str], admitted: frozenset[str] = frozenset()) -> bool:
        """Whether a client is in the scope: the registry says so, or its attributes (`admitted`)."""
        if name == WORLD:
            return True
        scope = self.by_name.get(name)
        return scope is not None and (user in scope.users or bool(scope.groups & groups) or name in admitted)

    def members(self, name: str, groups: Mapping[str, frozenset[str]]) -> frozenset[str]:
        """The users the registry puts in the scope (attribute-admitted clients are not known here)."""
        scope = self.by_name[name]
        return scope.users.union(*(groups.get(g, frozenset()) for g in scope.groups))


def parse_scopes(doc: object, constraints: Callable[[object, str], tuple[Predicate, ...]]) -> Scopes:
    """The registry's `scopes` section; `constraints` parses one filter (the registry's own)."""
    if not isinstance(doc, dict):
        raise ProtocolError("scopes", "an object: scope name -> {users, groups, scopes, export, import, ...}")
    by_name = {}
    for name, entry in doc.items():
        where = f"scopes.{name}"
        if not isinstance(name, str) or not name or len(name) > 256:
            raise ProtocolError(where, "a scope's name is a non-empty string of at most 256 characters")
        by_name[name] = _scope(name, entry, where, constraints)
    parents: dict[str, list[str]] = {name: [] for name in by_name}
    for scope in by_name.values():
        for i, child in enumerate(scope.children):
            if child not in by_name:
                raise ProtocolError(f"scopes.{scope.name}.scopes[{i}]", f"no scope {child!r} in this registry")
            parents[child].append(scope.name)
    _check_acyclic(by_name)
    top = tuple(sorted(name for name, ps in parents.items() if not ps))
    return Scopes(by_name, {name: tuple(ps) or (WORLD,) for name, ps in parents.items()}, top)


def _scope(name: str, entry: object, where: str, constraints: Callable[[object, str], tuple[Predicate, ...]]) -> Scope:
    if entry is None:
        entry = {}
    if not isinstance(entry, dict):
        raise ProtocolError(where, "an object")
    allowed = {"users", "groups", "scopes", "export", "import", "subscribe", "managers", "keys"}
    extra = sorted(set(entry) - allowed)
    if extra:
        raise ProtocolError(f"{where}.{extra[0]}", f"unknown field; use {sorted(allowed)}")

    def names(key: str) -> list[str]:
        listed = entry.get(key, [])
        if not isinstance(listed, list) or not all(isinstance(n, str) and 0 < len(n) <= 256 for n in listed):
            raise ProtocolError(f"{where}.{key}", "a list of names (non-empty strings of at most 256 characters)")
        return listed

    def filters(key: str) -> Filters:
        listed = entry.get(key, [])
        if not isinstance(listed, list):
            raise ProtocolError(f"{where}.{key}", "a list of filters, each a list of constraints ([] = everything)")
        return tuple(constraints(f, f"{where}.{key}[{i}]") for i, f in enumerate(listed))

    children = names("scopes")
    if name in children:
        raise ProtocolError(f"{where}.scopes", "a scope cannot contain itself")
    return Scope(
        name=name,
        users=frozenset(names("users")),
        groups=frozenset(names("groups")),
        children=tuple(dict.fromkeys(children)),
        export=filters("export"),
        imports=filters("import"),
        subscribe=filters("subscribe") if "subscribe" in entry else None,
        managers=frozenset(names("managers")),
        keys=_keys(name, entry.get("keys", {}), f"{where}.keys"),
    )


def _keys(scope: str, doc: object, where: str) -> dict[int, KeyVersion]:
    if not isinstance(doc, dict):
        raise ProtocolError(where, 'an object: key version ("1", "2", ...) -> {roster, keyId, signature, envelopes}')
    keys = {}
    for version, stored in doc.items():
        if not (isinstance(version, str) and version.isascii() and version.isdigit() and 0 < int(version) < 2**31):
            raise ProtocolError(f"{where}.{version}", "a key version is a whole number from 1")
        keys[int(version)] = key_version(scope, int(version), stored, f"{where}.{version}")
    return keys


def key_version(scope: str, version: int, doc: object, where: str) -> KeyVersion:
    """A stored version: its roster must be of this scope and version, and every envelope the one
    its roster names for that member."""
    signed = parse_signed(doc, where)
    roster = signed.roster
    if (roster.scope, roster.version) != (scope, version):
        raise ProtocolError(f"{where}.roster", f"the roster of version {roster.version} of {roster.scope!r}")
    raw = doc.get("envelopes", {}) if isinstance(doc, dict) else None
    if not isinstance(raw, dict):
        raise ProtocolError(f"{where}.envelopes", "an object: member -> base64 envelope")
    envelopes = {}
    for member, text in raw.items():
        if member not in roster.members:
            raise ProtocolError(f"{where}.envelopes.{member}", "not on the roster")
        envelope = envelope_bytes(text, f"{where}.envelopes.{member}", ENVELOPE_BYTES[roster.kem(member)])
        if roster.envelopes.get(member) != envelope_digest(envelope):
            raise ProtocolError(f"{where}.envelopes.{member}", "not the envelope the roster names for this member")
        envelopes[member] = envelope
    return KeyVersion(signed, envelopes)


def envelope_bytes(raw: object, where: str, size: int) -> bytes:
    try:
        envelope = base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
    except (binascii.Error, ValueError):
        envelope = b""
    if len(envelope) != size:
        raise ProtocolError(where, f"a base64 key envelope ({size} bytes)")
    return envelope


def _check_acyclic(by_name: Mapping[str, Scope]) -> None:
    """Kahn's order: the scopes never freed of a parent lie on a cycle (no recursion, so a long chain
    of scopes is no deeper a stack than a short one)."""
    parents = {name: 0 for name in by_name}
    for scope in by_name.values():
        for child in scope.children:
            parents[child] += 1
    free = [name for name, count in parents.items() if not count]
    while free:
        for child in by_name[free.pop()].children:
            parents[child] -= 1
            if not parents[child]:
                free.append(child)
    stuck = sorted(name for name, count in parents.items() if count)
    if stuck:
        named = ", ".join(stuck[:5])
        raise ProtocolError(f"scopes.{stuck[0]}.scopes", f"the scopes form a cycle (on it or below it: {named})")
