"""Webhook signatures, as Stripe signs its events: `Veil-Signature: t=UNIX_SECONDS,v1=HEX`, where HEX
is HMAC-SHA256 under the subscription's secret of `t`, a dot and the body's bytes. The time is in
what is signed so that a receiver can refuse an old request replayed by whoever recorded it; the
secret is the subscription's own, shown once, to its owner, when the subscription is made."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

HEADER = "Veil-Signature"
PREFIX = "whsec_"
TOLERANCE = 300  # seconds a receiver accepts between the signature's time and its own clock, by default


class SignatureError(ValueError):
    """A webhook request that is not what the broker sent under this secret (or is too old)."""


def new_secret() -> str:
    return PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


def _mac(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), b"%d." % timestamp + body, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, now: float | None = None) -> str:
    """The header's value for this body, signed now."""
    timestamp = int(time.time() if now is None else now)
    return f"t={timestamp},v1={_mac(secret, timestamp, body)}"


def verify(secret: str, header: str | None, body: bytes, tolerance: float = TOLERANCE, now: float | None = None) -> int:
    """Check a received request's header against its raw body (the bytes as received, before any
    parsing); returns the signature's time. SignatureError says what is wrong."""
    if not header:
        raise SignatureError(f"no {HEADER} header")
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        parts.setdefault(name, []).append(value)
    stamps = parts.get("t", [])
    if len(stamps) != 1 or not (stamps[0].isascii() and stamps[0].isdigit() and len(stamps[0]) <= 12):
        raise SignatureError(f"{HEADER}: no time (t=UNIX_SECONDS)")
    timestamp = int(stamps[0])
    expected = _mac(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, given) for given in parts.get("v1", []) if given.isascii()):
        raise SignatureError(f"{HEADER}: no v1 signature matches this body under this secret")
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        raise SignatureError(f"{HEADER}: signed at {timestamp}, more than {tolerance:g} s from now")
    return timestamp
