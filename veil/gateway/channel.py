"""What a delivery connection looks like to the code that serves it, whatever carries it (TCP lines,
WebSocket messages): how to send, close and receive, and the loop that reads the client while the
broker pushes to it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from veil.protocol import ProtocolError

Send = Callable[[list[bytes]], Awaitable[None]]
"""Send frames (delivery lines or messages) in order, waiting while the client is slow to take them."""
Close = Callable[[bytes | None], Coroutine[Any, Any, None]]
"""Close the connection, after sending an error document when one is given."""
Receive = Callable[[], Coroutine[Any, Any, bytes | str | None]]
"""The client's next message, or None when the client is done."""

CLOSE_WAIT = 5.0  # seconds a closed connection's client has to take more of what was written before it is cut
# what a client is told when the gateway fails serving it (a store error): its own mistakes it is told
# as such, this one only that reconnecting later is worth it
FAILED = ProtocolError("", "the broker could not serve this connection (its store failed); reconnect later", 503)


def cut_off_later(transport: asyncio.BaseTransport | None) -> None:
    """A closing connection's client that reads nothing gets no say in when it goes: its transport is
    aborted once CLOSE_WAIT passes without the client taking any of what waits to be written to it (a
    graceful close waits for the client, and so does a push: aborted, it fails, and the connection
    ends and gives back what it holds). A client that reads, however slowly, gets its last lines."""
    if transport is not None:
        pending = transport.get_write_buffer_size() if isinstance(transport, asyncio.WriteTransport) else 0
        asyncio.get_running_loop().call_later(CLOSE_WAIT, _cut_off, transport, pending)


def _cut_off(transport: asyncio.BaseTransport, pending_then: int) -> None:
    if not isinstance(transport, asyncio.WriteTransport):
        return
    try:
        pending = transport.get_write_buffer_size()
        if 0 < pending < pending_then:
            asyncio.get_running_loop().call_later(CLOSE_WAIT, _cut_off, transport, pending)
        else:
            transport.abort()
    except (AttributeError, RuntimeError):
        pass  # closed meanwhile: asyncio's and uvloop's transports refuse to abort then


def failure_line(exc: Exception, failures: tuple[type[Exception], ...]) -> bytes | None:
    """The line a connection that `exc` ends closes with when it is one of the store's `failures`;
    None for anything else (the client gone, or a fault of the gateway's own, which is raised)."""
    return FAILED.to_json() if isinstance(exc, failures) else None


async def read_while(work: asyncio.Task[None], receive: Receive, on_message: Callable[[bytes | str], None]) -> None:
    """Hand the client's messages to `on_message` while `work` runs; return when `work` ends or the
    client is done."""
    while not work.done():
        reading = asyncio.create_task(receive())
        done, _ = await asyncio.wait({reading, work}, return_when=asyncio.FIRST_COMPLETED)
        if reading not in done:
            reading.cancel()
            return
        message = reading.result()
        if message is None:
            return
        on_message(message)


class EdgeChannels:
    """The open channels of each announcement, so that revoking it closes them all."""

    def __init__(self) -> None:
        self._open: dict[str, dict[int, Close]] = {}

    def add(self, announcement_id: str, key: int, close: Close) -> None:
        self._open.setdefault(announcement_id, {})[key] = close

    def discard(self, announcement_id: str, key: int) -> None:
        channels = self._open.get(announcement_id)
        if channels is not None:
            channels.pop(key, None)
            if not channels:
                del self._open[announcement_id]

    async def close_all(self, announcement_id: str, reason: bytes) -> None:
        for close in list(self._open.pop(announcement_id, {}).values()):
            await close(reason)
