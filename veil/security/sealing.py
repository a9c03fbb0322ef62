"""Payloads sealed end to end for a scope's members, so that the brokers carrying them cannot read
them.

A scope has a current key (`ScopeKey`: a 32-byte secret and a version). A payload is sealed under
a key derived from it for that one message (HKDF with a random salt), with ChaCha20-Poly1305; the
scope, the key version and the caller's associated data (the publication's routing attributes) are
authenticated, so a sealed payload cannot be moved to another scope or publication. Members get the
scope key as an envelope for their recipient key: RFC 9180 HPKE in base mode (HKDF-SHA256,
ChaCha20-Poly1305) with DHKEM(X25519) or the hybrid ML-KEM-768 + X25519 KEM, whose envelopes a
recorded registry keeps from a future quantum computer too; any RFC 9180 library opens them, given
`envelope_info`. The envelope proves nothing about who made it: the scope's manager signs which
envelopes are the version's (`security.rosters`). When a member leaves, the key is rotated
(`ScopeKey.rotate`) and wrapped for those who remain: payloads sealed afterwards are beyond the one
who left.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey, MLKEM768PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.hpke import (
    AEAD,
    KDF,
    KEM,
    MLKEM768X25519PrivateKey,
    MLKEM768X25519PublicKey,
    Suite,
)
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from veil.protocol.canonical import canonical

SEALED = b"veil-sealed-1"  # the label of what a payload's derived key is for
ENVELOPE_INFO = b"veil-scope-key-1\n"  # HPKE's info: this label, then the canonical {scope, version}
SALT_BYTES = 16
NONCE = bytes(12)  # every derived key encrypts exactly one message
RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw
X25519 = "X25519"
HYBRID = "MLKEM768-X25519"
SUITES = {
    X25519: Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.CHACHA20_POLY1305),
    HYBRID: Suite(KEM.MLKEM768_X25519, KDF.HKDF_SHA256, AEAD.CHACHA20_POLY1305),
}
MLKEM768_PUBLIC = 1184
PUBLIC_BYTES = {X25519: 32, HYBRID: MLKEM768_PUBLIC + 32}  # the hybrid's: ML-KEM-768's, then X25519's
ENVELOPE_BYTES = {X25519: 32 + 32 + 16, HYBRID: 1088 + 32 + 32 + 16}  # encapsulated key, secret, tag


class SealError(ValueError):
    """A sealed payload or key envelope that does not open: wrong key, tampered with, or malformed."""


class HybridKey(NamedTuple):
    """A recipient key of ML-KEM-768 and X25519 together: an envelope opens only with both."""

    mlkem: MLKEM768PrivateKey
    x25519: X25519PrivateKey

    @classmethod
    def generate(cls) -> HybridKey:
        return cls(MLKEM768PrivateKey.generate(), X25519PrivateKey.generate())


RecipientKey = X25519PrivateKey | HybridKey


def recipient_public(key: RecipientKey) -> bytes:
    """The public key as the registry's `recipients` and a roster list it."""
    if isinstance(key, HybridKey):
        return key.mlkem.public_key().public_bytes_raw() + key.x25519.public_key().public_bytes(*RAW)
    return key.public_key().public_bytes(*RAW)


def kem_of(public: bytes) -> str | None:
    """Which KEM a recipient public key is for, by its length; None for neither."""
    return next((kem for kem, size in PUBLIC_BYTES.items() if len(public) == size), None)


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
    return int(struct.unpack(">I", sealed[:4])[0])


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


def envelope_info(scope: str, version: int) -> bytes:
    """What an envelope is bound to (HPKE's info), besides its recipient's key: the scope and version."""
    return ENVELOPE_INFO + canonical({"scope": scope, "version": version})


def wrap(key: ScopeKey, public: bytes) -> bytes:
    """The scope key as an envelope only the holder of `public`'s private key opens (HPKE's
    encapsulated key, then the ciphertext of the secret and its tag)."""
    kem = kem_of(public)
    recipient: X25519PublicKey | MLKEM768X25519PublicKey
    if kem == X25519:
        recipient = X25519PublicKey.from_public_bytes(public)
    elif kem == HYBRID:
        recipient = MLKEM768X25519PublicKey(
            MLKEM768PublicKey.from_public_bytes(public[:MLKEM768_PUBLIC]),
            X25519PublicKey.from_public_bytes(public[MLKEM768_PUBLIC:]),
        )
    else:
        raise SealError(f"a recipient key of {len(public)} bytes is neither an X25519 nor a hybrid key")
    return SUITES[kem].encrypt(key.secret, recipient, info=envelope_info(key.scope, key.version))


def unwrap(envelope: bytes, scope: str, version: int, private: RecipientKey) -> ScopeKey:
    kem = HYBRID if isinstance(private, HybridKey) else X25519
    if len(envelope) != ENVELOPE_BYTES[kem]:
        raise SealError(f"this key envelope of scope {scope!r} v{version} is not an {kem} envelope")
    key = MLKEM768X25519PrivateKey(private.mlkem, private.x25519) if isinstance(private, HybridKey) else private
    try:
        secret = SUITES[kem].decrypt(envelope, key, info=envelope_info(scope, version))
    except (InvalidTag, ValueError):  # ValueError: a low-order or malformed encapsulated key
        raise SealError(f"this key envelope of scope {scope!r} v{version} is not for this member") from None
    return ScopeKey(scope, version, secret)
