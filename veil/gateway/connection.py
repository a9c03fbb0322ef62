"""A delivery connection after its first message, whatever carries it: a subscription's session
(deliveries pushed, acknowledgements read), the sessions of a multiplexed connection, or an edge
broker's channel, chosen by the handshake. The credentials of the handshake are checked once, and a
connection that a bearer token opened ends when the token expires, with an error line saying so."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time

from veil.gateway import membership, memory, monitor
from veil.gateway.channel import FAILED, Close, Receive, Send, failure_line, read_while
from veil.gateway.context import Gateway
from veil.gateway.delivery import Session
from veil.gateway.edge import run_edge
from veil.gateway.multiplex import serve_multiplexed
from veil.gateway.quotas import Client
from veil.gateway.subscriber import admit
from veil.protocol import Handshake, ProtocolError, parse_ack, parse_handshake
from veil.protocol.errors import unknown
from veil.security.identity import Credentials, Principal
from veil.security.tls import fingerprint

log = logging.getLogger("veil.gateway")
MAX_LINE = 64 * 1024


async def open_session(
    gateway: Gateway, handshake: Handshake, principal: Principal, send: Send, close: Close, client: Client
) -> Session:
    """Admit the handshake's subscription and attach its session, in `client`'s connection place the
    caller took; ProtocolError when refused."""
    (admitted,) = await admit(gateway, handshake, principal)
    threads, hub = gateway.threads, gateway.hub
    session = None
    try:
        session = Session(hub, handshake, admitted.number, admitted.start_after, send, close, admitted.claimed, client)
        await hub.attach(session)
        # An unsubscription that ran between the check above and the attach found no session to close
        # (and the id may have been taken again since, under another number).
        if await threads.read(threads.store.subscription_number, handshake.subscription_id) != session.number:
            raise unknown("subscription")
    except BaseException:  # whatever stops the opening (a store error, the gateway stopping) gives all back
        if session is not None:
            hub.detach(session)
        await membership.release(gateway, [admitted.sub_id], admitted.claimed)
        raise
    return session


def handle_client_line(session: Session, raw: bytes | str) -> None:
    """After the handshake a client may only acknowledge; anything else is ignored."""
    if raw.strip():
        with contextlib.suppress(ProtocolError):
            session.acknowledge(parse_ack(raw))


async def serve_connection(
    gateway: Gateway, handshake: bytes | str, certificate: bytes | None, send: Send, close: Close, receive: Receive
) -> None:
    """Serve one delivery connection until either side ends it; `certificate` is the client's
    verified certificate (DER), if it showed one."""
    if monitor.is_monitor(gateway, handshake):
        await monitor.serve(gateway, send, close, receive)
        return
    try:
        parsed = parse_handshake(handshake)
        await gateway.registry.fresh()  # credentials revoked through another gateway are refused already
        fingerprinted = fingerprint(certificate) if certificate else None
        credentials = Credentials(fingerprinted, parsed.token, parsed.auth_hash, certificate)
        principal = gateway.auth.principal(credentials)
    except ProtocolError as exc:
        await close(exc.to_json())
        return
    except gateway.threads.store.failures as exc:
        log.warning("a delivery handshake met a store failure (%s); its client is told to reconnect", exc)
        await close(FAILED.to_json())
        return
    expiry = _end_at_expiry(principal, close)
    watched = gateway.credentials.watch(credentials, principal.identity, close)
    try:
        await _serve(gateway, parsed, principal, send, close, receive)
    except Exception as exc:
        line = failure_line(exc, gateway.threads.store.failures)
        if line is None:
            raise
        log.warning("a delivery connection ended on a store failure (%s); its client is told to reconnect", exc)
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await close(line)
    finally:
        gateway.credentials.forget(watched)
        if expiry is not None:
            expiry.cancel()
        memory.give_back()  # what the connection's queues and subscriptions held, now unreferenced


async def _serve(
    gateway: Gateway, handshake: Handshake, principal: Principal, send: Send, close: Close, receive: Receive
) -> None:
    try:
        if handshake.announcement_id:
            await run_edge(gateway, handshake, principal, send, close, receive)
            await close(None)
            return
        # the client's connection place first: a refused connection must not have touched the claims
        # of older ones of the same subscriptions
        client = gateway.hub.quotas.connect(principal.identity)
    except ProtocolError as exc:
        await close(exc.to_json())
        return
    serve = serve_multiplexed if handshake.subscription_ids else _serve_session
    try:
        await serve(gateway, handshake, principal, client, send, close, receive)
    finally:
        gateway.hub.quotas.disconnect(client)


async def _serve_session(
    gateway: Gateway, handshake: Handshake, principal: Principal, client: Client, send: Send, close: Close,
    receive: Receive,
) -> None:  # fmt: skip
    try:
        session = await open_session(gateway, handshake, principal, send, close, client)
    except ProtocolError as exc:
        await close(exc.to_json())
        return
    pusher = asyncio.create_task(session.run())
    try:
        await read_while(pusher, receive, lambda message: handle_client_line(session, message))
    finally:
        try:  # a store error that ended the pusher is raised (and logged) after everything is given back
            pusher.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, ssl.SSLError):
                await pusher
            await session.close()
        finally:
            session.forget()
            await membership.release(gateway, [session.sub_id], session.claimed)


def _end_at_expiry(principal: Principal, close: Close) -> asyncio.Task[None] | None:
    """Close the connection when the token that proved its client expires: what a token allowed
    lasts no longer than the token."""
    expires = principal.expires
    if expires is None:
        return None

    async def end() -> None:
        await asyncio.sleep(max(0.0, expires - time.time()))
        await close(ProtocolError("token", "expired: a delivery connection lasts as long as its token", 401).to_json())

    return asyncio.create_task(end())
