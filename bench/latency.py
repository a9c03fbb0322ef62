"""Where a publication's time goes, publish → deliver, beside the floor Spark itself sets.

The SELIS workload (`bench.selis`: lat/lon boxes, each matching a quarter of the publications, all
connected over TCP from a separate process; a separate publisher over 16 HTTP connections) at
constant rates. The broker runs with VEIL_TRACE (`veil.monitoring.trace`): its processes note when
each range of log offsets reaches each hand-over, and every publication's time at every stage is the
first note covering it:

    received   the gateway has the publish request (parsed)
    committed  the group commit holding it is durable
    seen       a matcher partition's round took a range of the log holding it
    read       the round read its range from the log
    state      the round had the partition's state as of the range's start
    matched    the round core finished the range
    recorded   the round's deliveries were committed with the partition's progress
    notified   the gateway read the feed entry holding it
    written    its first delivery was written to a subscriber's connection

The end-to-end column is the subscriber's own: publisher's send → line received. Before any load,
the first publication after the broker reported ready is timed on its own (publish → delivery, the
subscription made just before it): what the first client of a freshly started broker sees. Beside
it, `bench.spark_floor`: the least a micro-batch pipeline of the same shape takes on this machine
(a rate-like source → mapInArrow → foreachBatch, trigger `--trigger-ms`), with Spark's split of its
micro-batches (`durationMs`), run after the brokers at the same rates (alone on the machine, as the
brokers were). Each of the pipeline's triggers (`--triggers`) is measured with a broker of its own,
one after the other: `rounds` runs no micro-batch per publication (`veil.pipeline.partition_task`),
`micro-batch` is the floor's shape with Veil's work in it.

`--boundaries N` measures instead what the `rounds` trigger's epoch boundaries cost: a broker with
`--epoch-seconds` (30) and `--boundary-subscriptions` (100,000) subscriptions that match nothing (the
state each matcher partition builds and keeps), a probe publishing 20 times a second with a
subscription in each partition, for N boundaries and a half epoch more. It prints the worst latency
around each boundary, each state rebuild (a partition whose task landed in another Python worker,
read from the trace), p50/p99 with the boundaries included, and the Python workers' resident memory
over time.

    python -m bench.latency [--rates 200,1000,2000] [--subscriptions 128] [--seconds 10]
                            [--triggers rounds,micro-batch] [--plot docs/performance/latency.png]
    python -m bench.latency --boundaries 10 [--epoch-seconds 30] [--boundary-subscriptions 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import glob
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np
import orjson

from bench.boundaries import add_boundary_arguments, epoch_boundaries
from bench.brokers import add_broker_arguments, add_trigger_argument, benched_broker
from bench.loadgen import Processes
from bench.report import add_plot_argument, save_figure
from bench.selis import box
from veil.client import VeilClient
from veil.harness import BrokerProcess

STAGES = ["received", "committed", "seen", "read", "state", "matched", "recorded", "notified", "written"]
PHASES = ["latestOffset", "walCommit", "queryPlanning", "getBatch", "addBatch", "commitOffsets", "triggerExecution"]


async def run_rate(broker: BrokerProcess, subscriptions: int, rate: float, seconds: float) -> dict:
    rng = random.Random(int(rate))
    run = f"latency-{rate:.0f}-{time.time_ns()}"
    async with VeilClient(broker.url, auth_hash="bench") as client:
        sub_ids = [(await client.subscribe(box(rng, run)))["subscriptionId"] for _ in range(subscriptions)]
    handshakes = [orjson.dumps({"authHash": "bench", "subscriptionId": s}) for s in sub_ids]
    processes = Processes()
    processes.subscribers(broker.tcp_port, handshakes, seconds + 30, idle=5.0, every_line=True)
    await asyncio.sleep(1.0)
    processes.publisher(broker.url, run, seconds, rate, seed=int(rate))
    published, listened = sorted(processes.results(), key=lambda r: hasattr(r, "lines"))
    async with VeilClient(broker.url, auth_hash="bench") as client:
        for sub_id in sub_ids:
            await client.unsubscribe(sub_id)
    return {
        "rate": rate,
        "held": published.acked / (published.finished - published.started),
        "refused": published.refused,
        "window": (published.started * 1e9, published.finished * 1e9),
        "e2e": np.array(listened.latencies),
    }


async def first_delivery(broker: BrokerProcess) -> float:
    """Seconds from publishing to receiving the first publication of a broker that just became ready."""
    async with VeilClient(broker.url, auth_hash="bench") as client:
        sub_id = (await client.subscribe([{"key": "first", "val": 1, "op": "eq"}]))["subscriptionId"]
        async with client.deliveries(sub_id) as stream:
            await asyncio.sleep(0.2)  # the delivery connection is open and the session attached
            sent = time.monotonic()
            await client.publish({"first": 1})
            await asyncio.wait_for(anext(aiter(stream)), 60)
            return time.monotonic() - sent


def read_trace(directory: str) -> dict[str, np.ndarray]:
    """stage → array of (low, high, ns) notes, from every process's file."""
    notes: dict[str, list[tuple[int, int, int]]] = collections.defaultdict(list)
    for path in glob.glob(os.path.join(directory, "*.trace")):
        with open(path) as lines:
            for line in lines:
                stage, low, high, at = line.split()
                notes[stage].append((int(low), int(high), int(at)))
    return {stage: np.array(rows, np.int64).reshape(-1, 3) for stage, rows in notes.items()}


