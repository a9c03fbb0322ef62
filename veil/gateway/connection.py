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
from veil.gateway.multiplex import serve_multiplexed
from veil.gateway.subscriber import admit
from veil.monitoring import selis as monitoring
from veil.protocol import Handshake, ProtocolError, parse_ack, parse_handshake

MAX_LINE = 64 * 1024


async def open_session(
    gateway: Gateway, handshake: Handshake, identity: str | None, send: Send, close: Close
) -> Session:
    """Admit the handshake's subscription and attach its session; ProtocolError when refused."""
    admitted = await admit(gateway, handshake, identity)
    threads, hub = gateway.threads, gateway.hub
    try:
        client = hub.quotas.connect(admitted.client)
    except ProtocolError:
        await membership.release(gateway, admitted.sub_id, admitted.claimed)
        raise
    session = Session(hub, handshake, admitted.number, admitted.start_after, send, close, admitted.claimed, client)
    await hub.attach(session)
    # An unsubscription that ran between the check above and the attach found no session to close.
    if await threads.read(threads.store.subscription_owner, handshake.subscription_id) is None:
        hub.detach(session)
        hub.quotas.disconnect(client)
        await membership.release(gateway, session.sub_id, admitted.claimed)
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
        session.forget()
        gateway.hub.quotas.disconnect(session.client)
        with contextlib.suppress(Exception):  # a claim not released lapses with this gateway's renewals
            await membership.release(gateway, session.sub_id, session.claimed)
