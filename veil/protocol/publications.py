"""The three publication forms of the SELIS protocol (defined, raw, row) and the NDJSON batch.

Each form is validated here and turned into the bytes that are logged and delivered: a raw object is
kept as published; defined and row forms become the equivalent JSON object with typed values.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from veil.protocol.errors import ProtocolError
from veil.protocol.limits import DEFAULT, INT64_MAX, Limits, dumps_kept, load_json
from veil.protocol.reserved import Reserved, idempotency_key, key_of, reserved_of
from veil.protocol.subscriptions import auth_hash_of, load_object
from veil.protocol.values import canonical_type, convert, type_of


class UnpublishRequest(NamedTuple):
    auth_hash: str | None
    publication: int


def parse_valid_for(header: str | None, limits: Limits = DEFAULT) -> int | None:
    """The `X-Valid-For` header: milliseconds the publications of a request stay valid (SPEC §2.5).
    ASCII digits only: Python's `int` would also take full-width and Arabic-Indic digits and `1_000`,
    which no other reader of the header would."""
    if header is None:
        return None
    text = header.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 15:
        raise ProtocolError("X-Valid-For", "milliseconds, a whole number in ASCII digits")
    valid_for = int(text)
    if not 0 < valid_for <= limits.validity_ms:
        raise ProtocolError("X-Valid-For", f"from 1 to {limits.validity_ms} milliseconds")
    return valid_for


def keyed(routed: list[Routed], header: str | None, batch: bool) -> list[str | None]:
    """Each publication's idempotency key: its `veil:key` member, or the header's key (a batch's
    line N as `KEY#N`), never both."""
    if header is None:
        return [r.key for r in routed]
    header = idempotency_key(header, "Idempotency-Key")
    if any(r.key is not None for r in routed):
        raise ProtocolError("Idempotency-Key", "the publications name their own veil:key: send no header with them")
    return [f"{header}#{r.line}" for r in routed] if batch else [header]


def parse_unpublish(raw: bytes) -> UnpublishRequest:
    """`{"authHash": H, "id": "123"}`: the id that /publish returned."""
    doc = load_object(raw)
    pub = doc.get("id")
    if isinstance(pub, str) and pub.isascii() and pub.isdigit() and len(pub) < 19:
        pub = int(pub)
    if isinstance(pub, bool) or not isinstance(pub, int) or not 1 <= pub <= INT64_MAX:
        raise ProtocolError("id", "the publication id that /publish returned")
    return UnpublishRequest(auth_hash_of(doc), pub)


class Routed(NamedTuple):
    """A publication's bytes, and the reserved members it carries (read from this one parse)."""

    body: bytes
    reserved: Reserved | None
    line: int = 1  # in a batch, the line it came from (blank lines count)
    key: str | None = None  # its `veil:key` member: the publisher's idempotency key


def parse_publication(raw: bytes, limits: Limits = DEFAULT) -> Routed:
    return _normalise(load_json(raw, "body", limits, publication=True), raw, "")


def parse_publication_batch(raw: bytes, limits: Limits = DEFAULT, max_lines: int | None = None) -> list[Routed]:
    """NDJSON: one publication per non-empty line; all are refused if any line is invalid, and a batch
    of more than `max_lines` publications (what the broker could ever take in one commit) with 413."""
    lines = [(number, line) for number, line in enumerate(raw.splitlines(), start=1) if line.strip()]
    if max_lines is not None and len(lines) > max_lines:
        raise ProtocolError("body", f"{len(lines)} publications in one batch; at most {max_lines}", 413)
    bodies = [
        _normalise(load_json(line, f"line {number}: body", limits, publication=True), line, f"line {number}: ")
        ._replace(line=number)
        for number, line in lines
    ]
    if not bodies:
        raise ProtocolError("body", "empty batch: send one publication per line")
    return bodies


def _normalise(doc: object, raw: bytes, prefix: str) -> Routed:
    if isinstance(doc, dict):
        entries = doc.get("publication")
        if len(doc) == 1 and isinstance(entries, list):
            converted = _from_entries(entries, f"{prefix}publication", typed=True)
            return _routed(dumps_kept(converted), converted, prefix)
        body = dumps_kept(doc) if b"\n" in raw or b"\r" in raw else raw.strip()
        return _routed(body, doc, prefix)
    if isinstance(doc, list):
        converted = _from_entries(doc, f"{prefix}body", typed=False)
        return _routed(dumps_kept(converted), converted, prefix)
    raise ProtocolError(
        f"{prefix}body",
        'a publication is a JSON object, an array of {key, val} pairs, or {"publication": [...]}',
    )


def _routed(body: bytes, doc: dict[str, Any], prefix: str) -> Routed:
    return Routed(body, reserved_of(doc, prefix), key=key_of(doc, prefix))


def _from_entries(entries: list[Any], field: str, typed: bool) -> dict[str, Any]:
    """Defined form (`typed`: `type` is honoured and inferred when missing) or row form."""
    if not entries:
        raise ProtocolError(field, "no attributes: give at least one {key, val}")
    out: dict[str, Any] = {}
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