def stage_times(notes: dict[str, np.ndarray], window: tuple[float, float]) -> dict[str, np.ndarray]:
    """stage → ns at which each publication received in `window` first reached it (NaN: never)."""
    received = notes["received"]
    received = received[(received[:, 2] >= window[0]) & (received[:, 2] <= window[1])]
    first, last = int(received[:, 0].min()) + 1, int(received[:, 1].max())
    times = {}
    for stage in STAGES:
        at = np.full(last - first + 1, np.nan)
        rows = notes.get(stage, np.zeros((0, 3), np.int64))
        for low, high, ns in rows[np.argsort(-rows[:, 2])]:  # latest first: the earliest note wins
            lo, hi = max(int(low) + 1, first), min(int(high), last)
            if lo <= hi:
                at[lo - first : hi - first + 1] = ns
        times[stage] = at
    mine = np.zeros(last - first + 1, bool)  # offsets in the window that are publications of this run
    for low, high, _ in received:
        mine[int(low) + 1 - first : int(high) - first + 1] = True
    return {stage: at[mine] for stage, at in times.items()}


def breakdown(times: dict[str, np.ndarray]) -> list[tuple[str, float, float]]:
    """(stage → next stage, p50 ms, p99 ms) over the publications that reached both."""
    rows = []
    for before, after in itertools.pairwise(STAGES):
        spent = (times[after] - times[before]) / 1e6
        spent = spent[~np.isnan(spent)]
        rows.append((f"{before} → {after}", *_percentiles(spent)))
    total = (times["written"] - times["received"]) / 1e6
    rows.append(("received → written", *_percentiles(total[~np.isnan(total)])))
    return rows


