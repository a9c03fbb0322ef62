"""A delivery connection as the client sees it, over TCP lines or WebSocket messages: one
lifecycle (connect, send the handshake, read documents, send acknowledgements, close) and two
transports."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Protocol

import aiohttp

MAX_LINE = 16 * 1024 * 1024


class Channel(Protocol):
    async def send(self, document: bytes) -> None:
        """Send one document (a handshake or an acknowledgement)."""

    def documents(self) -> AsyncIterator[bytes]:
        """The broker's documents, until it closes the connection."""

    async def close(self) -> None: ...


class TcpChannel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, host: str, port: int, context: ssl.SSLContext | None) -> TcpChannel:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=context, limit=MAX_LINE, server_hostname=host if context else None
        )
        return cls(reader, writer)

    async def send(self, document: bytes) -> None:
        self._writer.write(document + b"\n")
        await self._writer.drain()

    async def documents(self) -> AsyncIterator[bytes]:
        while line := await self._reader.readline():
            yield line

    async def close(self) -> None:
        self._writer.close()


class WebSocketChannel:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws

    @classmethod
    async def open(
        cls, http: aiohttp.ClientSession, host: str, port: int, context: ssl.SSLContext | None
    ) -> WebSocketChannel:
        url = f"{'wss' if context else 'ws'}://{host}:{port}/"
        return cls(await http.ws_connect(url, max_msg_size=MAX_LINE, heartbeat=30))

    async def send(self, document: bytes) -> None:
        await self._ws.send_str(document.decode())

    async def documents(self) -> AsyncIterator[bytes]:
        async for message in self._ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                yield message.data.encode()
            elif message.type == aiohttp.WSMsgType.BINARY:
                yield message.data
            else:
                return

    async def close(self) -> None:
        await self._ws.close()
