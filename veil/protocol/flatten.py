"""Flattening of nested publications into path keys for matching.

Written in-house: the `flatten_json` package is unmaintained and cannot tell `a.0` (a key "0") from
an array index. Here array indices are bracketed: {"a": {"b": [7, {"c": 1}]}} gives "a.b.[0]" = 7 and
"a.b.[1].c" = 1. A null is not matchable, so its key is left out.
"""

from __future__ import annotations

from typing import Any

from veil.protocol.values import Scalar


def flatten(doc: dict[str, Any]) -> dict[str, Scalar]:
    """Without recursion: the pipeline must never fail on a document the gateway let through, and
    Python's recursion limit is lower than the nesting JSON parsers accept."""
    out: dict[str, Scalar] = {}
    stack: list[tuple[str, Any]] = list(reversed(doc.items()))  # JSON: the leaves are scalars
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{path}.{key}", inner) for key, inner in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{path}.[{i}]", value[i]) for i in range(len(value) - 1, -1, -1))
        elif value is not None:
            out[path] = value
    return out
