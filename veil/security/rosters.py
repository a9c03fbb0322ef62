"""Who holds a scope key version, as its manager signed it: the one thing about a scope's keys that
members believe, because the broker that stores and serves the envelopes may be hostile.

A roster names a version of a scope's key, each member's recipient public key (X25519 or hybrid:
the KEM of its envelope) and the SHA-256 of the envelope made for it. The manager signs it
with Ed25519 over a label and the roster's canonical JSON (RFC 8785); clients verify it against the
managers' keys they pin (never against keys the broker lists) before they seal under the version
or open its envelope, so a broker can neither hand out a key it chose, nor add a member, nor swap a
recipient key. Versions only go up: a client that has seen version N refuses a roster older than N.

    {"roster": {"scope": "customs", "version": 2, "members": {"alice": <base64 public key>},
                "envelopes": {"alice": <base64 SHA-256 of alice's envelope>}},
     "keyId": "carol-1", "signature": <base64 Ed25519 signature>}
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from veil.protocol import ProtocolError
from veil.protocol.canonical import canonical
from veil.security import signatures
from veil.security.sealing import SealError, kem_of

LABEL = b"veil-roster-1\n"  # signed before the canonical roster: a roster's signature signs nothing else
MAX_MEMBERS = 100_000


def envelope_digest(envelope: bytes) -> bytes:
    return hashlib.sha256(envelope).digest()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _bytes(raw: object, where: str, what: str) -> bytes:
    try:
        return base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
    except (binascii.Error, ValueError):
        raise ProtocolError(where, f"{what}, in base64") from None


@dataclass(frozen=True)
class Roster:
    scope: str
    version: int
    members: Mapping[str, bytes]  # member -> recipient public key
    envelopes: Mapping[str, bytes]  # member -> SHA-256 of its envelope

    def document(self) -> dict[str, Any]:
        return {
            "scope": self.scope, "version": self.version,
            "members": {m: _b64(k) for m, k in self.members.items()},
            "envelopes": {m: _b64(d) for m, d in self.envelopes.items()},
        }  # fmt: skip

    def signed_bytes(self) -> bytes:
        return LABEL + canonical(self.document())

    def kem(self, member: str) -> str:
        return kem_of(self.members[member]) or ""

    def holds(self, member: str, public: bytes, envelope: bytes) -> bool:
        """Whether this roster gives `member`, with this recipient key, exactly this envelope."""
        return self.members.get(member) == public and self.envelopes.get(member) == envelope_digest(envelope)


@dataclass(frozen=True)
class SignedRoster:
    roster: Roster
    key_id: str
    signature: str  # base64

    def document(self) -> dict[str, Any]:
        return {"roster": self.roster.document(), "keyId": self.key_id, "signature": self.signature}

    def verified_by(self, keys: Mapping[str, bytes]) -> bool:
        """Whether one of these keys (key id -> raw Ed25519 public key) signed it."""
        key = keys.get(self.key_id)
        return key is not None and signatures.verifies(key, self.roster.signed_bytes(), self.signature)


def sign_roster(roster: Roster, key_id: str, private: Ed25519PrivateKey) -> SignedRoster:
    return SignedRoster(roster, key_id, signatures.sign(private, roster.signed_bytes()))


def believed(doc: object, scope: str, pinned: Mapping[str, bytes], version: int | None = None) -> Roster:
    """A roster the broker served, once it is one of `pinned`'s keys signed, of `scope` (and of
    `version`, if given); SealError naming why otherwise. The one check members and managers make."""
    if not pinned:
        raise SealError(f"no manager key of scope {scope!r} is pinned: its rosters cannot be verified")
    try:
        signed = parse_signed(doc, "roster")
    except ProtocolError as exc:
        raise SealError(f"the broker's roster of scope {scope!r} is malformed: {exc}") from None
    roster = signed.roster
    if not signed.verified_by(pinned):
        raise SealError(f"the roster of scope {scope!r} v{roster.version} is not signed by a manager you pin")
    if roster.scope != scope or (version is not None and roster.version != version):
        raise SealError(f"asked for scope {scope!r} v{version}, the broker served {roster.scope!r} v{roster.version}")
    return roster


def parse_signed(doc: object, where: str) -> SignedRoster:
    """A signed roster as stored and served; ProtocolError naming the field otherwise (its signature
    is checked by whoever trusts the signer)."""
    if not isinstance(doc, dict):
        raise ProtocolError(where, "an object: {roster, keyId, signature}")
    key_id, signature = doc.get("keyId"), doc.get("signature")
    if not isinstance(key_id, str) or not 0 < len(key_id) <= 256:
        raise ProtocolError(f"{where}.keyId", "the id of the manager's signing key")
    if len(_bytes(signature, f"{where}.signature", "an Ed25519 signature")) != 64:
        raise ProtocolError(f"{where}.signature", "an Ed25519 signature (64 bytes), in base64")
    return SignedRoster(_roster(doc.get("roster"), f"{where}.roster"), key_id, str(signature))


def _roster(doc: object, where: str) -> Roster:
    if not isinstance(doc, dict):
        raise ProtocolError(where, "an object: {scope, version, members, envelopes}")
    extra = sorted(set(doc) - {"scope", "version", "members", "envelopes"})
    if extra:
        raise ProtocolError(f"{where}.{extra[0]}", "unknown field")
    scope, version = doc.get("scope"), doc.get("version")
    if not isinstance(scope, str) or not 0 < len(scope) <= 256:
        raise ProtocolError(f"{where}.scope", "the scope's name")
    if not isinstance(version, int) or isinstance(version, bool) or not 0 < version < 2**31:
        raise ProtocolError(f"{where}.version", "a key version is a whole number from 1")
    members, envelopes = doc.get("members"), doc.get("envelopes")
    if not isinstance(members, dict) or not members or len(members) > MAX_MEMBERS:
        raise ProtocolError(f"{where}.members", f"an object of 1 to {MAX_MEMBERS} members: name -> recipient key")
    if not isinstance(envelopes, dict) or set(envelopes) != set(members):
        raise ProtocolError(f"{where}.envelopes", "an object: member -> SHA-256 of its envelope, for every member")
    keys, digests = {}, {}
    for member, raw in members.items():
        if not 0 < len(member) <= 256:
            raise ProtocolError(f"{where}.members", "a member's name is a non-empty string of at most 256 characters")
        keys[member] = _bytes(raw, f"{where}.members.{member}", "a recipient public key")
        if kem_of(keys[member]) is None:
            raise ProtocolError(f"{where}.members.{member}", "an X25519 or hybrid recipient public key")
        digests[member] = _bytes(envelopes[member], f"{where}.envelopes.{member}", "a SHA-256 digest")
        if len(digests[member]) != 32:
            raise ProtocolError(f"{where}.envelopes.{member}", "a SHA-256 digest (32 bytes), in base64")
    return Roster(scope, version, keys, digests)
