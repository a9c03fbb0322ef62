"""Envelope fields of a delivered publication (SPEC §2.4) that depend on the copy delivered.

Envelope fields are kept beside each publication as JSON members without braces (`"publisher":
"fleet","keyId":"k1","signature":"..."`), so that wrapping a delivery is a byte join.
"""

from __future__ import annotations

import orjson

SIGNATURE_FIELDS = ("keyId", "signature")


def cropped_fields(meta: bytes) -> bytes:
    """The envelope fields of a cropped copy: everything the original's say (its publisher, the id of
    the original), without the signature, which covers bytes the subscriber does not get, and with
    `"cropped": true`."""
    fields = orjson.loads(b"{%s}" % meta) if meta else {}
    for name in SIGNATURE_FIELDS:
        fields.pop(name, None)
    fields["cropped"] = True
    return orjson.dumps(fields)[1:-1]
