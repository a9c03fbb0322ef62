"""WebSocket delivery (wss:// when TLS is configured): the handshake is the first message, then one
publication per text message; acknowledgements may come back as messages."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web

from veil.gateway.delivery import MAX_LINE, run_session
from veil.gateway.rest import ADMISSION, errors, identity_of
from veil.protocol import ProtocolError

if TYPE_CHECKING:
    from veil.gateway.server import Broker


def create_ws_app(broker: Broker) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(heartbeat=30, max_msg_size=MAX_LINE)
        await ws.prepare(request)
        broker.connections += 1
        # upgraded, but silent until its handshake message
        transport = request.transport
        broker.admission.admit(request.protocol, transport.close if transport is not None else lambda: None)
        try:
            await _serve(broker, ws, identity_of(request), request.protocol)
        finally:
            broker.admission.settle(request.protocol)
            broker.connections -= 1
            await ws.close()
        return ws

    app = web.Application(middlewares=[errors])
    app[ADMISSION] = broker.admission
    app.router.add_get("/{tail:.*}", handle)
    return app


async def _serve(broker: Broker, ws: web.WebSocketResponse, identity: str | None, connection: object) -> None:
    async def send(frames: list[bytes]) -> None:
        for payload in frames:
            await ws.send_str(payload.decode())

    async def close(error: bytes | None) -> None:
        if error is not None and not ws.closed:
            await ws.send_str(error.decode())
        await ws.close()

    timeout = broker.config.read_timeout
    try:
        first = await ws.receive(timeout=timeout)
    except TimeoutError:
        await close(ProtocolError("handshake", f"no handshake within {timeout:g} s").to_json())
        return
    broker.admission.settle(connection)
    if first.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
        return

    async def receive() -> bytes | str | None:
        message = await ws.receive()
        return message.data if message.type in (WSMsgType.TEXT, WSMsgType.BINARY) else None

    await run_session(broker, first.data, identity, send, close, receive)
