"""CUPUS Fig. 21 (S4 §6): publish → delivery delay with 1..20,000 and then 100,000 subscriptions.

Sensor readings (CO, O3, NO2, UFP, lat/lon, timestamp) from a fixed pool of 4,000; a subscription is
1-3 constraints of a random reading with random <, <=, >, >=, one in five also with a 1-6 h time
window, so about a quarter of all subscriptions match each reading (SPEC §11). Subscriptions are
added cumulatively to one broker. For each size a separate publisher process sends readings at a
constant rate over 16 HTTP connections and separate subscriber processes hold the delivery
connections (TCP line protocol, resuming after the current log head so each size measures only its
own publications): up to `--connect` of them, since one process may hold at most 20,000 descriptors
here; subscriptions not connected are queued durably, as for any offline subscriber. With
`--multiplex N` the subscriptions share connections, N on each (`subscriptionIds`), held by
`--multiplex-processes` processes: a reading comes once per connection with the ids it is for, and
its delay is counted once per line (the same for every id on it).

Beside the end-to-end figures, the index and a naive loop over every subscription (the seed
matcher's approach) are timed on one core in this process, on the same subscriptions and readings.
The CUPUS columns are its published delay (Fig. 21, config5 on VM-4) and the peer measurements of
its matcher on our machines (SPEC §11); CUPUS itself cannot be run here.

At 100,000 subscriptions a reading matches ~23,000 of them: 1,000 readings/s would be 230 M
deliveries in a 10 s step, so that step offers its own rate (`--step-rate 100000=25`).

    python -m bench.cupus [--subscriptions 1,10,100,1000,5000,10000,20000,100000] [--rate 1000]
                          [--step-rate 100000=25] [--seconds 10] [--multiplex 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import time

import aiohttp
import orjson

from bench import cpu
from bench.brokers import add_broker_arguments, benched_broker, subscription_counts
from bench.loadgen import Processes
from bench.report import figure, print_table
from bench.selis import finished_matching, percentile
from bench.workloads import sensor_publication, sensor_subscription
from veil.harness import BrokerProcess
from veil.matching import Predicate, SubscriptionIndex
from veil.matching.predicates import matches
from veil.protocol import flatten
from veil.protocol.subscriptions import parse_subscribe

CUPUS_DELAY = {20_000: 1.0}  # s, average publish → delivery, S4 Fig. 21 (config5, VM-4, "up to ~1 s")
CUPUS_PEER = {1_000: 1691, 10_000: 124, 20_000: 42, 100_000: 8.4}  # matched pub/s, SPEC §11
PER_SUBSCRIBER_PROCESS = 5000


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


async def sessions_caught_up(broker: BrokerProcess, connected: int, timeout: float = 120.0) -> None:
    """Until every delivery connection's subscriptions are attached and none reads its backlog any
    more: a subscription just connected does, and while most do the broker refuses publishes
    (delivery as a whole is behind), which would count against the step rather than show what it
    holds. (A multiplexed connection is attached once all its subscriptions are admitted, seconds
    after the connection opens.)"""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            async with http.get(broker.url + "/health") as response:
                attached = (await response.json())["subscriptionsConnected"]
            async with http.get(broker.url + "/metrics") as response:
                text = await response.text()
            if attached >= connected and "\nveil_sessions_behind 0.0\n" in text:
                return
            await asyncio.sleep(0.2)


async def run_case(broker: BrokerProcess, subs: Subscriptions, n: int, args: argparse.Namespace) -> dict:
    await subs.grow_to(n)
    indexed, naive = await asyncio.to_thread(one_core_rates, subs)
    head = await asyncio.to_thread(lambda: broker.health()["head"])
    connected = random.Random(n).sample(subs.ids, min(n, args.connect))
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
    await sessions_caught_up(broker, len(connected))
    before, began = cpu.snapshot(roots), time.time()  # what delivering costs, not connecting
    offered = args.step_rate.get(n, args.rate)
    processes.publisher(broker.url, f"cupus-{n}", args.seconds, offered, make=sensor_publication, seed=n)
    try:
        processed_at, finished = await finished_matching(broker, args.seconds), True
    except TimeoutError:  # saturated: what it held, and where the CPU went, are still the figures wanted
        processed_at, finished = time.time(), False
    matched = await asyncio.to_thread(lambda: broker.health()["processed"]) - head
    results = processes.results()
    used = cpu.spent(before, cpu.snapshot(roots))
    used["load generators"] = sum(r.cpu for r in results)  # they have ended: their own count
    published = next(r for r in results if not hasattr(r, "lines"))
    received = [r for r in results if hasattr(r, "lines")]
    lines = sum(r.lines for r in received)
    delays = sorted(d for r in received for d in r.latencies)
    last = max([processed_at, *(r.last for r in received)])
    wall = last - began  # to the last delivery (the subscribers then wait to be sure it was the last)
    return {
        "subs": n,
        "finished": finished,
        "matched": matched,
        "connected": len(connected),
        "offered": offered,
        "selectivity": lines / max(1, published.acked) / len(connected),
        "rate": published.acked / (published.finished - published.started),
        "acked": published.acked,
        "refused": published.refused,
        "mean": statistics.fmean(delays) if delays else float("nan"),
        "p50": percentile(delays, 50),
        "p99": percentile(delays, 99),
        "matches": lines / (last - published.started),
        "indexed": indexed,
        "naive": naive,
        "cpu": used,
        "wall": wall,
        "deliveries": lines,
    }


def print_rows(rows: list[dict]) -> None:
    print_table(
        f"CUPUS sensor workload, publications over 16 HTTP connections, TCP delivery; {os.cpu_count()} cores",
        [
            ("subs", 7, lambda r: r["subs"]),
            ("online", 7, lambda r: r["connected"]),
            ("offered", 8, lambda r: f"{r['offered']:.0f}"),
            ("select.", 7, lambda r: f"{r['selectivity']:.3f}"),
            ("pub/s", 6, lambda r: f"{r['rate']:.0f}"),
            ("503s", 6, lambda r: r["refused"]),
            ("mean s", 7, lambda r: f"{r['mean']:.3f}"),
            ("p50 s", 7, lambda r: f"{r['p50']:.3f}"),
            ("p99 s", 7, lambda r: f"{r['p99']:.3f}"),
            ("deliv/s", 9, lambda r: f"{r['matches']:.0f}"),
            ("index/core", 11, lambda r: f"{r['indexed']:.0f}"),
            ("naive/core", 11, lambda r: f"{r['naive']:.1f}"),
            ("CUPUS peer", 11, lambda r: CUPUS_PEER.get(r["subs"])),
            ("CUPUS s", 8, lambda r: CUPUS_DELAY.get(r["subs"])),
        ],
        rows,
    )


def print_cpu(rows: list[dict]) -> None:
    """Which part of the broker the CPU went to in each step (from the moment every delivery
    connection is attached and caught up, just before publishing, to the last delivery, or to the end
    of the wait for a step the broker could not finish), and what a delivery cost in each."""
    print(f"\nCPU by part, each step: seconds (share of {os.cpu_count()} cores over the step) and µs per delivery")
    for row in rows:
        state = "" if row["finished"] else ", not finished"
        print(
            f"{row['subs']:>7} subscriptions, {row['deliveries']:,} deliveries and {row['matched']:,} readings "
            f"matched in {row['wall']:.1f} s{state}:"
        )
        for role, seconds in sorted(row["cpu"].items(), key=lambda item: -item[1]):
            share = seconds / row["wall"] / (os.cpu_count() or 1)
            per = seconds / max(1, row["deliveries"]) * 1e6
            print(f"  {role:>34} {seconds:8.1f} s ({share:4.0%}) {per:9.2f} µs")


def plot(rows: list[dict], path: str) -> None:
    subs = [r["subs"] for r in rows]
    with figure(path, columns=2) as (left, right):
        left.loglog(subs, [r["mean"] for r in rows], "o-", label="Veil mean, end to end")
        left.loglog(subs, [r["p99"] for r in rows], "^-", label="Veil p99, end to end")
        left.loglog(list(CUPUS_DELAY), list(CUPUS_DELAY.values()), "s", label="CUPUS mean (S4 Fig. 21)")
        left.set(xlabel="subscriptions", ylabel="publish → delivery, s", title="Propagation delay (S4 Fig. 21)")
        right.loglog(subs, [r["indexed"] for r in rows], "o-", label="Veil index, one core")
        right.loglog(subs, [r["naive"] for r in rows], "x--", label="naive loop, one core")
        right.loglog(list(CUPUS_PEER), list(CUPUS_PEER.values()), "s--", label="CUPUS matcher (SPEC §11)")
        right.set(xlabel="subscriptions", ylabel="publications/s matched", title="Matching, same subscriptions")


async def main_async(args: argparse.Namespace) -> None:
    with benched_broker(*args.broker_args, keep=args.keep) as broker:
        warm_up = Processes()  # JIT, Python workers and caches, before anything is measured
        warm_up.publisher(broker.url, "warm-up", 3, args.rate, make=sensor_publication)
        warm_up.results()
        await asyncio.to_thread(broker.wait_processed, 120)
        subs = Subscriptions(broker.url)
        rows = []
        for n in args.subscriptions:
            rows.append(await run_case(broker, subs, n, args))
            print(rows[-1], flush=True)
            if not rows[-1]["finished"]:  # the broker is saturated: the steps after it would only be slower
                row = rows[-1]
                print(f"{n} subscriptions: not finished; {row['matched']:,} of {row['acked']:,} readings matched "
                      f"in {row['wall']:.0f} s", flush=True)  # fmt: skip
                break
    print_rows(rows)
    print_cpu(rows)
    if args.plot:
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
    parser.add_argument("--plot", default="docs/performance/cupus.png")
    add_broker_arguments(parser)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
