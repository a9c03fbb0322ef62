"""The one JSON form any client, in any language, makes of the same document: RFC 8785 (JSON
Canonicalization Scheme). Signed rosters and the data a sealed payload is bound to use it, so that
what is signed or authenticated is reproduced from its specification, not from one library's output.
"""

from __future__ import annotations

import rfc8785


def canonical(doc: object) -> bytes:
    """ValueError (naming why) for what JSON cannot carry exactly: integers beyond 2^53, NaN."""
    try:
        return rfc8785.dumps(doc)
    except rfc8785.CanonicalizationError as exc:
        raise ValueError(f"no canonical JSON form (RFC 8785): {exc}") from None
