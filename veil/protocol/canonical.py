"""The one JSON form any client, in any language, makes of the same document: RFC 8785 (JSON
Canonicalization Scheme). Signed rosters and the data a sealed payload is bound to use it, so that
what is signed or authenticated is reproduced from its specification, not from one library's output.

The `rfc8785` library writes it in pure Python, 29 µs for a sealed publication's attributes (measured
with `bench.sealing`'s attributes and an origin): a publisher pays that for every sealed publication
and a subscriber for every one it opens. orjson with sorted keys writes the same bytes, 5 µs with
the check below, for documents whose numbers are integers
within 2^53 or non-integral floats of magnitude 1e-5 or more (JCS writes 1.0 as 1 and switches to
exponents at other bounds), and whose keys hold no character beyond the Basic Multilingual Plane
(JCS sorts keys by UTF-16 code units, orjson by code points: the two orders differ only there).
Such documents, nearly all publications, take orjson; the rest take the library.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import rfc8785

SAFE_INTEGER = 2**53 - 1
ASTRAL = "\U00010000"


def canonical(doc: Any) -> bytes:
    """ValueError (naming why) for what JSON cannot carry exactly: integers beyond 2^53, NaN."""
    if _orjson_writes_it(doc):
        try:
            return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass  # a lone surrogate, or a type JSON has not: the library says what is wrong
    try:
        return rfc8785.dumps(doc)
    except rfc8785.CanonicalizationError as exc:
        raise ValueError(f"no canonical JSON form (RFC 8785): {exc}") from None


def _orjson_writes_it(value: object, depth: int = 0) -> bool:
    """Whether orjson's sorted output of `value` is its RFC 8785 form (see the module's docstring);
    a type orjson does not write makes it raise, and the library decides."""
    if isinstance(value, str) or value is None:
        return True
    if isinstance(value, float):
        return math.isfinite(value) and value != math.floor(value) and abs(value) >= 1e-5
    if isinstance(value, int):  # bool too
        return -SAFE_INTEGER <= value <= SAFE_INTEGER
    if depth > 64:
        return False  # the library walks it, and says how deep is too deep
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not (key.isascii() or max(key, default="") < ASTRAL):
                return False
            if not _orjson_writes_it(item, depth + 1):
                return False
        return True
    if isinstance(value, list):
        return all(_orjson_writes_it(item, depth + 1) for item in value)
    return False
