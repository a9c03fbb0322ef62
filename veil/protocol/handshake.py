"""The first line (TCP) or message (WebSocket) of a delivery connection, and acknowledgements.

Clients in the wild send the whole subscription document as the handshake; unknown fields are
ignored. A bearer token may prove the identity (`token`). The optional extensions ask for an
envelope (publication id, sequence number, publisher and signature), for
acknowledgement-driven cursors, for a resume point after a reconnect, and to join the subscription's
group (`"group": true`: its deliveries shared among the connections that join). An edge broker names its
announcement (`announcementId`) instead of a subscription. A client with many subscriptions may
name them all (`subscriptionIds`) on one connection: each publication comes once, enveloped, with the
ids of the subscriptions it is delivered to (`subscriptionIds`); an acknowledgement then covers all of
them. Such a connection's resume point may be one per subscription (`"resumeAfter": [seq or null,
...]`, in the order of `subscriptionIds`; a list rather than an object keyed by id, so that the
handshake of a thousand subscriptions still fits in one line): its lines are not in one global order
(a backlog read brings older publications after newer ones), so no single number says where each
subscription stopped.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard

from veil.protocol.announcements import announcement_id_of
from veil.protocol.errors import ProtocolError
from veil.protocol.limits import INT64_MAX, load_json
from veil.protocol.subscriptions import MAX_CREDENTIAL_LENGTH, auth_hash_of, subscription_id_of

MAX_MULTIPLEXED = 2048  # subscriptions on one connection (a handshake line holds ~1,800 uuids anyway)


class Handshake(NamedTuple):
    auth_hash: str | None
    subscription_id: str
    envelope: bool
    ack: bool
    resume_after: int | None
    token: str | None = None  # a bearer token proving the client's identity
    announcement_id: str = ""  # an edge broker's channel: the subscriptions its announcement may serve
    subscription_ids: tuple[str, ...] = ()  # a multiplexed connection: these subscriptions, in one stream
    resume_each: tuple[int | None, ...] | None = None  # a multiplexed connection's, per subscription
    group: bool = False  # a member of the subscription's group: its deliveries shared among the members

    def for_subscription(self, place: int) -> Handshake:
        """This multiplexed handshake as one naming only its `place`-th subscription would be, with
        that subscription's resume point."""
        resume = self.resume_after if self.resume_each is None else self.resume_each[place]
        return self._replace(subscription_id=self.subscription_ids[place], resume_after=resume)


def parse_handshake(raw: bytes | str) -> Handshake:
    doc = load_json(raw, "handshake")
    if not isinstance(doc, dict):
        raise ProtocolError("handshake", 'expected {"authHash": ..., "subscriptionId": ...}')
    envelope = _flag(doc, "envelope")
    ack = _flag(doc, "ack")
    resume = doc.get("resumeAfter")
    each = resume if isinstance(resume, list) else None
    if each is None and resume is not None and not _sequence(resume):
        raise ProtocolError("resumeAfter", f"not a sequence number (an integer from 0 to {INT64_MAX})")
    token = doc.get("token")
    if token is not None and (not isinstance(token, str) or not token or len(token) > MAX_CREDENTIAL_LENGTH):
        raise ProtocolError("token", f"not a non-empty string of at most {MAX_CREDENTIAL_LENGTH} characters")
    announcement = announcement_id_of(doc, required=False)
    many = _subscription_ids(doc)
    sub_id = subscription_id_of(doc, required=not (announcement or many))
    if many and (sub_id or announcement):
        raise ProtocolError("subscriptionIds", "names the subscriptions instead of subscriptionId or announcementId")
    group = _flag(doc, "group")
    if group:
        _check_group(ack, resume, many, announcement)
    return Handshake(
        auth_hash_of(doc), sub_id, envelope or ack or bool(many), ack, None if each is not None else resume, token,
        announcement, many, None if each is None else _resume_each(each, many), group,
    )  # fmt: skip


def _check_group(ack: bool, resume: object, many: tuple[str, ...], announcement: str) -> None:
    """A group member names one subscription, acknowledges what it takes and resumes where the group
    stands (after what its members acknowledged), not where it says."""
    if not ack:
        raise ProtocolError("group", 'a member acknowledges each delivery it takes: give "ack": true with it')
    if many or announcement:
        raise ProtocolError("group", "joins the group of one subscription (subscriptionId)")
    if resume is not None:
        raise ProtocolError("resumeAfter", "a group resumes after what its members acknowledged: not with group")


def _resume_each(each: list[Any], many: tuple[str, ...]) -> tuple[int | None, ...]:
    if len(each) != len(many):
        raise ProtocolError("resumeAfter", "one resume point (or null) per subscription of subscriptionIds")
    for i, seq in enumerate(each):
        if seq is not None and not _sequence(seq):
            raise ProtocolError(f"resumeAfter[{i}]", f"not a sequence number (an integer from 0 to {INT64_MAX})")
    return tuple(each)


def _subscription_ids(doc: dict[str, Any]) -> tuple[str, ...]:
    ids = doc.get("subscriptionIds")
    if ids is None:
        return ()
    if not isinstance(ids, list) or not ids or len(ids) > MAX_MULTIPLEXED:
        raise ProtocolError("subscriptionIds", f"a list of 1 to {MAX_MULTIPLEXED} subscription ids")
    checked = []
    for i, sub_id in enumerate(ids):
        try:
            checked.append(subscription_id_of({"subscriptionId": sub_id}, required=True))
        except ProtocolError as exc:
            raise ProtocolError(f"subscriptionIds[{i}]", exc.problem) from None
    if len(set(checked)) < len(checked):
        raise ProtocolError("subscriptionIds", "names a subscription twice")
    return tuple(checked)


def parse_ack(raw: bytes | str) -> int:
    doc = load_json(raw, "ack")
    seq = doc.get("ack") if isinstance(doc, dict) else None
    if not _sequence(seq):
        raise ProtocolError("ack", 'expected {"ack": <sequence number>}')
    return seq


def _sequence(value: object) -> TypeGuard[int]:
    """Sequence numbers are log offsets: signed 64-bit in every store."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX


def _flag(doc: dict[str, Any], name: str) -> bool:
    value = doc.get(name, False)
    if not isinstance(value, bool):
        raise ProtocolError(name, "not a boolean")
    return value
