"""Load generators, run as separate processes: HTTP publishers and TCP subscribers.

The subscriber reads the line protocol in bulk and counts lines; at saturation it parses one
delivery per read for its publish timestamp, so that measuring does not cost more than being
measured, and at a constant rate (`every_line`) every delivery, so that the latencies are those of
deliveries rather than of reads. On multiplexed connections (`multiplexed`: a handshake naming many
subscriptions) every line is parsed: a line is one publication for the subscriptions it names, so it
counts as that many deliveries and gives one latency (that of all of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import random
import time
import urllib.parse
from dataclasses import dataclass, field

import orjson


@dataclass
class PublishResult:
    acked: int = 0
    refused: int = 0
    started: float = 0.0  # once every connection is open
    finished: float = 0.0
    cpu: float = 0.0  # seconds this process spent from `started` to `finished`
    kept: list[dict] = field(default_factory=list)  # the acknowledged publications, if asked to keep them


@dataclass
class SubscribeResult:
    lines: int = 0
    last: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu: float = 0.0  # seconds this process spent from its connections being open to `last`


def lat_lon(rng: random.Random, run: str) -> dict:
    return {"lat": rng.uniform(0, 100), "lon": rng.uniform(0, 100), "run": run, "t": time.time()}


class _Connection:
    """One keep-alive HTTP/1.1 connection that POSTs and reads the answer.

    Written here rather than taken from aiohttp's client because that client costs ~100 µs of CPU per
    request, a third of a core at 3,000 requests/s on the machine the broker runs on; this costs a
    fraction of it, as the seeds' C load generator (wrk2) did.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
        self.reader, self.writer, self.head = reader, writer, head

    @classmethod
    async def open(cls, url: str, path: str, content_type: str, auth_hash: str | None = None) -> _Connection:
        parts = urllib.parse.urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        head = f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: {content_type}\r\n"
        if auth_hash is not None:
            head += f"X-Auth-Hash: {auth_hash}\r\n"
        return cls(reader, writer, head.encode())

    async def post(self, body: bytes, headers: bytes = b"") -> tuple[int, float]:
        """The status, and the Retry-After seconds (0 when absent); `headers`: more header lines."""
        self.writer.write(b"%s%sContent-Length: %d\r\n\r\n%s" % (self.head, headers, len(body), body))
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        fields = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(b":") for line in header.split(b"\r\n")[1:] if line)
        }
        await self.reader.readexactly(int(fields.get(b"content-length", b"0")))
        return status, float(fields.get(b"retry-after", b"0"))

    def close(self) -> None:
        self.writer.close()


async def _publish(
    url: str, run: str, seconds: float, rate: float | None, connections: int, batch: int, seed: int, make,
    auth_hash: str | None, keep: bool, keyed: bool = False,
) -> PublishResult:  # fmt: skip
    rng = random.Random(seed)
    content_type = "application/x-ndjson" if batch > 1 else "application/json"
    opened = [await _Connection.open(url, "/publish", content_type, auth_hash) for _ in range(connections)]
    result = PublishResult(started=time.time())
    cpu_started = time.process_time()
    stop_at = time.monotonic() + seconds

    async def worker(number: int, connection: _Connection) -> None:
        sent = 0
        begin = time.monotonic()
        while time.monotonic() < stop_at:
            documents = [make(rng, run) for _ in range(batch)]
            body = b"\n".join(map(orjson.dumps, documents))
            # (a key of its own per request, as the client library sends: what remembering keys costs)
            key = b"Idempotency-Key: %s-%d-%d\r\n" % (run.encode(), number, sent) if keyed else b""
            status, retry_after = await connection.post(body, key)
            if status == 200:
                result.acked += batch
                if keep:
                    result.kept += documents
            else:
                result.refused += batch
                await asyncio.sleep(retry_after or 0.1)
            sent += 1
            if rate:
                await asyncio.sleep(max(0.0, begin + sent * batch * connections / rate - time.monotonic()))
        connection.close()

    await asyncio.gather(*(worker(number, connection) for number, connection in enumerate(opened)))
    result.finished = time.time()
    result.cpu = time.process_time() - cpu_started
    return result


