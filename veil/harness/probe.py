"""Matcher partitions seen from outside: a probe that publishes at a steady rate and reads a
subscription held by each partition (each delivery's latency), and the Spark Python workers that
run the matcher tasks, for the pipeline's fault tests and `bench.latency`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid

from veil.harness.broker import BrokerProcess
from veil.harness.spark import children
from veil.pipeline.partition import partition_of


class Probe:
    """Publishes {"run", "n"} `rate` times a second through `client` (a `VeilClient`) and reads a
    subscription held by each matcher partition, keeping when each publication was sent and when
    each delivery arrived."""

    def __init__(self, client, partitions: int, rate: float = 20.0) -> None:
        self.client = client
        self.rate = rate
        self.rid = uuid.uuid4().hex
        self.ids = _ids_by_partition(self.rid, partitions)
        self.published: list[float] = []  # by n: when it was sent
        self.received: dict[str, list[tuple[int, float]]] = {sub_id: [] for sub_id in self.ids}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        for sub_id in self.ids:
            await self.client.subscribe([{"key": "run", "val": self.rid, "op": "eq"}], sub_id)
        for sub_id in self.ids:
            self._tasks.append(asyncio.create_task(self._read(sub_id)))
        self._tasks.append(asyncio.create_task(self._publish()))

    async def _publish(self) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        while not self._stopping.is_set():
            n = len(self.published)
            self.published.append(time.time())
            await self.client.publish({"run": self.rid, "n": n})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), max(0.0, began + (n + 1) / self.rate - loop.time()))

    async def _read(self, sub_id: str) -> None:
        async with self.client.deliveries(sub_id) as stream:
            async for delivery in stream:
                self.received[sub_id].append((delivery.publication["n"], time.time()))

    async def stop(self, timeout: float = 60.0) -> None:
        """Stop publishing (a publish under way is waited for: cut off, it might or might not have
        been logged); wait until every subscription got everything published."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        await asyncio.wait_for(self._tasks[-1], timeout)  # and a publish that failed fails here
        sent = len(self.published)
        while time.monotonic() < deadline and any(len(got) < sent for got in self.received.values()):
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # a repeat would have come by now
        for task in self._tasks:
            task.cancel()

    def latencies(self) -> dict[str, list[tuple[float, float]]]:
        """For each probe subscription, (sent at, latency) of every publication, in the order
        received; asserts each arrived once, in order."""
        sent = len(self.published)
        out = {}
        for sub_id, got in self.received.items():
            numbers = [n for n, _ in got][:sent]
            if numbers != list(range(sent)):
                wrong = next(i for i, n in enumerate([*numbers, None]) if n != i)
                raise AssertionError(
                    f"{sub_id}: not every publication once, in order: {len(numbers)} of {sent}, "
                    f"from #{wrong}: {numbers[wrong : wrong + 5]}"
                )
            out[sub_id] = [(self.published[n], at - self.published[n]) for n, at in got[:sent]]
        return out


def _ids_by_partition(rid: str, partitions: int) -> list[str]:
    ids: dict[int, str] = {}
    n = 0
    while len(ids) < partitions:
        sub_id = f"probe-{n}-{rid}"
        ids.setdefault(partition_of(sub_id, partitions), sub_id)
        n += 1
    return [ids[part] for part in range(partitions)]


def cpu_seconds(pid: int) -> float:
    """Seconds of CPU process `pid` used so far (0 for one that is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def python_workers(broker: BrokerProcess) -> list[int]:
    """The broker's Spark Python workers: the children of its pipeline's pyspark daemon."""
    pipeline = broker.pipeline_pid()
    assert pipeline is not None
    daemons = [pid for pid in descendants(pipeline) if b"pyspark.daemon" in _cmdline(pid)]
    return [pid for daemon in daemons for pid in children(daemon)]


def matcher_workers(broker: BrokerProcess, expected: int, timeout: float = 30.0) -> list[int]:
    """The Python workers running matcher tasks: those that use CPU (a matcher task looks at the
    log's head every few milliseconds; an idle worker does nothing)."""
    deadline = time.monotonic() + timeout
    while True:
        workers = python_workers(broker)
        before = {pid: cpu_seconds(pid) for pid in workers}
        time.sleep(1.0)
        busy = [pid for pid in workers if cpu_seconds(pid) - before[pid] > 0.01]
        if len(busy) == expected or time.monotonic() > deadline:
            assert len(busy) == expected, (busy, workers)
            return busy


def descendants(pid: int) -> list[int]:
    """Every process below `pid`."""
    found = children(pid)
    return found + [grandchild for child in found for grandchild in descendants(child)]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""
