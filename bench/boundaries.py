"""What the `rounds` trigger's epoch boundaries cost with a large state (`bench.latency --boundaries N`).

At each boundary every matcher task ends and the next epoch's start; a task that lands in another
Python worker than its partition's last one builds the partition's state from the store. The
broker holds `--boundary-subscriptions` SELIS boxes for a run that is never published (the state,
not the matching, is what is measured) and a probe (`veil.harness.probe`) publishes 20 times a
second with a subscription in each partition. A boundary is when the store's partition owners all
change (the new tasks took them); its gap is the worst probe latency of the publications sent
within two seconds of it. Rebuilds are read from the trace: a round whose state took over 100 ms
to check out (`read` → `state`) in its worker.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import glob
import os
import random
import tempfile
import threading
import time

import aiohttp
import numpy as np
import orjson

from bench.brokers import benched_broker
from bench.selis import box
from veil.client import VeilClient
from veil.harness import BrokerProcess
from veil.harness.memory import resident
from veil.harness.probe import Probe, python_workers
from veil.store import open_store

REBUILD_NS = 100_000_000  # a state checkout this long was a build, not a catch-up
NEAR = 2.0  # seconds around a boundary whose publications count towards its gap


def add_boundary_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--boundaries", type=int, default=0, help="measure N epoch boundaries instead (rounds)")
    parser.add_argument("--epoch-seconds", type=float, default=30.0, help="with --boundaries")
    parser.add_argument("--boundary-subscriptions", type=int, default=100_000, help="with --boundaries")


async def subscribe_many(broker: BrokerProcess, n: int, concurrency: int = 32) -> None:
    """`n` boxes of a run never published."""
    rng = random.Random(7)
    semaphore = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            body = orjson.dumps({"authHash": "bench", "data": box(rng, "never-published")})
            async with semaphore, http.post(broker.url + "/subscribe", data=body) as response:
                if response.status != 200:
                    raise RuntimeError(f"subscribe failed: {await response.text()}")

        for low in range(0, n, 1000):
            await asyncio.gather(*(one() for _ in range(min(1000, n - low))))


class Watcher:
    """From a thread: when the partitions' owners all changed (a new epoch's tasks started), and the
    Python workers' resident memory every 5 s."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.store = open_store(f"sqlite:///{broker.data_dir}/veil.db", create=False)
        self.boundaries: list[float] = []
        self.memory: list[tuple[float, list[int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        # the owners of the epoch in progress: a boundary is when none of them owns a partition any
        # more (the next epoch's tasks take their partitions a moment apart)
        owners = set(self.store.partition_owners().values())
        sampled = 0.0
        while not self._stop.wait(0.05):
            current = set(self.store.partition_owners().values())
            if current and current.isdisjoint(owners):
                self.boundaries.append(time.time())
                owners = current
            if time.monotonic() - sampled >= 5:
                sampled = time.monotonic()
                sizes = []
                for pid in python_workers(self.broker):
                    try:
                        sizes.append(resident(pid))
                    except (OSError, RuntimeError):
                        continue
                self.memory.append((time.time(), sorted(sizes, reverse=True)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.store.close()


def rebuilds(trace_dir: str) -> list[tuple[float, float, int]]:
    """(when, seconds, worker pid) of each state checkout that took over REBUILD_NS."""
    found = []
    for path in glob.glob(os.path.join(trace_dir, "*.trace")):
        pid = int(os.path.basename(path).split(".")[0])
        read: dict[tuple[str, str], int] = {}
        with open(path) as lines:
            for line in lines:
                stage, low, high, ns = line.split()
                if stage == "read":
                    read[low, high] = int(ns)
                elif stage == "state" and (low, high) in read:
                    took = int(ns) - read.pop((low, high))
                    if took > REBUILD_NS:
                        found.append((int(ns) / 1e9, took / 1e9, pid))
    return sorted(found)


async def epoch_boundaries(args: argparse.Namespace) -> None:
    trace_dir = tempfile.mkdtemp(prefix="veil-trace-")
    flags = ("--trigger", "rounds", "--epoch-seconds", str(args.epoch_seconds), *args.broker_args)
    with benched_broker(*flags, keep=args.keep, env={"VEIL_TRACE": trace_dir}) as broker:
        began = time.monotonic()
        await subscribe_many(broker, args.boundary_subscriptions)
        await asyncio.to_thread(broker.wait_processed, 1800)
        print(f"{args.boundary_subscriptions:,} subscriptions made and matched in {time.monotonic() - began:.0f} s")
        watcher = Watcher(broker)
        async with VeilClient(broker.url, auth_hash="probe", tcp_port=broker.tcp_port) as client:
            probe = Probe(client, 2)
            await probe.start()
            started = time.time()
            watcher.start()
            await asyncio.sleep((args.boundaries + 0.5) * args.epoch_seconds)
            await probe.stop(timeout=120)
            watcher.stop()
    report(probe, watcher, rebuilds(trace_dir), started, args)


def report(probe: Probe, watcher: Watcher, built: list[tuple[float, float, int]], started: float, args) -> None:
    latencies = probe.latencies()
    sent = np.array([at for at, _ in next(iter(latencies.values()))])
    print(
        f"\nEpoch boundaries of the rounds trigger: {args.boundary_subscriptions:,} subscriptions, "
        f"--epoch-seconds {args.epoch_seconds:g}, probe at 20 pub/s; {os.cpu_count()} cores"
    )
    print(f"{'boundary at s':>14} " + " ".join(f"{'worst ms p' + str(i):>14}" for i in range(len(latencies))))
    for at in watcher.boundaries:
        cells = []
        for values in latencies.values():
            near = [latency for sent_at, latency in values if at - NEAR <= sent_at <= at + NEAR]
            cells.append(f"{max(near, default=float('nan')) * 1000:>14.0f}")
        print(f"{at - started:>14.1f} " + " ".join(cells))
    print(f"\n{'with the boundaries':>20} {'p50 ms':>8} {'p99 ms':>8} {'worst ms':>9}")
    for i, values in enumerate(latencies.values()):
        ms = np.array([latency for _, latency in values]) * 1000
        print(
            f"{'partition ' + str(i):>20} {np.percentile(ms, 50):>8.0f} {np.percentile(ms, 99):>8.0f} {ms.max():>9.0f}"
        )
    built = [(at, took, pid) for at, took, pid in built if at >= started]
    print(f"\nState builds (a task in another worker than its partition's last) while measured: {len(built)}")
    if built:
        print(f"{'at s':>8} {'seconds':>8} {'worker':>8}")
    for at, took, pid in built:
        print(f"{at - started:>8.1f} {took:>8.2f} {pid:>8}")
    print("\nPython workers' resident memory, MB (largest first)")
    per_epoch = collections.OrderedDict()
    for at, sizes in watcher.memory:
        per_epoch.setdefault(int((at - started) // args.epoch_seconds), (at, sizes))
    for at, sizes in per_epoch.values():
        print(f"{at - started:>8.0f} s  " + " ".join(f"{size / 2**20:>6.0f}" for size in sizes))
    print(f"\n{len(sent)} publications over {sent[-1] - sent[0]:.0f} s, each delivered once, in order, to each probe")
