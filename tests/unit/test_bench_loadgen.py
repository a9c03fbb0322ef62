"""The benchmarks' subscriber: it reads every connection until its deadline, or until deliveries
stop for its idle time, and times each line against the publication's own send time."""

from __future__ import annotations

import asyncio
import threading
import time

import orjson

from bench.loadgen import _subscribe


async def serving(lines_per_connection: int, gap: float) -> tuple[asyncio.Server, int]:
    """A server that answers each handshake with lines stamped at their sending, `gap` apart."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        for n in range(lines_per_connection):
            writer.write(orjson.dumps({"n": n, "t": time.time()}) + b"\n")
            await writer.drain()
            await asyncio.sleep(gap)
        await reader.read()  # open and silent until the subscriber leaves (its idle time ends it)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_it_reads_every_line_of_every_connection_and_stops_once_they_go_quiet():
    server, port = await serving(lines_per_connection=20, gap=0.005)
    async with server:
        began = time.monotonic()
        result = await _subscribe(port, [b"{}"] * 3, 30.0, threading.Event(), 0.4, True, False)
        assert result.lines == 60 and len(result.latencies) == 60
        assert all(0 <= latency < 5 for latency in result.latencies)
        assert time.monotonic() - began < 5  # the idle time ended it, not the deadline


async def test_connections_that_never_deliver_end_at_the_deadline():
    server, port = await serving(lines_per_connection=0, gap=0)
    async with server:
        began = time.monotonic()
        result = await _subscribe(port, [b"{}"] * 2, 0.6, threading.Event(), 10.0, True, False)
        assert result.lines == 0
        assert 0.5 < time.monotonic() - began < 5
