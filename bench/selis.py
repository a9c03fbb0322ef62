"""SELIS Fig. 9/11 (S0 §7.4): 1..512 subscriptions on lat/lon publications over HTTP, end to end.

Each subscription is a random lat/lon box (4 constraints) matching a quarter of uniformly random
publications; all are connected over the TCP line protocol from a separate subscriber process. A
separate publisher process sends over 16 HTTP connections:
  * latency: a constant rate; publish-sent → delivery-received, p50 and p99;
  * saturation: as fast as acknowledgements come; publications/s and matches/s counted until the last
    delivery arrived (end to end, not just acknowledged). `--batch N` sends NDJSON batches of N.
The SELIS columns are the peer measurements of SPEC §11 (same machine type) and the seed's figure;
the SELIS server itself cannot be run here.

    python -m bench.selis [--subscriptions 1,2,4,8,16,32,128,512] [--seconds 10] [--rate 200] [--batch 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from typing import Any

import orjson

from bench.brokers import add_broker_arguments, benched_broker, subscription_counts
from bench.loadgen import Processes, PublishResult, SubscribeResult
from bench.report import figure, print_table
from veil.client import VeilClient
from veil.harness import BrokerProcess

SELIS_PEER = {1: 459, 8: 674, 128: 264, 512: 86}  # pub/s, SPEC §11, measured 2026-11-21
SELIS_SEED = {1: 700, 8: 420}  # pub/s, S0 Fig. 9 (i5-4590, wrk2)


def box(rng: random.Random, run: str) -> list[dict]:
    lat, lon = rng.uniform(0, 50), rng.uniform(0, 50)
    return [
        {"key": "lat", "val": lat, "type": "double", "op": "ge"},
        {"key": "lat", "val": lat + 50, "type": "double", "op": "le"},
        {"key": "lon", "val": lon, "type": "double", "op": "ge"},
        {"key": "lon", "val": lon + 50, "type": "double", "op": "le"},
        {"key": "run", "val": run, "op": "eq"},
    ]


async def finished_matching(broker: BrokerProcess, seconds: float) -> float:
    """When the pipeline had matched everything the publisher sent (it publishes for `seconds`)."""
    await asyncio.sleep(seconds + 0.5)
    return await asyncio.to_thread(broker.wait_processed, 300)


async def saturated(
    broker: BrokerProcess, tcp_port: int, handshakes: list[bytes], run: str, seconds: float, **publisher: Any
) -> tuple[PublishResult, SubscribeResult, float]:
    """Subscribers connected over TCP and a publisher sending as fast as acknowledgements come for
    `seconds`: what each saw, and the seconds until the last delivery arrived and the pipeline had
    matched everything (end to end, not just acknowledged)."""
    processes = Processes()
    processes.subscribers(tcp_port, handshakes, seconds + 120)
    processes.publisher(broker.url, run, seconds, None, **publisher)
    processed_at = await finished_matching(broker, seconds)
    published, drained = sorted(processes.results(), key=lambda r: hasattr(r, "lines"))
    return published, drained, max(drained.last, processed_at) - published.started


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 2 else float("nan")


async def run_case(
    broker: BrokerProcess, n: int, seconds: float, rate: float, batch: int, deliver_from: BrokerProcess | None = None
) -> dict:
    """Publishers and subscriptions through `broker`, deliveries through `deliver_from` (another
    gateway on the same store) if given."""
    tcp_port = (deliver_from or broker).tcp_port
    rng = random.Random(n)
    run = f"selis-{n}-{time.time_ns()}"
    async with VeilClient(broker.url, auth_hash="bench") as client:
        sub_ids = [(await client.subscribe(box(rng, run)))["subscriptionId"] for _ in range(n)]
    handshakes = [orjson.dumps({"authHash": "bench", "subscriptionId": s}) for s in sub_ids]
    processes = Processes()

    processes.subscribers(tcp_port, handshakes, seconds + 60, every_line=True)
    processes.publisher(broker.url, run, seconds, rate, seed=n)
    steady, listened = sorted(processes.results(), key=lambda r: hasattr(r, "lines"))
    latencies = sorted(listened.latencies)

    flat_out, drained, elapsed = await saturated(broker, tcp_port, handshakes, run, seconds, batch=batch, seed=n + 1)
    async with VeilClient(broker.url, auth_hash="bench") as client:
        for sub_id in sub_ids:
            await client.unsubscribe(sub_id)
    return {
        "subs": n,
        "selectivity": drained.lines / max(1, flat_out.acked) / n,
        "rate": steady.acked / (steady.finished - steady.started),
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "acked": flat_out.acked / (flat_out.finished - flat_out.started),
        "refused": flat_out.refused,
        "sustained": flat_out.acked / elapsed,
        "matches": drained.lines / elapsed,
        "published": steady.acked + flat_out.acked,
    }


def print_rows(rows: list[dict], batch: int) -> None:
    form = f"NDJSON batches of {batch}" if batch > 1 else "one publication per POST"
    print_table(
        f"SELIS lat/lon workload, {form}, 16 HTTP connections, TCP delivery; {os.cpu_count()} cores",
        [
            ("subs", 5, lambda r: r["subs"]),
            ("select.", 7, lambda r: f"{r['selectivity']:.3f}"),
            ("at pub/s", 9, lambda r: f"{r['rate']:.0f}"),
            ("p50 ms", 7, lambda r: f"{r['p50'] * 1000:.0f}"),
            ("p99 ms", 7, lambda r: f"{r['p99'] * 1000:.0f}"),
            ("acked/s", 8, lambda r: f"{r['acked']:.0f}"),
            ("503s", 6, lambda r: r["refused"]),
            ("e2e pub/s", 10, lambda r: f"{r['sustained']:.0f}"),
            ("matches/s", 10, lambda r: f"{r['matches']:.0f}"),
            ("SELIS peer", 11, lambda r: SELIS_PEER.get(r["subs"])),
            ("SELIS seed", 11, lambda r: SELIS_SEED.get(r["subs"])),
        ],
        rows,
    )


def plot(rows: list[dict], path: str) -> None:
    subs = [r["subs"] for r in rows]
    peers = sorted(SELIS_PEER.items())
    with figure(path, columns=2) as (left, right):
        left.semilogx(subs, [r["sustained"] for r in rows], "o-", base=2, label="Veil, end to end")
        left.semilogx([p[0] for p in peers], [p[1] for p in peers], "s--", base=2, label="SELIS server (SPEC §11)")
        left.set(xlabel="subscriptions", ylabel="publications/s", title="Throughput (S0 Fig. 9)")
        right.semilogx(subs, [r["p50"] * 1000 for r in rows], "o-", base=2, label="p50")
        right.semilogx(subs, [r["p99"] * 1000 for r in rows], "^-", base=2, label="p99")
        right.set(
            xlabel="subscriptions",
            ylabel="publish → delivery, ms",
            title=f"Latency at {rows[0]['rate']:.0f} pub/s (S0 Fig. 11)",
        )


async def main_async(args: argparse.Namespace) -> None:
    with benched_broker(*args.broker_args, keep=args.keep) as broker:
        await run_case(broker, 8, 3, args.rate, args.batch)  # warm-up: JIT, Python workers, caches
        rows = []
        for n in args.subscriptions:
            rows.append(await run_case(broker, n, args.seconds, args.rate, args.batch))
            print(rows[-1], flush=True)
    print_rows(rows, args.batch)
    if args.plot:
        plot(rows, args.plot)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscriptions", type=subscription_counts, default=[1, 2, 4, 8, 16, 32, 128, 512])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0, help="publications/s in the latency phase")
    parser.add_argument("--batch", type=int, default=1, help="publications per POST in the saturation phase")
    parser.add_argument("--plot", default="docs/performance/selis.png")
    add_broker_arguments(parser)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
