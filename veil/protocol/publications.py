"""The three publication forms of the SELIS protocol (defined, raw, row) and the NDJSON batch.

Each form is validated here and turned into the bytes that are logged and delivered: a raw object is
kept as published; defined and row forms become the equivalent JSON object with typed values.
"""

from __future__ import annotations

import orjson

from veil.protocol.errors import ProtocolError, load_json
from veil.protocol.values import canonical_type, convert, type_of


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
