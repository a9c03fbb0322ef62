"""The registry of SPEC §6: users, groups, authorization rules, publishers' subscription policies,
cropping rules and publishers' signing keys, as one validated, immutable document.

The registry travels through the event log like a subscription change, so the pipeline applies the
version that was current when a publication was logged; the gateway keeps the newest one for
authentication and signature checks. Every mistake in a document is a ProtocolError naming the
offending field, whether the document came from a file at start or from the admin API.

    admins: [root]                          # who may change the registry at runtime
    hashes: {s3cret-of-dev: dev}            # static hashes: a secret (or sha256:<its SHA-256 in hex>) and
                                            # the user it proves; kept as the digest only
    users: {alice: {groups: [A]}}           # user ids: certificate fingerprints, token subjects
    groups: {A: [bob]}                      # members may also be listed per group
    rules:                                  # user or "*" (anyone) -> rules; a rule is a conjunction,
      alice: [[{key: country, val: FR, op: eq}]]   # several rules a disjunction; [] allows everything
    policies:                               # publisher -> publications matching `data` reach only
      truckco: [{data: [{key: id, val: truck-bcd, op: eq}], group: A}]   # the group ("*" = anyone)
    cropping:                               # publisher -> fields removed from the copy for users/groups
      salesco: [{data: [{key: _type, val: sale_statistics, op: eq}], fields: [amount], groups: [A]}]
    publishers:                             # what publishers set themselves (/publisher/rules): policies
      truckco: {policies: [...], cropping: [...]}   # that hold beside the admins', which they cannot lift
    keys: {truckco: {k1: <base64 Ed25519 public key>}}
    recipients: {alice: <base64 public key>}   # what scope keys are wrapped for: X25519 or hybrid (sealing)
    scopes: {customs: {users: [alice], ...}}          # see security.scopes
    announce:                               # user or "*" -> what its edge brokers may announce; an
      sensors: [[{key: type, val: air, op: eq}]]   # announcement must be covered by one ([] = anything)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from veil.matching import Predicate
from veil.protocol import ProtocolError
from veil.protocol.subscriptions import parse_predicate
from veil.security.scopes import Scopes, parse_scopes
from veil.security.sealing import PUBLIC_BYTES, kem_of

ANYONE = "*"
ANONYMOUS = ""  # the identity of a client without credentials, where the operator allows them
SECTIONS = (
    "admins", "hashes", "users", "groups", "rules", "policies", "cropping", "keys", "recipients", "scopes",
    "announce", "publishers",
)  # fmt: skip
PUBLISHER_SECTIONS = ("policies", "cropping")  # what a publisher sets of its own
MAX_ID = 256
MIN_SECRET = 8  # characters of a static hash: a secret a client proves itself with, not a name
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
T = TypeVar("T")


@dataclass(frozen=True)
class Policy:
    data: tuple[Predicate, ...]
    group: str


@dataclass(frozen=True)
class Crop:
    data: tuple[Predicate, ...]
    fields: tuple[str, ...]
    users: frozenset[str]
    groups: frozenset[str]


@dataclass(frozen=True)
class Registry:
    admins: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()
    members: dict[str, frozenset[str]] = field(default_factory=dict)  # group -> user ids
    rules: dict[str, tuple[tuple[Predicate, ...], ...]] = field(default_factory=dict)
    policies: dict[str, tuple[Policy, ...]] = field(default_factory=dict)  # the admins'
    publisher_policies: dict[str, tuple[Policy, ...]] = field(default_factory=dict)  # the publishers' own
    cropping: dict[str, tuple[Crop, ...]] = field(default_factory=dict)  # the admins' and the publishers'
    keys: dict[str, dict[str, bytes]] = field(default_factory=dict)  # publisher -> key id -> raw key
    hashes: dict[str, str] = field(default_factory=dict)  # a static hash's digest -> the user it proves
    recipients: dict[str, bytes] = field(default_factory=dict)  # user -> raw recipient public key (X25519 or hybrid)
    scopes: Scopes = field(default_factory=Scopes)
    announce: dict[str, tuple[tuple[Predicate, ...], ...]] = field(default_factory=dict)  # user -> filters
    document: dict[str, Any] = field(default_factory=dict)  # as given, for persistence and the admin API
    # scope -> why a sealed publication under its newest key is refused (None: it is not), filled as
    # publications ask: the answer depends on this version of the registry only
    key_checks: dict[str, str | None] = field(default_factory=dict, compare=False, repr=False)

    def groups_of(self, user: str) -> frozenset[str]:
        return frozenset(group for group, members in self.members.items() if user in members)

    def rules_of(self, user: str) -> tuple[tuple[Predicate, ...], ...]:
        return self.rules.get(user, ()) + (self.rules.get(ANYONE, ()) if user != ANYONE else ())

    def announce_filters_of(self, user: str) -> tuple[tuple[Predicate, ...], ...]:
        """What the user's edge brokers may announce (its own filters and anyone's)."""
        return self.announce.get(user, ()) + (self.announce.get(ANYONE, ()) if user != ANYONE else ())

    def user_of_hash(self, secret: str) -> str | None:
        """The user a static hash proves (SPEC §3): only secrets the registry declares. A user id is a
        name, and names (fingerprints, token subjects) are no proof of anything."""
        return self.hashes.get(secret_digest(secret))

    def to_json(self) -> bytes:
        return json.dumps(self.document, sort_keys=True, separators=(",", ":")).encode()


def parse_registry(doc: object) -> Registry:
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ProtocolError("registry", f"an object with sections {list(SECTIONS)}")
    unknown = sorted(set(doc) - set(SECTIONS))
    if unknown:
        raise ProtocolError(unknown[0], f"unknown registry section; use {list(SECTIONS)}")
    admins = frozenset(_ids(doc.get("admins", []), "admins"))
    users_doc = _mapping(doc.get("users", {}), "users")
    members: dict[str, set[str]] = {}
    for user, entry in users_doc.items():
        _id(user, f"users.{user}")
        entry = _mapping(entry if entry is not None else {}, f"users.{user}")
        extra = sorted(set(entry) - {"groups"})
        if extra:
            raise ProtocolError(f"users.{user}.{extra[0]}", "unknown field; a user has only groups")
        for group in _ids(entry.get("groups", []), f"users.{user}.groups"):
            members.setdefault(group, set()).add(user)
    for group, listed in _mapping(doc.get("groups", {}), "groups").items():
        _id(group, f"groups.{group}")
        if group == ANYONE:
            raise ProtocolError(f"groups.{group}", '"*" means anyone and cannot be a group')
        members.setdefault(group, set()).update(_ids(listed, f"groups.{group}"))
    rules = {
        user: tuple(parse_filter(rule, f"rules.{user}[{i}]") for i, rule in enumerate(_list(listed, f"rules.{user}")))
        for user, listed in _mapping(doc.get("rules", {}), "rules").items()
    }
    announce = {
        user: tuple(parse_filter(f, f"announce.{user}[{i}]") for i, f in enumerate(_list(listed, f"announce.{user}")))
        for user, listed in _mapping(doc.get("announce", {}), "announce").items()
    }
    policies = _per_publisher(doc.get("policies", {}), "policies", _policy)
    cropping = _per_publisher(doc.get("cropping", {}), "cropping", _crop)
    own = _mapping(doc.get("publishers", {}), "publishers")
    for publisher, entry in own.items():
        _only(_mapping(entry, f"publishers.{publisher}"), set(PUBLISHER_SECTIONS), f"publishers.{publisher}")
    publisher_policies = {
        publisher: _rules(entry.get("policies", []), f"publishers.{publisher}.policies", _policy)
        for publisher, entry in own.items()
    }
    for publisher, entry in own.items():
        cropping[publisher] = cropping.get(publisher, ()) + _rules(
            entry.get("cropping", []), f"publishers.{publisher}.cropping", _crop
        )
    keys = {
        publisher: {
            _id(key_id, f"keys.{publisher}.{key_id}"): _public_key(raw, f"keys.{publisher}.{key_id}", "Ed25519")
            for key_id, raw in _mapping(listed, f"keys.{publisher}").items()
        }
        for publisher, listed in _mapping(doc.get("keys", {}), "keys").items()
    }
    hashes = {  # a field names a secret by its first characters only
        _digest_of(secret, f"hashes.{str(secret)[:4]}..."): _id(user, f"hashes.{str(secret)[:4]}...")
        for secret, user in _mapping(doc.get("hashes", {}), "hashes").items()
    }
    if "hashes" in doc:  # what is stored, logged and served holds no secret, only its digest
        doc = {**doc, "hashes": {digest: user for digest, user in hashes.items()}}
    recipients = {
        _id(user, f"recipients.{user}"): _recipient(raw, f"recipients.{user}")
        for user, raw in _mapping(doc.get("recipients", {}), "recipients").items()
    }
    scopes = parse_scopes(doc.get("scopes", {}), parse_filter)
    users = set(users_doc) | {u for group in members.values() for u in group} | admins | set(hashes.values())
    users |= {u for scope in scopes.by_name.values() for u in scope.users}
    return Registry(
        admins=admins,
        users=frozenset(users - {ANYONE}),
        members={group: frozenset(m) for group, m in members.items()},
        rules=rules,
        policies=policies,
        publisher_policies=publisher_policies,
        cropping=cropping,
        keys=keys,
        hashes=hashes,
        recipients=recipients,
        scopes=scopes,
        announce=announce,
        document=doc,
    )


def registry_from_json(body: bytes | None) -> Registry:
    """A stored registry version (what `Registry.to_json` wrote); the empty registry for none."""
    return parse_registry(json.loads(body) if body else None)


def load_registry_file(path: str) -> Registry:
    """A registry from a YAML or JSON file; ValueError naming the file and the field otherwise."""
    try:
        with open(path, "rb") as handle:
            text = handle.read()
        if os.path.splitext(path)[1].lower() == ".json":
            doc = json.loads(text)
        else:
            import yaml

            doc = yaml.safe_load(text)
        return parse_registry(doc)
    except ProtocolError as exc:
        raise ValueError(f"--registry {path}: {exc.field}: {exc.problem}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"--registry {path}: {exc}") from None
    except Exception as exc:  # a YAML syntax error
        raise ValueError(f"--registry {path}: {exc}") from None


def _per_publisher(doc: object, section: str, parse: Callable[[object, str], T]) -> dict[str, tuple[T, ...]]:
    listed = _mapping(doc, section)
    return {publisher: _rules(rules, f"{section}.{publisher}", parse) for publisher, rules in listed.items()}


def _rules(doc: object, where: str, parse: Callable[[object, str], T]) -> tuple[T, ...]:
    return tuple(parse(entry, f"{where}[{i}]") for i, entry in enumerate(_list(doc, where)))


def _policy(doc: object, where: str) -> Policy:
    entry = _mapping(doc, where)
    _only(entry, {"data", "group"}, where)
    group = entry.get("group")
    if not isinstance(group, str) or not group:
        raise ProtocolError(f"{where}.group", 'missing: a group name, or "*" for anyone')
    return Policy(parse_filter(entry.get("data"), f"{where}.data"), group)


def _crop(doc: object, where: str) -> Crop:
    entry = _mapping(doc, where)
    _only(entry, {"data", "fields", "users", "groups"}, where)
    fields = _ids(entry.get("fields"), f"{where}.fields")
    if not fields:
        raise ProtocolError(f"{where}.fields", "name at least one field to remove")
    users = frozenset(_ids(entry.get("users", []), f"{where}.users"))
    groups = frozenset(_ids(entry.get("groups", []), f"{where}.groups"))
    if not users and not groups:
        raise ProtocolError(where, "name the users or groups whose copy is cropped")
    return Crop(parse_filter(entry.get("data", []), f"{where}.data"), tuple(fields), users, groups)


def parse_filter(doc: object, where: str) -> tuple[Predicate, ...]:
    """One filter: a conjunction of constraints in the subscription language."""
    if not isinstance(doc, list):
        raise ProtocolError(where, "a list of constraints {key, val, type, op} ([] = everything)")
    return tuple(Predicate(*parse_predicate(item, f"{where}[{i}]")) for i, item in enumerate(doc))


def secret_digest(secret: str) -> str:
    """How the registry keeps a static hash: SHA-256, unsalted, since the secrets are meant to be
    random (a salt would make each lookup a scan of all of them)."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()


