"""No matcher partition dark after a fault: under steady publishing, kill -9 of a Spark Python worker,
SIGSTOP of one for 15 s, and one core for two partitions, across epoch boundaries, in both
partition modes. A probe subscription per partition measures each partition's latency; every
publication arrives once, in order."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import time

import pytest

from tests.integration.helpers import client_for, run_id
from veil.harness import BrokerProcess
from veil.harness.spark import children
from veil.pipeline.partition import partition_of
from veil.pipeline.partition_task import BEAT, SILENT_MS
from veil.store import open_store

pytestmark = pytest.mark.slow

RATE = 20  # publications per second
DETECTION = SILENT_MS / 1000  # the detection timeout the README states
CALM = 3.0  # seconds the latency stays under where no fault is near (epoch boundaries included)


class Probe:
    """Publishes {"run", "n", "at"} RATE times a second and reads a subscription held by each matcher
    partition, keeping each delivery's n and latency."""

    def __init__(self, client, partitions: int) -> None:
        self.client = client
        self.rid = run_id()
        self.ids = _ids_by_partition(self.rid, partitions)
        self.published: list[float] = []  # by n: when it was sent
        self.received: dict[str, list[tuple[int, float]]] = {sub_id: [] for sub_id in self.ids}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for sub_id in self.ids:
            await self.client.subscribe([{"key": "run", "val": self.rid, "op": "eq"}], sub_id)
        for sub_id in self.ids:
            self._tasks.append(asyncio.create_task(self._read(sub_id)))
        self._tasks.append(asyncio.create_task(self._publish()))

    async def _publish(self) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        while True:
            n = len(self.published)
            self.published.append(time.time())
            await self.client.publish({"run": self.rid, "n": n})
            await asyncio.sleep(max(0.0, began + (n + 1) / RATE - loop.time()))

    async def _read(self, sub_id: str) -> None:
        async with self.client.deliveries(sub_id) as stream:
            async for delivery in stream:
                self.received[sub_id].append((delivery.publication["n"], time.time()))

    async def stop(self, timeout: float = 60.0) -> None:
        """Stop publishing; wait until every subscription got everything published."""
        self._tasks[-1].cancel()
        sent = len(self.published)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(len(got) < sent for got in self.received.values()):
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # a repeat would have come by now
        for task in self._tasks:
            task.cancel()

    def check(self, faults: list[tuple[float, float]]) -> dict[str, float]:
        """Every publication once, in order, to each probe; each probe's worst latency within twice the
        detection timeout, and within CALM where no fault window is near. Returns the worst latencies."""
        worst = {}
        sent = len(self.published)
        for sub_id, got in self.received.items():
            assert [n for n, _ in got][:sent] == list(range(sent)), f"{sub_id}: not every publication once, in order"
            latencies = [(self.published[n], at - self.published[n]) for n, at in got[:sent]]
            worst[sub_id] = max(latency for _, latency in latencies)
            assert worst[sub_id] <= 2 * DETECTION, (sub_id, worst[sub_id])
            calm = [latency for sent_at, latency in latencies if not _near(sent_at, faults)]
            assert max(calm) <= CALM, (sub_id, max(calm))
        return worst


def _ids_by_partition(rid: str, partitions: int) -> list[str]:
    ids: dict[int, str] = {}
    n = 0
    while len(ids) < partitions:
        sub_id = f"probe-{n}-{rid}"
        ids.setdefault(partition_of(sub_id, partitions), sub_id)
        n += 1
    return [ids[part] for part in range(partitions)]


def _near(at: float, faults: list[tuple[float, float]]) -> bool:
    return any(begin - CALM <= at <= end + 2 * DETECTION for begin, end in faults)


def _cpu(pid: int) -> float:
    """Seconds of CPU process `pid` used so far."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def matcher_workers(broker: BrokerProcess, expected: int, timeout: float = 30.0) -> list[int]:
    """The Spark Python workers running matcher tasks: the pyspark daemon's children that use CPU (a
    matcher task looks at the log's head every few milliseconds; an idle worker does nothing)."""
    deadline = time.monotonic() + timeout
    while True:
        pipeline = broker.pipeline_pid()
        assert pipeline is not None
        daemons = [pid for pid in _descendants(pipeline) if b"pyspark.daemon" in _cmdline(pid)]
        workers = [pid for daemon in daemons for pid in children(daemon)]
        before = {pid: _cpu(pid) for pid in workers}
        time.sleep(1.0)
        busy = [pid for pid in workers if _cpu(pid) - before[pid] > 0.01]
        if len(busy) == expected or time.monotonic() > deadline:
            assert len(busy) == expected, (busy, workers)
            return busy