def _percentiles(values: np.ndarray) -> tuple[float, float]:
    if not len(values):
        return float("nan"), float("nan")
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def floor(rate: float, seconds: float, trigger_ms: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "bench.spark_floor", "--rate", str(rate), "--seconds", str(seconds),
         "--trigger-ms", str(trigger_ms)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_report(results: dict[str, list[dict]], floors: list[dict], subscriptions: int) -> None:
    width = 15
    first = next(iter(results.values()))
    print(f"\nPublish → deliver, SELIS workload, {subscriptions} subscriptions; {os.cpu_count()} cores; ms p50 / p99")
    header = f"{'stage':>26} " + " ".join(f"{r['rate']:>{width - 6}.0f} pub/s" for r in first)
    for trigger, rows in results.items():
        print(f"\n--trigger {trigger}")
        print(header)
        print("-" * len(header))
        for i, (name, _, _) in enumerate(rows[0]["stages"]):
            cells = [f"{r['stages'][i][1]:>6.0f} / {r['stages'][i][2]:<6.0f}" for r in rows]
            print(f"{name:>26} " + " ".join(f"{c:>{width}}" for c in cells))
        e2e = [f"{np.percentile(r['e2e'], 50) * 1000:>6.0f} / {np.percentile(r['e2e'], 99) * 1000:<6.0f}" for r in rows]
        print(f"{'end to end (subscriber)':>26} " + " ".join(f"{c:>{width}}" for c in e2e))
        print(f"{'publications/s held':>26} " + " ".join(f"{r['held']:>{width}.0f}" for r in rows))
        print(f"{'refused (503, retried)':>26} " + " ".join(f"{r['refused']:>{width}}" for r in rows))
    print("\nSide by side, end to end (subscriber)")
    for trigger, rows in results.items():
        e2e = [f"{np.percentile(r['e2e'], 50) * 1000:>6.0f} / {np.percentile(r['e2e'], 99) * 1000:<6.0f}" for r in rows]
        print(f"{trigger:>26} " + " ".join(f"{c:>{width}}" for c in e2e))
    cells = [f"{f['p50'] * 1000:>6.0f} / {f['p99'] * 1000:<6.0f}" for f in floors]
    print(f"{'micro-batch floor':>26} " + " ".join(f"{c:>{width}}" for c in cells))
    print("\nSpark's split of the floor pipeline's micro-batches, median ms")
    for phase in PHASES:
        cells = [f"{f['phases'].get(phase, float('nan')):>6.0f}" for f in floors]
        print(f"{phase:>26} " + " ".join(f"{c:>{width}}" for c in cells))


def plot(results: list[dict], floors: list[dict], path: str) -> None:
    """The stages of one trigger's runs, with the floor's p50."""

    def draw(axes: list) -> None:
        (ax,) = axes
        labels = [f"{r['rate']:.0f} pub/s" for r in results]
        left = np.zeros(len(results))
        colours = iter(__import__("matplotlib").colormaps["tab10"].colors)
        for i, (name, _, _) in enumerate(results[0]["stages"][:-1]):
            widths = np.array([max(0.0, r["stages"][i][1]) for r in results])
            ax.barh(labels, widths, left=left, label=name.split(" → ")[1], color=next(colours))
            left += np.nan_to_num(widths)
        ax.plot([f["p50"] * 1000 for f in floors], labels, "k|", markersize=30, markeredgewidth=3,
                label="micro-batch floor p50")  # fmt: skip
        ax.set_xlim(0, 1.6 * max(left.max(), *(f["p50"] * 1000 for f in floors)))
        ax.set(xlabel="ms, median per stage (stacked)", title="Publish → deliver, by stage")

    save_figure(path, draw, legend={"loc": "center right", "fontsize": "small"})


async def main_async(args: argparse.Namespace) -> None:
    if args.boundaries:
        await epoch_boundaries(args)
        return
    results: dict[str, list[dict]] = {}
    firsts = {}
    for trigger in args.triggers:
        trace_dir = tempfile.mkdtemp(prefix="veil-trace-")
        flags = ("--trigger", trigger, *args.broker_args)
        with benched_broker(*flags, keep=args.keep, env={"VEIL_TRACE": trace_dir}) as broker:
            firsts[trigger] = await first_delivery(broker)
            await run_rate(broker, 8, 100, 3)  # warm-up: JIT, Python workers, caches
            results[trigger] = [await run_rate(broker, args.subscriptions, rate, args.seconds) for rate in args.rates]
            await asyncio.sleep(1.0)
        notes = read_trace(trace_dir)
        for result in results[trigger]:
            result["stages"] = breakdown(stage_times(notes, result["window"]))
    floors = [floor(rate, args.floor_seconds, args.trigger_ms) for rate in args.rates]
    print_report(results, floors, args.subscriptions)
    for trigger, first in firsts.items():
        print(f"\nfirst delivery after /ready, --trigger {trigger}: {first * 1000:.0f} ms from its publish")
    plot(next(iter(results.values())), floors, args.plot)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=lambda text: [float(x) for x in text.split(",")], default=[200, 1000, 2000])
    parser.add_argument("--subscriptions", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--floor-seconds", type=float, default=15.0)
    parser.add_argument("--trigger-ms", type=int, default=50, help="the floor pipeline's trigger (as the broker's)")
    add_trigger_argument(parser)
    add_boundary_arguments(parser)
    add_plot_argument(parser, "latency")
    add_broker_arguments(parser)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
