"""Who may receive a subscription's deliveries on a delivery connection: its owner, proven by the
handshake's credentials, while the subscription is neither quarantined nor connected through another
gateway; and where its deliveries resume."""

from __future__ import annotations

from typing import NamedTuple

from veil.gateway import membership
from veil.gateway.context import Gateway
from veil.protocol import Handshake, ProtocolError
from veil.security.identity import Credentials


class Admitted(NamedTuple):
    """A subscription this connection may deliver: its number, where delivery starts and when this
    gateway claimed it (`membership`)."""

    sub_id: str
    number: int
    start_after: int
    claimed: float
    client: str = ""  # the owner's identity


async def admit(gateway: Gateway, handshake: Handshake, identity: str | None) -> Admitted:
    """Check the handshake for its subscription; ProtocolError (with the reason to send back) when refused."""
    client = gateway.auth.identify(Credentials(identity, handshake.token, handshake.auth_hash))
    threads, hub = gateway.threads, gateway.hub
    store = threads.store
    owner = await threads.read(store.subscription_owner, handshake.subscription_id)
    number = await threads.read(store.subscription_number, handshake.subscription_id)
    if owner is None or number is None:
        raise ProtocolError("subscriptionId", "unknown subscription", 404)
    if owner != client:
        raise ProtocolError("authHash", "not the owner of this subscription", 403)
    refusal = await threads.read(store.subscription_refusal, handshake.subscription_id)
    if refusal is not None:
        raise ProtocolError("subscriptionId", f"quarantined by the broker: {refusal}", 422)
    claimed = await membership.claim(gateway, handshake.subscription_id)
    start = handshake.resume_after
    if start is None:
        saved = await threads.read(store.cursor, handshake.subscription_id)
        start = max(saved, hub.unsaved_cursor(handshake.subscription_id))
    return Admitted(handshake.subscription_id, number, start, claimed, client)
