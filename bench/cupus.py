"""CUPUS Fig. 21 (S4 §6): publish → delivery delay with 1..20,000 and then 100,000 subscriptions.

Sensor readings (CO, O3, NO2, UFP, lat/lon, timestamp) from a fixed pool of 4,000; a subscription is
1-3 constraints of a random reading with random <, <=, >, >=, one in five also with a 1-6 h time
window, so about a quarter of all subscriptions match each reading. Subscriptions are added
cumulatively to one broker. For each size a separate publisher process sends readings at a
constant rate over 16 HTTP connections and separate subscriber processes hold the delivery
connections (TCP line protocol, resuming after the current log head so each size measures only its
own publications): up to `--connect` of them, since one process may hold at most 20,000 descriptors
here; subscriptions not connected are queued durably, as for any offline subscriber. With
`--multiplex N` the subscriptions share connections, N on each (`subscriptionIds`), held by
`--multiplex-processes` processes: a reading comes once per connection with the ids it is for, and
its delay is counted once per line (the same for every id on it).

A step publishes only once every delivery connection is attached and no session reads a backlog; a
step whose sessions do not get there within two minutes is reported as not caught up, unmeasured,
and ends the run. A step's CPU counts from then to the first of half-second snapshots after its last
delivery, and its shares are over that same span: the subscribers wait 30 s after the last delivery
to be sure it was the last, and what the broker does meanwhile is not the step's. The load
generators count their own, from their connections being open to their last publication or delivery.
With `--trace` the broker runs with VEIL_TRACE and each step's publications are followed stage by
stage, as in `bench.latency`.

Beside the end-to-end figures, the index and a naive loop over every subscription (the seed
matcher's approach) are timed on one core in this process, on the same subscriptions and readings.
CUPUS itself cannot be run here: its published delay (S4 Fig. 21) and a peer run of its matcher are
printed apart, as quoted figures (sources in docs/performance/peers.md).

At 100,000 subscriptions a reading matches ~23,000 of them: 1,000 readings/s would be 230 M
deliveries in a 10 s step, so that step offers its own rate (`--step-rate 100000=25`).

    python -m bench.cupus [--subscriptions 1,10,100,1000,5000,10000,20000,100000] [--rate 1000]
                          [--step-rate 100000=25] [--seconds 10] [--multiplex 1000] [--trace]
                          [--plot docs/performance/cupus.png]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import aiohttp
import orjson

from bench import cpu
from bench.brokers import add_broker_arguments, benched_broker, subscription_counts
from bench.latency import breakdown, read_trace, stage_times
from bench.loadgen import Processes
from bench.report import add_plot_argument, draw_quoted, print_quoted, print_table, save_figure
from bench.selis import finished_matching, percentile
from bench.workloads import sensor_publication, sensor_subscription
from veil.harness import BrokerProcess
from veil.matching import Predicate, SubscriptionIndex
from veil.matching.predicates import matches
from veil.protocol import flatten
from veil.protocol.subscriptions import parse_subscribe

CUPUS_DELAY = {20_000: 1.0}  # s, average publish → delivery, quoted: S4 §6 Fig. 21 (config5 on VM-4)
CUPUS_PEER = {1_000: 1691, 10_000: 124, 20_000: 42, 100_000: 8.4}  # pub/s matched, quoted: peer run of its matcher
PER_SUBSCRIBER_PROCESS = 5000
CATCH_UP = 120.0  # seconds a step's delivery sessions get to attach and read their backlogs
SNAPSHOT_EVERY = 0.5  # seconds between CPU snapshots: how far past the last delivery a step's CPU may run


class Subscriptions:
    """The subscriptions registered so far, over HTTP, mirrored here for the one-core comparison."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ids: list[str] = []
        self.predicates: list[list[Predicate]] = []
        self.index = SubscriptionIndex()
        self.rng = random.Random(21)

    async def grow_to(self, n: int, concurrency: int = 16) -> None:
        wanted = [sensor_subscription(self.rng) for _ in range(n - len(self.ids))]
        semaphore = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession() as http:

            async def register(data: list[dict]) -> tuple[str, list[Predicate]]:
                body = orjson.dumps({"authHash": "bench", "data": data})
                async with semaphore, http.post(self.url + "/subscribe", data=body) as response:
                    answer = await response.json(content_type=None)
                    if response.status != 200:
                        raise RuntimeError(f"subscribe failed: {answer}")
                return answer["subscriptionId"], parse_subscribe(body).predicates

            for low in range(0, len(wanted), 1000):
                for sub_id, predicates in await asyncio.gather(*map(register, wanted[low : low + 1000])):
                    self.ids.append(sub_id)
                    self.predicates.append(predicates)
                    self.index.add(sub_id, predicates)


