"""Small helpers for talking to a broker the way clients in the wild do."""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson

from veil.client import Delivery, DeliveryStream, VeilClient
from veil.harness import BrokerProcess

DELIVERY_TIMEOUT = 60.0


def client_for(broker: BrokerProcess, auth_hash: str) -> VeilClient:
    """A client of one broker (or gateway), its delivery ports included."""
    return VeilClient(broker.url, auth_hash=auth_hash, tcp_port=broker.tcp_port, ws_port=broker.ws_port)


def serving(broker: BrokerProcess, timeout: float = 60.0) -> BrokerProcess:
    """Until the broker answers /health: what a gateway without a pipeline (`--role gateway`) waits
    for, since it is never ready alone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert broker.process is not None and broker.process.poll() is None, broker.tail()
        try:
            broker.health()
            return broker
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(broker.tail())


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


class SteadyPublisher:
    """Publishes {"run", "n", "even"} about 100 times a second through `client` (which the test may
    switch, as a load balancer moves publishers), keeping the n of every publication it tried and of
    every acknowledged one (what was tried and not acknowledged may or may not have been stored)."""

    def __init__(self, client, rid: str) -> None:
        self.client = client
        self.rid = rid
        self.attempted: list[int] = []
        self.acknowledged: list[int] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        import aiohttp

        from veil.client import VeilError

        n = 0
        while True:
            self.attempted.append(n)
            try:
                # once each: what was tried and not acknowledged is the test's to tell apart
                await self.client.publish({"run": self.rid, "n": n, "even": n % 2 == 0}, retry_for=0)
                self.acknowledged.append(n)
            except (aiohttp.ClientError, VeilError, OSError):
                pass
            n += 1
            await asyncio.sleep(0.01)

    async def until(self, count: int, timeout: float = 60.0) -> None:
        """Until `count` publications were acknowledged in all (a loaded machine acknowledges fewer per
        second, and what the test does next must still land in the middle of a stream)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while len(self.acknowledged) < count and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assert len(self.acknowledged) >= count, "the publisher was not publishing at a steady rate"

    def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()


class Consumers:
    """Reads each stream into a list of the n it delivered."""

    def __init__(self, streams: dict[str, DeliveryStream]) -> None:
        self.streams = streams
        self.received: dict[str, list[int]] = {sub_id: [] for sub_id in streams}
        self.dropped_duplicates = 0  # by streams replaced with `move`
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for stream in self.streams.values():
            await stream.__aenter__()
        self._tasks = [asyncio.create_task(self._consume(sub_id)) for sub_id in self.streams]

    async def _consume(self, sub_id: str) -> None:
        async for delivery in self.streams[sub_id]:
            self.received[sub_id].append(delivery.publication["n"])

    async def move(self, sub_id: str, stream: DeliveryStream) -> None:
        """Go on reading a subscription from another stream (another gateway's), from where it was."""
        index = list(self.streams).index(sub_id)
        self._tasks[index].cancel()
        await self.streams[sub_id].aclose()
        self.dropped_duplicates += self.streams[sub_id].dropped_duplicates
        self.streams[sub_id] = stream
        await stream.__aenter__()
        self._tasks[index] = asyncio.create_task(self._consume(sub_id))

    async def expect_exactly_once_in_order(
        self, expected: dict[str, list[int]], possible: dict[str, list[int]], timeout: float = 60.0
    ) -> None:
        """Every expected n (acknowledged and matching) delivered once, in publish order; nothing else
        but what is possible (published, acknowledged or not, and matching); and no delivery the
        broker sent twice, not even one the client dropped as a repeat."""
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline and any(
            not set(expected[s]) <= set(self.received[s]) for s in self.streams
        ):
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # a delivery that should not come has had time to
        for sub_id, got in self.received.items():
            assert set(expected[sub_id]) <= set(got), f"lost {sorted(set(expected[sub_id]) - set(got))[:10]}"
            assert set(got) <= set(possible[sub_id]), f"not matching: {sorted(set(got) - set(possible[sub_id]))[:10]}"
            assert len(got) == len(set(got)), "a publication was delivered twice"
            assert got == sorted(got), "publish order was not kept"
        resent = self.dropped_duplicates + sum(stream.dropped_duplicates for stream in self.streams.values())
        assert resent == 0, f"the broker re-sent {resent} deliveries the client had received"

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for stream in self.streams.values():
            await stream.aclose()
