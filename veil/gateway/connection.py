"""A delivery connection after its first message, whatever carries it: a subscription's session
(deliveries pushed, acknowledgements read), the sessions of a multiplexed connection, or an edge
broker's channel, chosen by the handshake."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from veil.gateway import membership
from veil.gateway.channel import Close, Receive, Send, read_while
from veil.gateway.context import Gateway
from veil.gateway.delivery import Session
from veil.gateway.edge import run_edge
from veil.gateway.multiplex import Mux, serve_multiplexed
from veil.monitoring import selis as monitoring
from veil.protocol import Handshake, ProtocolError, parse_ack, parse_handshake
from veil.security.identity import Credentials

MAX_LINE = 64 * 1024


async def open_session(
    gateway: Gateway, handshake: Handshake, identity: str | None, send: Send, close: Close, mux: Mux | None = None
) -> Session:
    """Check the handshake; ProtocolError (with the reason to send back) when refused."""
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
    session = Session(hub, handshake, number, start, send, close, claimed, mux)
    await hub.attach(session)
    # An unsubscription that ran between the check above and the attach found no session to close.
    if await threads.read(store.subscription_owner, handshake.subscription_id) is None:
        hub.detach(session)
        await membership.release(gateway, session.sub_id, claimed)
        raise ProtocolError("subscriptionId", "unknown subscription", 404)
    return session


def handle_client_line(session: Session, raw: bytes | str) -> None:
    """After the handshake a client may only acknowledge; anything else is ignored."""
    if raw.strip():
        with contextlib.suppress(ProtocolError):
            session.acknowledge(parse_ack(raw))


async def serve_connection(
    gateway: Gateway, handshake: bytes | str, identity: str | None, send: Send, close: Close, receive: Receive
) -> None:
    """Serve one delivery connection until either side ends it."""
    if monitoring.is_monitor(gateway, handshake):
        await monitoring.serve(gateway, send, close, receive)
        return
    try:
        parsed = parse_handshake(handshake)
        if parsed.announcement_id:
            await run_edge(gateway, parsed, identity, send, close, receive)
            await close(None)
            return
        if parsed.subscription_ids:
            await serve_multiplexed(gateway, parsed, identity, send, close, receive)
            return
        session = await open_session(gateway, parsed, identity, send, close)
    except ProtocolError as exc:
        await close(exc.to_json())
        return
    pusher = asyncio.create_task(session.run())
    try:
        await read_while(pusher, receive, lambda message: handle_client_line(session, message))
    finally:
        await session.close()
        pusher.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, ssl.SSLError):
            await pusher
        with contextlib.suppress(Exception):  # a claim not released lapses with this gateway's renewals
            await membership.release(gateway, session.sub_id, session.claimed)
