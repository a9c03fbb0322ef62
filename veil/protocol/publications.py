"""The three publication forms of the SELIS protocol (defined, raw, row) and the NDJSON batch.

Each form is validated here and turned into the bytes that are logged and delivered: a raw object is
kept as published; defined and row forms become the equivalent JSON object with typed values.
"""

from __future__ import annotations

from typing import NamedTuple

import orjson

from veil.protocol.errors import ProtocolError, load_json
from veil.protocol.values import canonical_type, convert, type_of

MAX_VALIDITY_MS = 30 * 24 * 3600 * 1000


class UnpublishRequest(NamedTuple):
    auth_hash: str | None
    publication: int


def parse_valid_for(header: str | None) -> int | None:
    """The `X-Valid-For` header: milliseconds the publications of a request stay valid (SPEC §2.5)."""
    if header is None:
        return None
    try:
        valid_for = int(header)
    except ValueError:
        raise ProtocolError("X-Valid-For", "milliseconds, a whole number") from None
    if not 0 < valid_for <= MAX_VALIDITY_MS:
        raise ProtocolError("X-Valid-For", f"from 1 to {MAX_VALIDITY_MS} milliseconds (30 days)")
    return valid_for


def parse_unpublish(raw: bytes) -> UnpublishRequest:
    """`{"authHash": H, "id": "123"}`: the id that /publish returned."""
    doc = load_json(raw)
    if not isinstance(doc, dict):
        raise ProtocolError("body", "expected a JSON object")
    auth = doc.get("authHash")
    if auth is not None and (not isinstance(auth, str) or not auth):
        raise ProtocolError("authHash", "not a non-empty string")
    pub = doc.get("id")
    if isinstance(pub, str) and pub.isdigit():
        pub = int(pub)
    if isinstance(pub, bool) or not isinstance(pub, int) or pub < 1:
        raise ProtocolError("id", "the publication id that /publish returned")
    return UnpublishRequest(auth, pub)


def parse_publication(raw: bytes) -> bytes:
    return _normalise(load_json(raw), raw, "")


def parse_publication_batch(raw: bytes) -> list[bytes]:
    """NDJSON: one publication per non-empty line; all are refused if any line is invalid."""
    bodies = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if line.strip():
            prefix = f"line {number}: "
            bodies.append(_normalise(load_json(line, f"{prefix}body"), line, prefix))
    if not bodies:
        raise ProtocolError("body", "empty batch: send one publication per line")
    return bodies


def _normalise(doc: object, raw: bytes, prefix: str) -> bytes:
    if isinstance(doc, dict):
        entries = doc.get("publication")
        if len(doc) == 1 and isinstance(entries, list):
            return orjson.dumps(_from_entries(entries, f"{prefix}publication", typed=True))
        if b"\n" in raw or b"\r" in raw:
            return orjson.dumps(doc)
        return raw.strip()
    if isinstance(doc, list):
        return orjson.dumps(_from_entries(doc, f"{prefix}body", typed=False))
    raise ProtocolError(
        f"{prefix}body",
        'a publication is a JSON object, an array of {key, val} pairs, or {"publication": [...]}',
    )


def _from_entries(entries: list, field: str, typed: bool) -> dict:
    """Defined form (`typed`: `type` is honoured and inferred when missing) or row form."""
    if not entries:
        raise ProtocolError(field, "no attributes: give at least one {key, val}")
    out: dict = {}
    for i, entry in enumerate(entries):
        where = f"{field}[{i}]"
        if not isinstance(entry, dict):
            raise ProtocolError(where, 'each attribute is an object {"key", "val", "type"}')
        key = entry.get("key")
        if not isinstance(key, str) or not key:
            raise ProtocolError(f"{where}.key", "missing or not a non-empty string")
        if key in out:
            raise ProtocolError(f"{where}.key", f"duplicate key {key!r}")
        value = entry.get("val", entry.get("value"))
        if value is None:
            raise ProtocolError(f"{where}.val", "missing or null")
        declared = entry.get("type")
        if declared is not None:
            out[key] = convert(value, canonical_type(declared, f"{where}.type"), f"{where}.val")
        elif typed and type_of(value) is None:
            raise ProtocolError(f"{where}.val", "a defined attribute is a scalar: int, float, boolean or string")
        else:
            out[key] = value
    return out