def one_core_rates(subs: Subscriptions, budget: float = 2.0) -> tuple[float, float]:
    """Publications/s of the index (in batches of 256) and of the naive loop, on one core."""
    rng = random.Random(7)
    readings = [flatten(sensor_publication(rng, "kernel")) for _ in range(4096)]
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < budget and done < len(readings):
        subs.index.match_pairs(readings[done : done + 256])
        done += 256
    indexed = done / (time.perf_counter() - began)
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < budget:
        for predicates in subs.predicates:
            matches(predicates, readings[done % len(readings)])
        done += 1
    return indexed, done / (time.perf_counter() - began)


async def sessions_caught_up(broker: BrokerProcess, connected: int, timeout: float) -> bool:
    """Whether every delivery connection's subscriptions got attached, with none reading its backlog
    any more, within `timeout`: a subscription just connected reads one, and while most do the broker
    refuses publishes (delivery as a whole is behind), which would count against the step rather than
    show what it holds. (A multiplexed connection is attached once all its subscriptions are
    admitted, seconds after the connection opens.)"""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            async with http.get(broker.url + "/health") as response:
                attached = (await response.json())["subscriptionsConnected"]
            async with http.get(broker.url + "/metrics") as response:
                text = await response.text()
            if attached >= connected and "\nveil_sessions_behind 0.0\n" in text:
                return True
            await asyncio.sleep(0.2)
    return False


class CpuSnapshots:
    """CPU by role under `roots`, snapshotted every SNAPSHOT_EVERY seconds while a step runs, so that
    the step is charged with what was spent until its last delivery, not until its subscribers have
    waited long enough to be sure it was the last."""

    def __init__(self, roots: list[int]) -> None:
        self.roots = roots
        self.taken = [(time.time(), cpu.snapshot(roots))]  # the step's start
        self.task = asyncio.create_task(self._take())

    async def _take(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_EVERY)
            at = time.time()
            self.taken.append((at, await asyncio.to_thread(cpu.snapshot, self.roots)))

    async def until(self, moment: float) -> tuple[float, dict[str, float]]:
        """The first snapshot taken at or after `moment`: (when, CPU by role)."""
        self.task.cancel()
        taken = next((snapshot for snapshot in self.taken if snapshot[0] >= moment), None)
        return taken or (time.time(), await asyncio.to_thread(cpu.snapshot, self.roots))


async def run_case(broker: BrokerProcess, subs: Subscriptions, n: int, args: argparse.Namespace) -> dict:
    await subs.grow_to(n)
    indexed, naive = await asyncio.to_thread(one_core_rates, subs)
    head = await asyncio.to_thread(lambda: broker.health()["head"])
    connected = random.Random(n).sample(subs.ids, min(n, args.connect))
    offered = args.step_rate.get(n, args.rate)
    assert broker.process is not None
    roots = [broker.process.pid, os.getpid()]
    processes = Processes()
    if args.multiplex:
        groups = [connected[i : i + args.multiplex] for i in range(0, len(connected), args.multiplex)]
        handshakes = [orjson.dumps({"authHash": "bench", "subscriptionIds": g, "resumeAfter": head}) for g in groups]
        per_process = math.ceil(len(handshakes) / args.multiplex_processes)
        processes.subscribers(
            broker.tcp_port, handshakes, args.seconds + 300, math.ceil(len(handshakes) / per_process), idle=30,
            multiplexed=True,
        )  # fmt: skip
    else:
        handshakes = [orjson.dumps({"authHash": "bench", "subscriptionId": s, "resumeAfter": head}) for s in connected]
        processes.subscribers(
            broker.tcp_port, handshakes, args.seconds + 300, math.ceil(len(connected) / PER_SUBSCRIBER_PROCESS), idle=30
        )
    step = {"subs": n, "connected": len(connected), "offered": offered, "indexed": indexed, "naive": naive}
    if not await sessions_caught_up(broker, len(connected), CATCH_UP):
        processes.stop()
        return {**step, "caught_up": False}
    snapshots = CpuSnapshots(roots)
    processes.publisher(broker.url, f"cupus-{n}", args.seconds, offered, make=sensor_publication, seed=n)
    try:
        processed_at, finished = await finished_matching(broker, args.seconds), True
    except TimeoutError:  # saturated: what it held, and where the CPU went, are still the figures wanted
        processed_at, finished = time.time(), False
    matched = await asyncio.to_thread(lambda: broker.health()["processed"]) - head
    results = await asyncio.to_thread(processes.results)
    published = next(r for r in results if not hasattr(r, "lines"))
    received = [r for r in results if hasattr(r, "lines")]
    lines = sum(r.lines for r in received)
    delays = sorted(d for r in received for d in r.latencies)
    last = max([processed_at, *(r.last for r in received)])
    ended, after = await snapshots.until(last)
    used = cpu.spent(snapshots.taken[0][1], after)
    used["load generators"] = sum(r.cpu for r in results)  # their own count: the processes have ended
    return {
        **step,
        "caught_up": True,
        "finished": finished,
        "matched": matched,
        "selectivity": lines / max(1, published.acked) / len(connected),
        "rate": published.acked / (published.finished - published.started),
        "acked": published.acked,
        "refused": published.refused,
        "mean": statistics.fmean(delays) if delays else float("nan"),
        "p50": percentile(delays, 50),
        "p99": percentile(delays, 99),
        "matches": lines / (last - published.started),
        "cpu": used,
        "wall": ended - snapshots.taken[0][0],
        "deliveries": lines,
        "window": (published.started * 1e9, published.finished * 1e9),
    }