async def _subscribe(
    port: int, handshakes: list[bytes], seconds: float, ready, idle: float, every_line: bool, multiplexed: bool
) -> SubscribeResult:
    """Read until `seconds` pass, or `idle` seconds pass without a delivery once deliveries began."""
    result = SubscribeResult()
    deadline = time.monotonic() + seconds
    connections = []
    for handshake in handshakes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
        writer.write(handshake + b"\n")
        await writer.drain()
        connections.append((reader, writer))
    ready.set()
    cpu_connected = cpu_last = time.process_time()

    async def read(reader: asyncio.StreamReader) -> None:
        nonlocal cpu_last
        carried = b""  # the start of a line the last read ended in
        while True:
            chunk = await reader.read(1 << 20)
            if not chunk:
                return
            now = time.time()
            lines = chunk.count(b"\n")
            if lines:
                cpu_last = time.process_time()
            if lines and multiplexed:
                result.last = now
                *complete, carried = (carried + chunk).split(b"\n")
                for line in complete:
                    doc = orjson.loads(line)
                    result.lines += len(doc["subscriptionIds"])
                    result.latencies.append(now - doc["publication"]["t"])
            elif lines and every_line:
                result.lines += lines
                result.last = now
                *complete, carried = (carried + chunk).split(b"\n")
                with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError):
                    result.latencies.extend(now - orjson.loads(line)["t"] for line in complete)
            elif lines:
                result.lines += lines
                result.last = now
                # one latency sample per read: the oldest line known to start in this chunk (a read
                # may begin inside a line), so that a backlog shows in the figures rather than hides
                begin = chunk.find(b"\n") + 1
                end = chunk.find(b"\n", begin)
                if end < 0:
                    end = begin - 1
                    begin = chunk.rfind(b"\n", 0, end) + 1
                with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError):
                    result.latencies.append(now - orjson.loads(chunk[begin:end])["t"])

    async def watch(reading: list[asyncio.Task[None]]) -> None:
        """End the reads at the deadline or once deliveries stop (a timer per read would cost the
        subscriber more than a read of a few lines does, at a hundred reads a second per connection)."""
        while (remaining := deadline - time.monotonic()) > 0 and not all(task.done() for task in reading):
            if result.lines and time.time() - result.last > idle:
                break
            await asyncio.sleep(min(remaining, idle / 4))
        for task in reading:
            task.cancel()

    reading = [asyncio.create_task(read(r)) for r, _ in connections]
    await watch(reading)
    for outcome in await asyncio.gather(*reading, return_exceptions=True):
        if not isinstance(outcome, asyncio.CancelledError | None):
            raise outcome
    for _, writer in connections:
        writer.close()
    result.cpu = cpu_last - cpu_connected
    return result


def _run_publisher(queue, *args) -> None:
    queue.put(asyncio.run(_publish(*args)))


def _run_subscriber(queue, ready, port, handshakes, seconds, idle, every_line, multiplexed) -> None:
    queue.put(asyncio.run(_subscribe(port, handshakes, seconds, ready, idle, every_line, multiplexed)))


class Processes:
    """Start load generator processes and collect what they report."""

    def __init__(self) -> None:
        self.context = multiprocessing.get_context("spawn")
        self.queue = self.context.Queue()
        self.processes: list[multiprocessing.Process] = []

    def subscribers(
        self,
        port: int,
        handshakes: list[bytes],
        seconds: float,
        processes: int = 1,
        idle: float = 10.0,
        every_line: bool = False,
        multiplexed: bool = False,
    ) -> None:
        events = []
        for i in range(processes):
            ready = self.context.Event()
            share = handshakes[i::processes]
            process = self.context.Process(
                target=_run_subscriber,
                args=(self.queue, ready, port, share, seconds, idle, every_line, multiplexed),
            )
            process.start()
            self.processes.append(process)
            events.append(ready)
        for ready in events:
            if not ready.wait(60):
                raise TimeoutError("subscribers did not connect")

    def publisher(
        self,
        url: str,
        run: str,
        seconds: float,
        rate: float | None,
        connections: int = 16,
        batch: int = 1,
        make=lat_lon,
        seed: int = 0,
        auth_hash: str | None = None,
        keep: bool = False,
        keyed: bool = False,
    ) -> None:
        """`make(rng, run)` makes each publication (a picklable callable: it runs in the process);
        `keep`: report the acknowledged publications, for a benchmark that checks every delivery they
        should have made arrived; `keyed`: each request with an Idempotency-Key of its own."""
        process = self.context.Process(
            target=_run_publisher,
            args=(self.queue, url, run, seconds, rate, connections, batch, seed, make, auth_hash, keep, keyed),
        )
        process.start()
        self.processes.append(process)

    def results(self) -> list:
        out = [self.queue.get() for _ in self.processes]
        for process in self.processes:
            process.join()
        self.processes = []
        return out

    def stop(self) -> None:
        """End the processes without their figures: a step that cannot be measured need not wait for
        its subscribers to time out."""
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.join()
        self.processes = []
