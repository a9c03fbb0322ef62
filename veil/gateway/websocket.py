"""WebSocket delivery (wss:// when TLS is configured): the handshake is the first message, then one
publication per text message; acknowledgements may come back as messages."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import WSMsgType, web

from veil.gateway.channel import cut_off_later
from veil.gateway.connection import MAX_LINE, serve_connection
from veil.gateway.context import GATEWAY, Gateway
from veil.gateway.cors import permitted, refused
from veil.gateway.errors import errors
from veil.gateway.http import certificate_of
from veil.protocol import ProtocolError

routes = web.RouteTableDef()
_refusing: set[asyncio.Future[None]] = set()  # closes under way (the loop keeps only weak references)


@routes.get("/{tail:.*}")
async def handle(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    origin = request.headers.get("Origin")
    config = gateway.config
    if origin is not None and not permitted(request, origin, frozenset(config.cors_origin), config.port):
        return refused(origin)  # (a page's upgrade comes with the browser's client certificate: `cors`)
    # uncompressed: permessage-deflate costs the gateway CPU for every delivery, and a compressed last
    # message before the close frame is lost by clients that inflate asynchronously (Node's WebSocket)
    ws = web.WebSocketResponse(heartbeat=30, max_msg_size=MAX_LINE, compress=False)
    await ws.prepare(request)
    # upgraded, but silent until its handshake message
    gateway.unproven.watch(request.protocol, lambda reason: _refuse(ws, request.transport, reason))
    transport = request.transport
    try:
        with gateway.health.connection():
            await _serve(gateway, ws, certificate_of(request), request.protocol, transport)
    finally:
        gateway.unproven.settle(request.protocol)
        cut_off_later(transport)
        await ws.close()
    return ws


def _refuse(ws: web.WebSocketResponse, transport: asyncio.BaseTransport | None, reason: str) -> None:
    """Close a connection that sent no handshake, with an error message saying why first."""

    async def refuse() -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1):  # a client that reads nothing gets no say in when it goes
                await ws.send_str(ProtocolError("handshake", reason).to_json().decode())
        if transport is not None:
            transport.close()

    task = asyncio.ensure_future(refuse())
    _refusing.add(task)
    task.add_done_callback(_refusing.discard)


def create_ws_app(gateway: Gateway) -> web.Application:
    app = web.Application(middlewares=[errors])
    app[GATEWAY] = gateway
    app.add_routes(routes)
    return app


async def _serve(
    gateway: Gateway, ws: web.WebSocketResponse, certificate: bytes | None, connection: object,
    transport: asyncio.Transport | None,
) -> None:  # fmt: skip
    async def send(frames: list[bytes]) -> None:
        for payload in frames:
            await ws.send_str(payload.decode())

    async def close(error: bytes | None) -> None:
        cut_off_later(transport)
        if error is not None and not ws.closed:
            with contextlib.suppress(ConnectionError):  # cut off meanwhile: whoever closes is not told so
                await ws.send_str(error.decode())
        await ws.close()

    timeout = gateway.config.read_timeout
    try:
        first = await ws.receive(timeout=timeout)
    except TimeoutError:
        await close(ProtocolError("handshake", f"no handshake within {timeout:g} s").to_json())
        return
    gateway.unproven.settle(connection)
    if first.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
        return

    async def receive() -> bytes | str | None:
        message = await ws.receive()
        return message.data if message.type in (WSMsgType.TEXT, WSMsgType.BINARY) else None

    await serve_connection(gateway, first.data, certificate, send, close, receive)
