"""Non-repudiation (SPEC §7): Ed25519 signatures over the exact bytes of a publication.

The publisher signs what it sends; the broker checks the signature against the key the registry
lists for that publisher and key id before accepting it, logs it beside the publication and delivers
it unchanged in the envelope, so a subscriber can verify the origin end to end without trusting the
broker (the client library does, against keys it was given).
"""

from __future__ import annotations

import base64
import binascii

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from veil.protocol import ProtocolError


def new_key() -> tuple[Ed25519PrivateKey, str]:
    """A signing key and its public half as the registry lists it (base64 of the raw 32 bytes)."""
    private = Ed25519PrivateKey.generate()
    return private, public_text(private)


def public_text(private: Ed25519PrivateKey) -> str:
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def sign(private: Ed25519PrivateKey, body: bytes) -> str:
    return base64.b64encode(private.sign(body)).decode()


def verifies(public_key: bytes, body: bytes, signature: str) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(base64.b64decode(signature, validate=True), body)
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


def check(keys: dict[str, bytes], key_id: str | None, signature: str, body: bytes) -> None:
    """Refuse a publication whose signature does not verify under the publisher's registered key."""
    if not key_id:
        raise ProtocolError("X-Key-Id", "a signed publication names the key it was signed with")
    key = keys.get(key_id)
    if key is None:
        raise ProtocolError("X-Key-Id", f"no key {key_id!r} is registered for this publisher", 403)
    if not verifies(key, body, signature):
        raise ProtocolError("X-Signature", "does not verify over the publication's bytes: refused", 400)
