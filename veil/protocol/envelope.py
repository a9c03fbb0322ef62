"""The delivery envelope (SPEC §2.4), written and read in this module only.

A delivery with the envelope is one JSON object: `{"seq", "id", <envelope fields>, "publication"}`,
where `seq` is the position in the subscription's queue, `id` the publication's id (the original's,
for a copy queued under an offset of its own: top-k/w deliveries), and the envelope fields say
where the publication came from (`publisher`, `keyId`, `signature`) or what was done to it
(`cropped`). The publication comes last and byte for byte as published, so that a subscriber can
verify the publisher's signature over exactly those bytes.

Envelope fields are kept beside each publication as JSON members without braces (`"publisher":
"fleet","keyId":"k1","signature":"..."`), so that wrapping a delivery is a byte join.
"""

from __future__ import annotations

import orjson

SIGNATURE_FIELDS = ("keyId", "signature")
_COPY = b'"id"'  # envelope fields that start with an id belong to a copy: its id is the original's
_PUBLICATION = b'"publication":'


def origin_fields(publisher: str, key_id: str | None = None, signature: str | None = None) -> bytes:
    """The envelope fields of a publication as published: who published it, and its signature."""
    fields: dict[str, str] = {}
    if publisher:
        fields["publisher"] = publisher
    if signature is not None:
        fields.update(keyId=key_id or "", signature=signature)
    return orjson.dumps(fields)[1:-1] if fields else b""


def copy_fields(original: int, meta: bytes) -> bytes:
    """The envelope fields of a copy of publication `original` queued under an offset of its own."""
    return b'"id":"%d"%s%s' % (original, b"," if meta else b"", meta)


def cropped_fields(meta: bytes) -> bytes:
    """The envelope fields of a cropped copy: everything the original's say (its publisher, the id of
    the original), without the signature, which covers bytes the subscriber does not get, and with
    `"cropped": true`."""
    fields = orjson.loads(b"{%s}" % meta) if meta else {}
    for name in SIGNATURE_FIELDS:
        fields.pop(name, None)
    fields["cropped"] = True
    return orjson.dumps(fields)[1:-1]


def wrap(seq: int, body: bytes, meta: bytes) -> bytes:
    """One enveloped delivery line (without the newline)."""
    if meta.startswith(_COPY):
        return b'{"seq":%d,%s,"publication":%s}' % (seq, meta, body)
    if meta:
        return b'{"seq":%d,"id":"%d",%s,"publication":%s}' % (seq, seq, meta, body)
    return b'{"seq":%d,"id":"%d","publication":%s}' % (seq, seq, body)


def published_bytes(line: bytes) -> bytes:
    """The publication's bytes out of an enveloped line, exactly as `wrap` wrote them (the publisher's
    signature covers them). Inside JSON strings every quote is escaped, so the first unescaped
    `"publication":` is the member's key."""
    start = line.index(_PUBLICATION) + len(_PUBLICATION)
    return line[start : line.rstrip().rindex(b"}")]
