"""Payloads sealed end to end for a scope's members, so that the brokers carrying them cannot read
them (HPKE's construction in base mode, from `cryptography`'s primitives).

A scope has a current key (`ScopeKey`: a 32-byte secret and a version). A payload is sealed under
a key derived from it for that one message (HKDF with a random salt), with ChaCha20-Poly1305; the
scope, the key version and the caller's associated data (the publication's routing attributes) are
authenticated, so a sealed payload cannot be moved to another scope or publication. Members get the
scope key as an envelope wrapped for their X25519 public key: an ephemeral key pair, X25519, HKDF,
ChaCha20-Poly1305. When a member leaves, the key is rotated (`ScopeKey.rotate`) and wrapped for
those who remain: payloads sealed afterwards are beyond the one who left.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SEALED = b"veil-sealed-1"  # labels: what each derived key is for
WRAPPED = b"veil-wrapped-1"
SALT_BYTES = 16
NONCE = bytes(12)  # every derived key encrypts exactly one message
RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


class SealError(ValueError):
    """A sealed payload or key envelope that does not open: wrong key, tampered with, or malformed."""


class ScopeKey(NamedTuple):
    scope: str
    version: int
    secret: bytes  # 32 bytes

    @classmethod
    def new(cls, scope: str, version: int = 1) -> ScopeKey:
        return cls(scope, version, os.urandom(32))

    def rotate(self) -> ScopeKey:
        """The next version, with a fresh secret: for after a member left."""
        return ScopeKey(self.scope, self.version + 1, os.urandom(32))


def _derive(secret: bytes, salt: bytes, label: bytes, context: bytes) -> ChaCha20Poly1305:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=label + b"\0" + context).derive(secret)
    return ChaCha20Poly1305(key)


def _context(scope: str, version: int) -> bytes:
    name = scope.encode()
    return struct.pack(">HI", len(name), version) + name


def seal(payload: bytes, key: ScopeKey, associated: bytes = b"") -> bytes:
    """version (4 bytes) | salt (16) | ciphertext and tag; `associated` must be given again to open."""
    salt = os.urandom(SALT_BYTES)
    context = _context(key.scope, key.version)
    sealed = _derive(key.secret, salt, SEALED, context).encrypt(NONCE, payload, context + associated)
    return struct.pack(">I", key.version) + salt + sealed


def sealed_version(sealed: bytes) -> int:
    """The scope key version a payload was sealed under: which key a member needs."""
    if len(sealed) < 4 + SALT_BYTES + 16:
        raise SealError("too short to be a sealed payload")
    return struct.unpack(">I", sealed[:4])[0]


def open_sealed(sealed: bytes, key: ScopeKey, associated: bytes = b"") -> bytes:
    version = sealed_version(sealed)
    if version != key.version:
        raise SealError(f"sealed under version {version} of scope {key.scope!r}, not {key.version}")
    salt, body = sealed[4 : 4 + SALT_BYTES], sealed[4 + SALT_BYTES :]
    context = _context(key.scope, key.version)
    try:
        return _derive(key.secret, salt, SEALED, context).decrypt(NONCE, body, context + associated)
    except InvalidTag:
        raise SealError(f"does not open with version {version} of scope {key.scope!r}") from None


def wrap(key: ScopeKey, member: X25519PublicKey) -> bytes:
    """The scope key as an envelope only `member`'s private key opens: ephemeral public key (32
    bytes) | ciphertext of the secret and tag."""
    ephemeral = X25519PrivateKey.generate()
    ephemeral_public = ephemeral.public_key().public_bytes(*RAW)
    recipient = member.public_bytes(*RAW)
    context = _context(key.scope, key.version) + ephemeral_public + recipient
    aead = _derive(ephemeral.exchange(member), b"", WRAPPED, context)
    return ephemeral_public + aead.encrypt(NONCE, key.secret, context)


def unwrap(envelope: bytes, scope: str, version: int, member: X25519PrivateKey) -> ScopeKey:
    if len(envelope) != 32 + 32 + 16:
        raise SealError("not a key envelope")
    ephemeral_public = envelope[:32]
    recipient = member.public_key().public_bytes(*RAW)
    context = _context(scope, version) + ephemeral_public + recipient
    try:
        shared = member.exchange(X25519PublicKey.from_public_bytes(ephemeral_public))
    except ValueError:  # a low-order point: no secret to share
        raise SealError(f"this key envelope of scope {scope!r} v{version} has no valid ephemeral key") from None
    try:
        secret = _derive(shared, b"", WRAPPED, context).decrypt(NONCE, envelope[32:], context)
    except InvalidTag:
        raise SealError(f"this key envelope of scope {scope!r} v{version} is not for this member") from None
    return ScopeKey(scope, version, secret)