def measured(row: dict, show: Callable[[dict], object]) -> object:
    """A figure of the step, or what stands in its place when the step could not be measured."""
    return show(row) if row["caught_up"] else "-"


def print_rows(rows: list[dict]) -> None:
    def note(row: dict) -> str:
        if not row["caught_up"]:
            return f"did not catch up in {CATCH_UP:.0f} s: not measured"
        return "" if row["finished"] else "not finished: what it held"

    print_table(
        f"CUPUS sensor workload, publications over 16 HTTP connections, TCP delivery; {os.cpu_count()} cores",
        [
            ("subs", 7, lambda r: r["subs"]),
            ("online", 7, lambda r: r["connected"]),
            ("offered", 8, lambda r: f"{r['offered']:.0f}"),
            ("select.", 7, lambda r: measured(r, lambda r: f"{r['selectivity']:.3f}")),
            ("pub/s", 6, lambda r: measured(r, lambda r: f"{r['rate']:.0f}")),
            ("503s", 6, lambda r: measured(r, lambda r: r["refused"])),
            ("mean s", 7, lambda r: measured(r, lambda r: f"{r['mean']:.3f}")),
            ("p50 s", 7, lambda r: measured(r, lambda r: f"{r['p50']:.3f}")),
            ("p99 s", 7, lambda r: measured(r, lambda r: f"{r['p99']:.3f}")),
            ("deliv/s", 9, lambda r: measured(r, lambda r: f"{r['matches']:.0f}")),
            ("index/core", 11, lambda r: f"{r['indexed']:.0f}"),
            ("naive/core", 11, lambda r: f"{r['naive']:.1f}"),
            ("note", 4, note),
        ],
        rows,
    )
    print_quoted(
        "CUPUS, which cannot be run here",
        [
            *((f"CUPUS matcher, {n:,} subs", f"{rate:g} pub/s", "peer run, 2 cores") for n, rate in CUPUS_PEER.items()),
            *((f"CUPUS mean delay, {n:,} subs", f"up to {d:g} s", "S4 §6 Fig. 21") for n, d in CUPUS_DELAY.items()),
        ],
    )


def print_cpu(rows: list[dict]) -> None:
    """Which part of the broker the CPU went to in each step (from the moment every delivery
    connection is attached and caught up, just before publishing, to the first snapshot after the
    last delivery, or after the end of the wait for a step the broker could not finish), and what a
    delivery cost in each."""
    print(f"\nCPU by part, each step: seconds (share of {os.cpu_count()} cores over the step) and µs per delivery")
    for row in rows:
        if not row["caught_up"]:
            print(f"{row['subs']:>7} subscriptions: did not catch up, not measured")
            continue
        state = "" if row["finished"] else ", not finished"
        print(
            f"{row['subs']:>7} subscriptions, {row['deliveries']:,} deliveries and {row['matched']:,} readings "
            f"matched in {row['wall']:.1f} s{state}:"
        )
        for role, seconds in sorted(row["cpu"].items(), key=lambda item: -item[1]):
            share = seconds / row["wall"] / (os.cpu_count() or 1)
            per = seconds / max(1, row["deliveries"]) * 1e6
            print(f"  {role:>34} {seconds:8.1f} s ({share:4.0%}) {per:9.2f} µs")


