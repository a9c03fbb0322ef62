"""Announcements of edge brokers (SPEC §9): what the publishers behind an edge broker can produce,
as a conjunction of constraints in the subscription language."""

from __future__ import annotations

from typing import Any, NamedTuple

from veil.protocol.errors import ProtocolError
from veil.protocol.limits import DEFAULT, Limits
from veil.protocol.subscriptions import MAX_ID_LENGTH, auth_hash_of, load_object, parse_constraints


class AnnounceRequest(NamedTuple):
    auth_hash: str | None
    announcement_id: str | None
    predicates: list[tuple[str, str, object]]


def parse_announce(raw: bytes, limits: Limits = DEFAULT) -> AnnounceRequest:
    """`{"authHash": H, "announcementId": ID?, "data": [{"key", "val", "type"?, "op"}, ...]}`; an
    empty `data` announces publications of any content."""
    doc = load_object(raw, limits)
    predicates = parse_constraints(doc.get("data"), "data", limits)
    return AnnounceRequest(auth_hash_of(doc), announcement_id_of(doc, required=False) or None, predicates)


def parse_revoke(raw: bytes) -> tuple[str | None, str]:
    doc = load_object(raw)
    return auth_hash_of(doc), announcement_id_of(doc, required=True)


def announcement_id_of(doc: dict[str, Any], required: bool) -> str:
    ann_id = doc.get("announcementId")
    if ann_id is None or ann_id == "":
        if required:
            raise ProtocolError("announcementId", "missing")
        return ""
    if not isinstance(ann_id, str) or len(ann_id) > MAX_ID_LENGTH or not ann_id.isprintable():
        raise ProtocolError("announcementId", f"a string of at most {MAX_ID_LENGTH} printable characters")
    return ann_id

