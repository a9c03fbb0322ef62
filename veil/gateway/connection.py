"""A delivery connection after its first message, whatever carries it: subscriptions' deliveries
(pushed, acknowledgements read; one subscription or many, multiplexed) or an edge broker's channel,
chosen by the handshake. The credentials of the handshake are checked once, and a
connection that a bearer token opened ends when the token expires, with an error line saying so."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time

from veil.gateway import memory, monitor
from veil.gateway.channel import FAILED, Close, Receive, Send, failure_line
from veil.gateway.context import Gateway
from veil.gateway.delivering import serve_subscriptions
from veil.gateway.edge import run_edge
from veil.gateway.group import serve_member
from veil.protocol import Handshake, ProtocolError, parse_handshake
from veil.security.identity import Credentials, Principal
from veil.security.tls import fingerprint

log = logging.getLogger("veil.gateway")
MAX_LINE = 64 * 1024


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
    try:
        serve = serve_member if handshake.group else serve_subscriptions
        await serve(gateway, handshake, principal, client, send, close, receive)
    finally:
        gateway.hub.quotas.disconnect(client)


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