def _digest_of(value: object, where: str) -> str:
    if isinstance(value, str) and DIGEST.fullmatch(value):
        return value
    if not isinstance(value, str) or not MIN_SECRET <= len(value) <= MAX_ID or not value.isprintable():
        problem = f"a static hash is a secret of {MIN_SECRET} to {MAX_ID} printable characters"
        raise ProtocolError(where, problem + ", or sha256:<64 hex digits>")
    return secret_digest(value)


def _public_key(raw: object, where: str, kind: str) -> bytes:
    try:
        key = base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise ProtocolError(where, f"a base64 {kind} public key (32 bytes)")
    return key


def _recipient(raw: object, where: str) -> bytes:
    try:
        key = base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
    except (binascii.Error, ValueError):
        key = b""
    if kem_of(key) is None:
        sizes = " or ".join(f"{kem} ({size} bytes)" for kem, size in PUBLIC_BYTES.items())
        raise ProtocolError(where, f"a base64 recipient public key: {sizes}")
    return key


def _only(entry: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(entry) - allowed)
    if extra:
        raise ProtocolError(f"{where}.{extra[0]}", f"unknown field; use {sorted(allowed)}")


def _mapping(doc: object, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ProtocolError(where, "an object")
    return doc


def _list(doc: object, where: str) -> list[Any]:
    if not isinstance(doc, list):
        raise ProtocolError(where, "a list")
    return doc


def _ids(doc: object, where: str) -> list[str]:
    return [_id(item, f"{where}[{i}]") for i, item in enumerate(_list(doc, where))]


def _id(value: object, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID:
        raise ProtocolError(where, f"a non-empty string of at most {MAX_ID} characters")
    return value
