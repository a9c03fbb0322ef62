"""What the TCP and WebSocket channels share: checking a handshake and starting a session."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from veil.gateway.edge import run_edge
from veil.gateway.sessions import Close, Send, Session
from veil.protocol import Handshake, ProtocolError, parse_ack, parse_handshake
from veil.security.identity import Credentials

if TYPE_CHECKING:
    from veil.gateway.server import Broker

Receive = Callable[[], Awaitable[bytes | str | None]]
MAX_LINE = 64 * 1024


async def open_session(broker: Broker, handshake: Handshake, identity: str | None, send: Send, close: Close) -> Session:
    """Check the handshake; ProtocolError (with the reason to send back) when refused."""
    client = broker.auth.identify(Credentials(identity, handshake.token, handshake.auth_hash))
    store = broker.threads.store
    owner = await broker.threads.read(store.subscription_owner, handshake.subscription_id)
    number = await broker.threads.read(store.subscription_number, handshake.subscription_id)
    if owner is None or number is None:
        raise ProtocolError("subscriptionId", "unknown subscription", 404)
    if owner != client:
        raise ProtocolError("authHash", "not the owner of this subscription", 403)
    refusal = await broker.threads.read(store.subscription_refusal, handshake.subscription_id)
    if refusal is not None:
        raise ProtocolError("subscriptionId", f"quarantined by the broker: {refusal}", 422)
    start = handshake.resume_after
    if start is None:
        saved = await broker.threads.read(store.cursor, handshake.subscription_id)
        start = max(saved, broker.hub.unsaved_cursor(handshake.subscription_id))
    session = Session(broker.hub, handshake, number, start, send, close)
    await broker.hub.attach(session)
    # An unsubscription that ran between the check above and the attach found no session to close.
    if await broker.threads.read(store.subscription_owner, handshake.subscription_id) is None:
        broker.hub.detach(session)
        raise ProtocolError("subscriptionId", "unknown subscription", 404)
    return session


def handle_client_line(session: Session, raw: bytes | str) -> None:
    """After the handshake a client may only acknowledge; anything else is ignored."""
    if raw.strip():
        with contextlib.suppress(ProtocolError):
            session.acknowledge(parse_ack(raw))


async def run_session(
    broker: Broker, handshake: bytes | str, identity: str | None, send: Send, close: Close, receive: Receive
) -> None:
    """Serve one delivery connection: push deliveries while reading acknowledgements, until either
    side ends it. `receive` returns the client's next message, or None when the client is done."""
    try:
        parsed = parse_handshake(handshake)
        if parsed.announcement_id:
            await run_edge(broker, parsed, identity, send, close, receive)
            await close(None)
            return
        session = await open_session(broker, parsed, identity, send, close)
    except ProtocolError as exc:
        await close(exc.to_json())
        return
    pusher = asyncio.create_task(session.run())
    try:
        while not pusher.done():
            reading = asyncio.create_task(receive())
            done, _ = await asyncio.wait({reading, pusher}, return_when=asyncio.FIRST_COMPLETED)
            if reading not in done:
                reading.cancel()
                break
            message = reading.result()
            if message is None:
                break
            handle_client_line(session, message)
    finally:
        await session.close()
        pusher.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, ssl.SSLError):
            await pusher
