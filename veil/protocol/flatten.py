"""Flattening of nested publications into path keys for matching.

Written in-house: the `flatten_json` package is unmaintained and cannot tell `a.0` (a key "0") from
an array index. Here array indices are bracketed: {"a": {"b": [7, {"c": 1}]}} gives "a.b.[0]" = 7 and
"a.b.[1].c" = 1. A null is not matchable, so its key is left out.
"""

from __future__ import annotations

from veil.protocol.values import Scalar


def flatten(doc: dict) -> dict[str, Scalar]:
    out: dict[str, Scalar] = {}
    for key, value in doc.items():
        _walk(key, value, out)
    return out


def _walk(path: str, value: object, out: dict[str, Scalar]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _walk(f"{path}.{key}", inner, out)
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            _walk(f"{path}.[{i}]", inner, out)
    elif value is not None:
        out[path] = value  # type: ignore[assignment]