def stop_outside_a_transaction(pid: int, database: str) -> None:
    """SIGSTOP process `pid` at a moment it holds no write transaction on the SQLite store: one
    stopped inside a commit would hold the store's one write lock, and every writer (the gateway's
    appends too) would wait for it, which is the store's nature, not what this test is about."""
    for _ in range(20):
        os.kill(pid, signal.SIGSTOP)
        try:
            with contextlib.closing(sqlite3.connect(database, timeout=0.5)) as db:
                db.execute("BEGIN IMMEDIATE")
                db.rollback()
            return
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.2)
    raise AssertionError("the worker always held the store's write lock")


def _each_partition_owned_apart(url: str, timeout: float) -> None:
    store = open_store(url, create=False)
    try:
        deadline = time.monotonic() + timeout
        while len(set(store.partition_owners().values())) < 2:
            assert time.monotonic() < deadline, "the stopped task did not take its partition back"
            time.sleep(0.1)
    finally:
        store.close()


def _descendants(pid: int) -> list[int]:
    found = children(pid)
    return found + [grandchild for child in found for grandchild in _descendants(child)]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _start(tmp_path, mode: str, *flags: str) -> BrokerProcess:
    return BrokerProcess(
        str(tmp_path), "--partitions", "2", "--partition-mode", mode, "--epoch-seconds", "20", *flags
    ).start()


@pytest.mark.parametrize("mode", ["subscriptions", "publications"])
async def test_no_partition_dark_after_a_worker_is_killed_or_stopped(tmp_path, mode):
    broker = _start(tmp_path, mode)
    try:
        async with client_for(broker, "ivy") as client:
            probe = Probe(client, 2)
            await probe.start()
            await asyncio.sleep(3)
            faults = []
            killed = (await asyncio.to_thread(matcher_workers, broker, 2))[0]
            faults.append((time.time(), time.time()))
            os.kill(killed, signal.SIGKILL)  # Spark retries its task in a new worker
            await asyncio.sleep(8)
            stopped = (await asyncio.to_thread(matcher_workers, broker, 2))[0]
            began = time.time()
            await asyncio.to_thread(stop_outside_a_transaction, stopped, f"{tmp_path}/veil.db")
            await asyncio.sleep(15)
            os.kill(stopped, signal.SIGCONT)  # and taken back within a look around
            faults.append((began, time.time()))
            # within a look around (or, if the pause outlasted the epoch, once the next one starts)
            await asyncio.to_thread(_each_partition_owned_apart, f"sqlite:///{tmp_path}/veil.db", 2 * BEAT + 3)
            workers = await asyncio.to_thread(matcher_workers, broker, 2)
            before = [_cpu(pid) for pid in workers]
            await asyncio.sleep(5)
            used = [_cpu(pid) - was for pid, was in zip(workers, before, strict=True)]
            assert 0.4 <= used[0] / sum(used) <= 0.6, f"CPU split {used}"
            await asyncio.sleep(3)  # 40 s in all: the run crosses an epoch boundary or two
            await probe.stop()
            probe.check(faults)
        with open(broker.log_path, errors="replace") as log:
            text = log.read()
        assert "aborting job" not in text and "matching query failed" not in text
    finally:
        broker.close()


@pytest.mark.parametrize("mode", ["subscriptions", "publications"])
async def test_one_core_runs_both_partitions_across_an_epoch_boundary(tmp_path, mode):
    broker = _start(tmp_path, mode, "--spark-master", "local[1,4]")
    try:
        async with client_for(broker, "ivy") as client:
            probe = Probe(client, 2)
            await probe.start()
            await asyncio.sleep(25)  # epochs of 20 s: one boundary at least
            await probe.stop()
            probe.check([])
        with open(broker.log_path, errors="replace") as log:
            assert "adopts partition" not in log.read()  # one task ran both from the start
    finally:
        broker.close()
