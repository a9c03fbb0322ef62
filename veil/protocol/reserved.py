"""The publication members Veil reserves: `veil:scope`, the scope a publication is published into,
`veil:sealed`, a payload sealed for that scope's members (base64; see security.sealing),
`veil:origin`, who sealed it, when, under which random id (`{"publisher", "id", "time"}`, time in
milliseconds since the epoch: the seal binds it, so subscribers tell a replay from a new
publication), `veil:forward`, what one broker carries of a secret-forwarded publication, and
`veil:key`, the publisher's idempotency key for the publication (a batch's lines name theirs so;
the `Idempotency-Key` header names a request's).

They travel inside the publication, so a publisher's signature covers them and the broker cannot
move a publication to another scope unnoticed; the gateway reads them from the parse that validates
the publication, to check that the publisher may publish there, and the pipeline reads the scope to
bound who sees it.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Mapping
from typing import NamedTuple

from veil.protocol.errors import ProtocolError

PREFIX = "veil:"  # every reserved member's, present and future
SCOPE = "veil:scope"
SEALED = "veil:sealed"
ORIGIN = "veil:origin"
FORWARD = "veil:forward"  # a secret-forwarded copy's share and sealed payload (client.forwarding): opaque here
KEY = "veil:key"
MAX_KEY = 256  # characters of an idempotency key
SEALED_HEADER = 4 + 16 + 16  # key version, salt, tag: the least a sealed payload is
MAX_SCOPE_NAME = 256
MAX_ORIGIN_ID = 64


class Reserved(NamedTuple):
    scope: str  # "" for the world
    sealed_version: int | None  # the scope key version a sealed payload needs
    origin: str | None = None  # the publisher its origin names


def reserved_of(publication: Mapping[str, object], prefix: str = "") -> Reserved | None:
    """The reserved members of a publication as parsed (an escaped spelling of a key is the key),
    None without any; errors name the member after `prefix` (a batch's line)."""
    scope, sealed = publication.get(SCOPE), publication.get(SEALED)
    origin = _origin(publication[ORIGIN], f"{prefix}{ORIGIN}") if ORIGIN in publication else None
    if scope is None and sealed is None:
        return None if origin is None else Reserved("", None, origin)
    if not isinstance(scope, str) or not 0 < len(scope) <= MAX_SCOPE_NAME:
        problem = "a sealed payload is sealed for a scope: name it" if scope is None else "a scope's name"
        raise ProtocolError(f"{prefix}{SCOPE}", problem)
    version = None
    if sealed is not None:
        try:
            raw = base64.b64decode(sealed, validate=True) if isinstance(sealed, str) else b""
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) < SEALED_HEADER:
            problem = "base64 of a sealed payload (key version, salt, ciphertext and tag)"
            raise ProtocolError(f"{prefix}{SEALED}", problem)
        version = struct.unpack(">I", raw[:4])[0]
    return Reserved(scope, version, origin)


def _origin(origin: object, field: str) -> str:
    if not isinstance(origin, dict) or set(origin) != {"publisher", "id", "time"}:
        raise ProtocolError(field, 'an object: {"publisher", "id", "time"}')
    publisher, origin_id, time = origin["publisher"], origin["id"], origin["time"]
    if not isinstance(publisher, str) or not isinstance(origin_id, str) or not 0 < len(origin_id) <= MAX_ORIGIN_ID:
        raise ProtocolError(field, f"the publisher's name and an id of 1 to {MAX_ORIGIN_ID} characters")
    if not isinstance(time, int) or isinstance(time, bool) or not 0 <= time < 2**53:
        raise ProtocolError(f"{field}.time", "milliseconds since the epoch")
    return publisher


def scope_of(attributes: Mapping[str, object]) -> object:
    """The scope a (flattened) publication is published into; None for the world. A value that is
    not a name, which the gateway never lets in, is returned as it is so that it matches no scope."""
    return attributes.get(SCOPE)


def idempotency_key(value: object, field: str) -> str:
    """An idempotency key as given in `field`: 1 to MAX_KEY printable characters."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_KEY or not value.isprintable():
        raise ProtocolError(field, f"an idempotency key: 1 to {MAX_KEY} printable characters")
    return value


def key_of(publication: Mapping[str, object], prefix: str = "") -> str | None:
    """A publication's `veil:key` member, None without one."""
    return idempotency_key(publication[KEY], f"{prefix}{KEY}") if KEY in publication else None
