"""Top-k/w end to end on the CUPUS sensor workload (S4 §2.2.2, §6): subscribers that want the k best
readings of a window instead of every match.

The same subscriptions run twice on one broker, in the same run: as top-k/w subscriptions and as
plain Boolean subscriptions with the same filters (the baseline: every match is delivered). The
top-k/w case goes first because the Boolean one leaves millions of delivered rows that compaction
clears while the next case runs. Top-k/w subscriptions have k of 1, 3 or 10, a 60 s window and one
or two scoring terms (a gas, highest first, or the distance to the reading the filter came from). A
separate publisher process sends readings at a constant rate over 16 HTTP connections; a separate
subscriber process holds every delivery connection and measures publish → delivery. Within a 10 s
run nothing leaves a 60 s window, so every top-k/w delivery is one made on arrival.

    python -m bench.cupus_topkw [--subscriptions 5000] [--rate 1000] [--seconds 10] [--modes top-k/w,Boolean]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random

import aiohttp
import orjson

from bench.brokers import add_broker_arguments, benched_broker
from bench.loadgen import Processes
from bench.report import print_table
from bench.selis import finished_matching, percentile
from bench.workloads import GASES, sensor_publication, sensor_subscription
from veil.harness import BrokerProcess

WINDOW_MS = 60_000
MODES = ("top-k/w", "Boolean")


def topk_part(rng: random.Random, data: list[dict]) -> dict:
    """Rank by the highest level of a gas, or by closeness to the place the filter was taken from."""
    place = {c["key"]: c["val"] for c in data if c["key"] in ("lat", "lon")}
    if place and rng.random() < 0.5:
        score = [{"key": key, "target": value} for key, value in place.items()]
    else:
        score = [{"key": rng.choice(list(GASES)), "prefer": "high"}]
    return {"k": rng.choice([1, 3, 10]), "w": WINDOW_MS, "score": score}


async def register(url: str, requests: list[dict]) -> list[str]:
    semaphore = asyncio.Semaphore(16)
    async with aiohttp.ClientSession() as http:

        async def one(doc: dict) -> str:
            async with semaphore, http.post(url + "/subscribe", data=orjson.dumps(doc)) as response:
                answer = await response.json(content_type=None)
                if response.status != 200:
                    raise RuntimeError(f"subscribe failed: {answer}")
                return answer["subscriptionId"]

        return list(await asyncio.gather(*map(one, requests)))


async def run_case(broker: BrokerProcess, mode: str, filters: list[list[dict]], args: argparse.Namespace) -> dict:
    rng = random.Random(11)
    requests = [
        {"authHash": "bench", "data": data, **({"topk": topk_part(rng, data)} if mode == "top-k/w" else {})}
        for data in filters
    ]
    ids = await register(broker.url, requests)
    head = await asyncio.to_thread(lambda: broker.health()["head"])
    handshakes = [orjson.dumps({"authHash": "bench", "subscriptionId": s, "resumeAfter": head}) for s in ids]
    processes = Processes()
    processes.subscribers(broker.tcp_port, handshakes, args.seconds + 120, 1, idle=10)
    processes.publisher(broker.url, f"topkw-{mode}", args.seconds, args.rate, make=sensor_publication, seed=3)
    processed_at = await finished_matching(broker, args.seconds)
    published, received = sorted(processes.results(), key=lambda r: hasattr(r, "lines"))
    delays = sorted(received.latencies)
    last = max(processed_at, received.last)
    async with aiohttp.ClientSession() as http:
        for sub_id in ids:
            await http.post(
                broker.url + "/unsubscribe", data=orjson.dumps({"authHash": "bench", "subscriptionId": sub_id})
            )
    return {
        "mode": mode,
        "subs": len(ids),
        "rate": published.acked / (published.finished - published.started),
        "delivered": received.lines,
        "per_pub": received.lines / max(1, published.acked),
        "p50": percentile(delays, 50),
        "p99": percentile(delays, 99),
        "deliveries": received.lines / (last - published.started),
    }


async def main_async(args: argparse.Namespace) -> None:
    rng = random.Random(21)
    filters = [sensor_subscription(rng) for _ in range(args.subscriptions)]
    rows = []
    with benched_broker(*args.broker_args, keep=args.keep) as broker:
        warm_up = Processes()  # JIT, Python workers and caches, before anything is measured
        warm_up.publisher(broker.url, "warm-up", 3, args.rate, make=sensor_publication)
        warm_up.results()
        await asyncio.to_thread(broker.wait_processed, 120)
        for mode in args.modes:
            rows.append(await run_case(broker, mode, filters, args))
            print(rows[-1], flush=True)
    print_table(
        f"CUPUS sensor workload, {args.subscriptions} subscriptions with the same filters, {args.rate:.0f} pub/s "
        f"offered, {WINDOW_MS // 1000} s windows, k of 1/3/10; {os.cpu_count()} cores",
        [
            ("mode", 8, lambda r: r["mode"]),
            ("subs", 6, lambda r: r["subs"]),
            ("pub/s", 6, lambda r: f"{r['rate']:.0f}"),
            ("deliv/pub", 10, lambda r: f"{r['per_pub']:.1f}"),
            ("deliv/s", 9, lambda r: f"{r['deliveries']:.0f}"),
            ("p50 s", 7, lambda r: f"{r['p50']:.3f}"),
            ("p99 s", 7, lambda r: f"{r['p99']:.3f}"),
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscriptions", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=1000.0, help="publications/s offered")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--modes", type=lambda text: text.split(","), default=list(MODES), help="top-k/w,Boolean")
    add_broker_arguments(parser)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
