"""The delivery envelope (SPEC §2.4), written and read in this module only.

A delivery with the envelope is one JSON object: `{"seq", "id", <envelope fields>, "publication"}`,
where `seq` is the position in the subscription's queue, `id` the publication's id (the original's,
for a copy queued under an offset of its own: top-k/w deliveries), and the envelope fields say
where the publication came from (`publisher`, `keyId`, `signature`) or what was done to it
(`cropped`). The publication comes last and byte for byte as published, so that a subscriber can
verify the publisher's signature over exactly those bytes.

The store keeps these facts as columns (`Origin`); `fields` writes them out once per publication.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import orjson

_COPY = b'"id"'  # envelope fields that start with an id belong to a copy: its id is the original's
_PUBLICATION = b'"publication":'


class Origin(NamedTuple):
    """Where a delivered publication came from and what was done to it, as the store keeps it."""

    publisher: str = ""
    key_id: str | None = None
    signature: str | None = None
    copy_of: int | None = None  # a copy queued under an offset of its own (top-k/w): the original
    cropped: bool = False  # fields were removed for the subscriber


@lru_cache(maxsize=4096)
def fields(origin: Origin) -> bytes:
    """The envelope fields of a delivery, as JSON members without braces, so that wrapping a delivery
    is a byte join. A cropped copy carries no signature, which covers bytes the subscriber does not
    get. Made once per publication, not per delivery (and cached: most publications share theirs)."""
    members: dict[str, object] = {}
    if origin.copy_of is not None:
        members["id"] = str(origin.copy_of)
    if origin.publisher:
        members["publisher"] = origin.publisher
    if origin.signature is not None and not origin.cropped:
        members.update(keyId=origin.key_id or "", signature=origin.signature)
    if origin.cropped:
        members["cropped"] = True
    return orjson.dumps(members)[1:-1] if members else b""


def wrap(seq: int, body: bytes, members: bytes) -> bytes:
    """One enveloped delivery line (without the newline); `members` as `fields` wrote them."""
    if members.startswith(_COPY):
        return b'{"seq":%d,%s,"publication":%s}' % (seq, members, body)
    if members:
        return b'{"seq":%d,"id":"%d",%s,"publication":%s}' % (seq, seq, members, body)
    return b'{"seq":%d,"id":"%d","publication":%s}' % (seq, seq, body)


def published_bytes(line: bytes) -> bytes:
    """The publication's bytes out of an enveloped line, exactly as `wrap` wrote them (the publisher's
    signature covers them). Inside JSON strings every quote is escaped, so the first unescaped
    `"publication":` is the member's key."""
    start = line.index(_PUBLICATION) + len(_PUBLICATION)
    return line[start : line.rstrip().rindex(b"}")]
