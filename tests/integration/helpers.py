"""Small helpers for talking to a broker the way clients in the wild do."""

from __future__ import annotations

import asyncio
import uuid

import orjson

from veil.client import Delivery, DeliveryStream

DELIVERY_TIMEOUT = 60.0


def run_id() -> str:
    """Tests share a broker; each tags its publications and subscriptions with its own run id."""
    return uuid.uuid4().hex


async def take(stream: DeliveryStream, n: int, timeout: float = DELIVERY_TIMEOUT) -> list[Delivery]:
    out = []
    async with asyncio.timeout(timeout):
        while len(out) < n:
            out.append(await stream.__anext__())
    return out


async def nothing_more(stream: DeliveryStream, wait: float = 1.5) -> None:
    try:
        async with asyncio.timeout(wait):
            extra = await stream.__anext__()
    except TimeoutError:
        return
    raise AssertionError(f"unexpected delivery {extra}")


class LineConnection:
    """A raw TCP line-protocol subscriber (what `curl`/`nc` users and the Java client do)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int, handshake: dict | bytes, ssl=None) -> LineConnection:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ssl, server_hostname="localhost" if ssl else None, limit=1 << 22
        )
        line = handshake if isinstance(handshake, bytes) else orjson.dumps(handshake) + b"\n"
        writer.write(line)
        await writer.drain()
        return cls(reader, writer)

    async def line(self, timeout: float = DELIVERY_TIMEOUT) -> dict | None:
        raw = await asyncio.wait_for(self.reader.readline(), timeout)
        return orjson.loads(raw) if raw else None

    async def silent(self, wait: float = 1.5) -> bool:
        try:
            raw = await asyncio.wait_for(self.reader.readline(), wait)
        except TimeoutError:
            return True
        return raw == b""

    def close(self) -> None:
        self.writer.close()