def print_stages(rows: list[dict], notes: dict) -> None:
    """Publish → written, stage by stage, for every step that published something."""
    steps = [row for row in rows if row["caught_up"] and row["acked"]]
    if not steps:
        return
    stages = [breakdown(stage_times(notes, row["window"])) for row in steps]
    width = 17
    print(f"\nPublish → written by stage (VEIL_TRACE), CUPUS sensor workload; {os.cpu_count()} cores; ms p50 / p99")
    header = f"{'stage':>26} " + " ".join(f"{row['subs']:>{width - 5},} subs" for row in steps)
    print(header)
    print("-" * len(header))
    for i, (name, _, _) in enumerate(stages[0]):
        cells = [f"{step[i][1]:>7.0f} / {step[i][2]:<7.0f}" for step in stages]
        print(f"{name:>26} " + " ".join(f"{c:>{width}}" for c in cells))


def plot(rows: list[dict], path: str) -> None:
    shown = [r for r in rows if r["caught_up"]]

    def draw(axes: list) -> None:
        left, right = axes
        left.loglog([r["subs"] for r in shown], [r["mean"] for r in shown], "o-", label="Veil mean, end to end")
        left.loglog([r["subs"] for r in shown], [r["p99"] for r in shown], "^-", label="Veil p99, end to end")
        draw_quoted(left, list(CUPUS_DELAY), list(CUPUS_DELAY.values()), "CUPUS mean (S4 Fig. 21)")
        left.set(xlabel="subscriptions", ylabel="publish → delivery, s", title="Propagation delay (S4 Fig. 21)")
        right.loglog([r["subs"] for r in rows], [r["indexed"] for r in rows], "o-", label="Veil index, one core")
        right.loglog([r["subs"] for r in rows], [r["naive"] for r in rows], "x--", label="naive loop, one core")
        draw_quoted(right, list(CUPUS_PEER), list(CUPUS_PEER.values()), "CUPUS matcher (peer run)", "D")
        right.set(xlabel="subscriptions", ylabel="publications/s matched", title="Matching, same subscriptions")

    save_figure(path, draw, columns=2)


async def main_async(args: argparse.Namespace) -> None:
    trace = tempfile.mkdtemp(prefix="veil-trace-") if args.trace else None
    env = {"VEIL_TRACE": trace} if trace else None
    with benched_broker(*args.broker_args, keep=args.keep, env=env) as broker:
        warm_up = Processes()  # JIT, Python workers and caches, before anything is measured
        warm_up.publisher(broker.url, "warm-up", 3, args.rate, make=sensor_publication)
        warm_up.results()
        await asyncio.to_thread(broker.wait_processed, 120)
        subs = Subscriptions(broker.url)
        rows = []
        for n in args.subscriptions:
            row = await run_case(broker, subs, n, args)
            rows.append(row)
            print({k: v for k, v in row.items() if k != "window"}, flush=True)
            if not row["caught_up"]:  # more subscriptions would only take longer
                print(f"{n} subscriptions: the delivery sessions did not catch up in {CATCH_UP:.0f} s", flush=True)
                break
            if not row["finished"]:  # the broker is saturated: the steps after it would only be slower
                print(f"{n} subscriptions: not finished; {row['matched']:,} of {row['acked']:,} readings matched "
                      f"in {row['wall']:.0f} s", flush=True)  # fmt: skip
                break
    print_rows(rows)
    print_cpu(rows)
    if trace:
        print_stages(rows, read_trace(trace))
        if args.keep:
            print(f"trace kept in {trace}")
        else:
            shutil.rmtree(trace, ignore_errors=True)
    plot(rows, args.plot)


def step_rates(text: str) -> dict[int, float]:
    try:
        return {int(n): float(r) for n, r in (pair.split("=") for pair in text.split(",") if pair)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N=R,... (subscriptions=publications/s), got {text!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--subscriptions", type=subscription_counts, default=[1, 10, 100, 1000, 5000, 10000, 20000, 100000]
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="publications/s offered")
    parser.add_argument(
        "--step-rate", type=step_rates, default={100_000: 25.0}, help="N=R,...: pub/s offered with N subscriptions"
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connect", type=int, default=18000, help="most delivery connections held")
    parser.add_argument(
        "--multiplex", type=int, default=0, help="subscriptions per delivery connection (0: one each, unmultiplexed)"
    )
    parser.add_argument("--multiplex-processes", type=int, default=2, help="subscriber processes when multiplexed")
    parser.add_argument("--trace", action="store_true", help="run the broker with VEIL_TRACE: each step by stage")
    add_plot_argument(parser, "cupus")
    add_broker_arguments(parser)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
