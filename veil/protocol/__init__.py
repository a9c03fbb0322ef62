"""External formats of the SELIS protocol: parsing, validation and error bodies. Pure, no I/O."""

from veil.protocol.announcements import AnnounceRequest, parse_announce, parse_revoke
from veil.protocol.errors import ProtocolError
from veil.protocol.flatten import flatten
from veil.protocol.handshake import Handshake, parse_ack, parse_handshake
from veil.protocol.publications import (
    UnpublishRequest,
    keyed,
    parse_publication,
    parse_publication_batch,
    parse_unpublish,
    parse_valid_for,
)
from veil.protocol.subscriptions import SubscribeRequest, UnsubscribeRequest, parse_subscribe, parse_unsubscribe

__all__ = [
    "AnnounceRequest",
    "Handshake",
    "ProtocolError",
    "SubscribeRequest",
    "UnpublishRequest",
    "UnsubscribeRequest",
    "flatten",
    "keyed",
    "parse_ack",
    "parse_announce",
    "parse_handshake",
    "parse_publication",
    "parse_publication_batch",
    "parse_revoke",
    "parse_subscribe",
    "parse_unpublish",
    "parse_unsubscribe",
    "parse_valid_for",
]
