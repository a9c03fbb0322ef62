"""Limits at the door: bounds on everything the pipeline will later process, checked while parsing.

The gateway answers 200 only for what the matcher can handle, since a document it cannot process
would otherwise be found only in the pipeline, after the publisher was told it is safe. The
defaults are far beyond what honest clients send (the seeds' largest subscriptions have 40
constraints, their publications a dozen attributes) and each can be raised by configuration.
Every check here is linear in the size of the request.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import orjson

from veil.protocol.errors import ProtocolError

DAY_MS = 24 * 3600 * 1000
INT64_MAX = 2**63 - 1


class Limits(NamedTuple):
    depth: int = 32  # nesting of objects and arrays in one document
    keys: int = 10_000  # attributes of one publication, after flattening (its scalar leaves)
    key_length: int = 1_024  # characters of one key of a JSON object
    constraints: int = 1_024  # constraints of one subscription or announcement
    in_values: int = 10_000  # values of one `in` constraint
    k: int = 10_000  # top-k/w: the most publications a subscription ranks
    window_ms: int = 30 * DAY_MS  # top-k/w: the longest window
    validity_ms: int = 30 * DAY_MS  # the longest X-Valid-For
    # top-k of the last n: the largest n. A window whose scores only worsen keeps all n in its skyband,
    # and each arrival's expiry then moves them all: the bound is what one arrival may cost
    window_count: int = 10_000


DEFAULT = Limits()


def dumps_kept(doc: object) -> bytes:
    """JSON for bytes that are kept (queued, or for a connection's life): orjson returns its result in
    a buffer rounded up to a power of two of at least 4 KiB and never shrinks it, so a kept result of
    a few bytes would hold 4 KiB; this copy holds what it says."""
    return bytes(memoryview(orjson.dumps(doc)))


def load_json(raw: bytes | str, field: str = "body", limits: Limits = DEFAULT, publication: bool = False) -> object:
    """Parse JSON and check it against the limits; a syntax error, a document nested too deeply, a key
    too long or a key given twice in one object is a 400 naming `field`, and so is a publication with
    too many attributes (413).

    Duplicate keys are refused because parsers disagree on which one wins: a rule could be passed by
    one reading of a publication and read by another."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise ProtocolError(field, f"nested deeper than {limits.depth} levels") from None
        raise ProtocolError(field, f"malformed JSON: {exc}") from None
    if isinstance(doc, dict | list):
        members, leaves = measure(doc, limits, field)
        if publication and leaves > limits.keys:
            raise ProtocolError(field, f"{leaves} attributes; at most {limits.keys}", 413)
        # Every member of an object has one colon outside strings, so a key was dropped as a duplicate
        # exactly when the text has more colons outside strings than the parsed objects have members.
        # The colons inside strings are those of the parsed strings unless one was written as an
        # escape (\u003a), which only the exact, slower check can see through.
        colons = raw.count(b":") if isinstance(raw, bytes) else raw.count(":")
        if members and colons > members:
            escaped = b"\\u003" in raw if isinstance(raw, bytes) else "\\u003" in raw
            if escaped or colons - _string_colons(doc) > members:
                _refuse_duplicates(raw, field)
    return doc


def measure(doc: dict[str, Any] | list[Any], limits: Limits, field: str) -> tuple[int, int]:
    """(object members, scalar leaves) of a document, without recursion (a hostile document is as
    deep as the parser allows) and failing at the first bound it passes."""
    members = leaves = 0
    max_depth, key_length = limits.depth, limits.key_length
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            raise ProtocolError(field, f"nested deeper than {max_depth} levels")
        if isinstance(value, dict):
            members += len(value)
            for key, inner in value.items():
                if len(key) > key_length:
                    raise ProtocolError(field, f"a key of {len(key)} characters; at most {key_length}")
                if isinstance(inner, dict | list):
                    stack.append((inner, depth + 1))
                elif inner is not None:
                    leaves += 1
        else:
            for inner in value:
                if isinstance(inner, dict | list):
                    stack.append((inner, depth + 1))
                elif inner is not None:
                    leaves += 1
    return members, leaves


def _string_colons(doc: dict[str, Any] | list[Any]) -> int:
    """Colons in the keys and string values of a document (walked without recursion)."""
    count = 0
    stack: list[dict[str, Any] | list[Any]] = [doc]
    while stack:
        value = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, inner in items:
            if isinstance(key, str):
                count += key.count(":")
            if isinstance(inner, str):
                count += inner.count(":")
            elif isinstance(inner, dict | list):
                stack.append(inner)
    return count


class _Duplicate(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> None:
    keys = {key for key, _ in pairs}
    if len(keys) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)


def _refuse_duplicates(raw: bytes | str, field: str) -> None:
    try:
        json.loads(raw, object_pairs_hook=_no_duplicates)
    except _Duplicate as exc:
        raise ProtocolError(field, f"key {exc.args[0]!r} given twice in one object") from None


def check_int(value: int, field: str) -> int:
    """Integers are stored as signed 64-bit numbers."""
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ProtocolError(field, "an integer beyond the signed 64-bit range")
    return value
