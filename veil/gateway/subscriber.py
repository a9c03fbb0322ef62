"""Who may receive a subscription's deliveries on a delivery connection: its owner, proven by the
handshake's credentials, while the subscription is neither quarantined nor connected through another
gateway, and while those credentials would still admit it (a scope or a filter that a token claim or a
certificate attribute allowed when it was made may be allowed no more); and where its deliveries
resume."""

from __future__ import annotations

from typing import NamedTuple

from veil.gateway import membership
from veil.gateway.context import Gateway
from veil.matching.stored import decode_subscription
from veil.protocol import Handshake, ProtocolError
from veil.security.admission import admit_subscription
from veil.security.identity import Principal


class Admitted(NamedTuple):
    """A subscription this connection may deliver: its number, where delivery starts and when this
    gateway claimed it (`membership`)."""

    sub_id: str
    number: int
    start_after: int
    claimed: float
    client: str = ""  # the owner's identity


async def admit(gateway: Gateway, handshake: Handshake, principal: Principal) -> Admitted:
    """Check the handshake for its subscription; ProtocolError (with the reason to send back) when refused."""
    threads, hub = gateway.threads, gateway.hub
    store = threads.store
    # one answer for an id nobody holds and one someone else holds: a client learns nothing of others'
    found = await threads.read(store.live_subscription, handshake.subscription_id, principal.identity)
    if found is None:
        raise ProtocolError("subscriptionId", "unknown subscription", 404)
    number, body = found
    stored = decode_subscription(body)
    try:
        admit_subscription(gateway.registry.current, principal, stored.predicates, stored.scope)
    except ProtocolError as exc:
        problem = f"these credentials no longer admit this subscription ({exc.field}: {exc.problem})"
        raise ProtocolError("subscriptionId", problem, 403) from None
    refusal = await threads.read(store.subscription_refusal, handshake.subscription_id)
    if refusal is not None:
        raise ProtocolError("subscriptionId", f"quarantined by the broker: {refusal}", 422)
    claimed = await membership.claim(gateway, handshake.subscription_id)
    start = handshake.resume_after
    if start is None:
        saved = await threads.read(store.cursor, handshake.subscription_id)
        start = max(saved, hub.unsaved_cursor(handshake.subscription_id, number))
    return Admitted(handshake.subscription_id, number, start, claimed, principal.identity)
