"""The first line (TCP) or message (WebSocket) of a delivery connection, and acknowledgements.

Clients in the wild send the whole subscription document as the handshake; unknown fields are
ignored. A bearer token may prove the identity (`token`). The optional extensions ask for an
envelope (publication id, sequence number, publisher and signature), for
acknowledgement-driven cursors, and for a resume point after a reconnect. An edge broker names its
announcement (`announcementId`) instead of a subscription.
"""

from __future__ import annotations

from typing import NamedTuple

from veil.protocol.announcements import announcement_id_of
from veil.protocol.errors import ProtocolError
from veil.protocol.limits import INT64_MAX, load_json
from veil.protocol.subscriptions import MAX_CREDENTIAL_LENGTH, auth_hash_of, subscription_id_of


class Handshake(NamedTuple):
    auth_hash: str | None
    subscription_id: str
    envelope: bool
    ack: bool
    resume_after: int | None
    token: str | None = None  # a bearer token proving the client's identity
    announcement_id: str = ""  # an edge broker's channel: the subscriptions its announcement may serve


def parse_handshake(raw: bytes | str) -> Handshake:
    doc = load_json(raw, "handshake")
    if not isinstance(doc, dict):
        raise ProtocolError("handshake", 'expected {"authHash": ..., "subscriptionId": ...}')
    envelope = _flag(doc, "envelope")
    ack = _flag(doc, "ack")
    resume = doc.get("resumeAfter")
    if resume is not None and not _sequence(resume):
        raise ProtocolError("resumeAfter", f"not a sequence number (an integer from 0 to {INT64_MAX})")
    token = doc.get("token")
    if token is not None and (not isinstance(token, str) or not token or len(token) > MAX_CREDENTIAL_LENGTH):
        raise ProtocolError("token", f"not a non-empty string of at most {MAX_CREDENTIAL_LENGTH} characters")
    announcement = announcement_id_of(doc, required=False)
    sub_id = subscription_id_of(doc, required=not announcement)
    return Handshake(auth_hash_of(doc), sub_id, envelope or ack, ack, resume, token, announcement)


def parse_ack(raw: bytes | str) -> int:
    doc = load_json(raw, "ack")
    seq = doc.get("ack") if isinstance(doc, dict) else None
    if not _sequence(seq):
        raise ProtocolError("ack", 'expected {"ack": <sequence number>}')
    return seq  # type: ignore[return-value]


def _sequence(value: object) -> bool:
    """Sequence numbers are log offsets: signed 64-bit in every store."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX


def _flag(doc: dict, name: str) -> bool:
    value = doc.get(name, False)
    if not isinstance(value, bool):
        raise ProtocolError(name, "not a boolean")
    return value
