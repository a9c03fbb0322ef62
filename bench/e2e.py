"""End-to-end benchmark on the SELIS lat/lon workload (SPEC §11, S0 §7.4 Fig. 9).

Each subscription is a random lat/lon box (4 constraints) matching a quarter of uniformly random
publications. For 1, 8 and 512 subscriptions, all connected over TCP, it measures
  * latency: publications at a constant rate; publish-sent → delivery-received, p50 and p99;
  * sustained rate: 16 concurrent HTTP publishers for a fixed time; publications/s and matches/s
    counted until the last expected delivery has arrived (end to end, not just acknowledged).
The SELIS figures beside ours are the peer measurements quoted in SPEC §11 (same machine type);
they cannot be re-run here.

    python bench/e2e.py [--subscriptions 1,8,512] [--seconds 10] [--rate 50]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time

import orjson

from veil.client import DeliveryStream, VeilClient
from veil.harness import BrokerProcess

SELIS_PEER = {1: 459, 8: 674, 128: 264, 512: 86}  # pub/s, SPEC §11, measured 2026-11-21
SELIS_SEED = {1: 700, 8: 420}  # pub/s, S0 Fig. 9 (i5-4590, wrk2)
WARMUP = 3.0  # seconds of steady publishing before latencies count


def random_box(rng: random.Random) -> tuple[float, float, float, float]:
    lat, lon = rng.uniform(0, 50), rng.uniform(0, 50)
    return lat, lat + 50, lon, lon + 50


def box_constraints(box: tuple[float, float, float, float], run: str) -> list[dict]:
    lat0, lat1, lon0, lon1 = box
    return [
        {"key": "lat", "val": lat0, "type": "double", "op": "ge"},
        {"key": "lat", "val": lat1, "type": "double", "op": "le"},
        {"key": "lon", "val": lon0, "type": "double", "op": "ge"},
        {"key": "lon", "val": lon1, "type": "double", "op": "le"},
        {"key": "run", "val": run, "op": "eq"},
    ]


def inside(box: tuple[float, float, float, float], lat: float, lon: float) -> bool:
    return box[0] <= lat <= box[1] and box[2] <= lon <= box[3]


class Receiver:
    """Consumes every subscription's stream, recording latency and delivery counts."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.count = 0
        self.last = 0.0
        self.record = False

    async def consume(self, stream: DeliveryStream) -> None:
        async for delivery in stream:
            now = time.time()
            self.count += 1
            self.last = now
            if self.record:
                self.latencies.append(now - delivery.publication["t"])


async def run_case(broker: BrokerProcess, n_subs: int, seconds: float, rate: float, concurrency: int) -> dict:
    rng = random.Random(n_subs)
    run = f"bench-{n_subs}-{time.time_ns()}"
    boxes = [random_box(rng) for _ in range(n_subs)]
    receiver = Receiver()
    async with VeilClient(broker.url, auth_hash="bench") as client:
        sub_ids = [(await client.subscribe(box_constraints(box, run)))["subscriptionId"] for box in boxes]
        streams = [client.deliveries(s) for s in sub_ids]
        for stream in streams:
            await stream.__aenter__()
        await asyncio.gather(*(s.connected.wait() for s in streams))
        consumers = [asyncio.create_task(receiver.consume(s)) for s in streams]
        expected = 0

        def publication() -> tuple[bytes, int]:
            lat, lon = rng.uniform(0, 100), rng.uniform(0, 100)
            doc = {"lat": lat, "lon": lon, "run": run, "t": time.time()}
            return orjson.dumps(doc), sum(inside(b, lat, lon) for b in boxes)

        async def wait_for_all(deadline: float) -> None:
            while receiver.count < expected and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

        async def steady(duration: float) -> None:
            nonlocal expected
            start = time.monotonic()
            sent = 0
            while time.monotonic() - start < duration:
                body, matches = publication()
                await client.publish(body)
                expected += matches
                sent += 1
                await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()))
            await wait_for_all(time.monotonic() + 60)

        await steady(WARMUP)
        receiver.record = True
        await steady(seconds)
        receiver.record = False
        latencies = sorted(receiver.latencies)

        # sustained rate, closed loop
        before = receiver.count
        expected_before = expected
        acked = 0
        started = time.time()

        async def publisher(stop_at: float) -> None:
            nonlocal acked, expected
            while time.monotonic() < stop_at:
                body, matches = publication()
                await client.publish(body)
                acked += 1
                expected += matches

        stop_at = time.monotonic() + seconds
        await asyncio.gather(*(publisher(stop_at) for _ in range(concurrency)))
        publish_done = time.time()
        await wait_for_all(time.monotonic() + 120)
        elapsed = max(receiver.last, publish_done) - started
        delivered = receiver.count - before
        for task in consumers:
            task.cancel()
        for stream in streams:
            await stream.aclose()
        for sub_id in sub_ids:
            await client.unsubscribe(sub_id)
    return {
        "subs": n_subs,
        "selectivity": (expected - expected_before) / max(1, acked) / n_subs,
        "p50": statistics.quantiles(latencies, n=100)[49] if len(latencies) > 2 else float("nan"),
        "p99": statistics.quantiles(latencies, n=100)[98] if len(latencies) > 2 else float("nan"),
        "acked": acked / (publish_done - started),
        "sustained": acked / elapsed,
        "matches": delivered / elapsed,
        "complete": receiver.count >= expected,
    }


def print_table(rows: list[dict], rate: float) -> None:
    print()
    print(
        f"SELIS lat/lon workload, HTTP publish, TCP delivery; latency at {rate:.0f} pub/s; 16 publishers for the rate"
    )
    header = (
        f"{'subs':>5} {'select.':>7} {'p50 ms':>8} {'p99 ms':>8} {'acked/s':>9} {'pub/s e2e':>10} "
        f"{'matches/s':>10} {'SELIS peer':>11} {'SELIS seed':>11} {'all delivered':>14}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        peer = SELIS_PEER.get(r["subs"], "-")
        seed = SELIS_SEED.get(r["subs"], "-")
        print(
            f"{r['subs']:>5} {r['selectivity']:>7.3f} {r['p50'] * 1000:>8.0f} {r['p99'] * 1000:>8.0f} "
            f"{r['acked']:>9.0f} {r['sustained']:>10.0f} {r['matches']:>10.0f} {peer!s:>11} {seed!s:>11} "
            f"{r['complete']!s:>14}"
        )


async def main_async(args: argparse.Namespace) -> None:
    data_dir = tempfile.mkdtemp(prefix="veil-bench-")
    print(f"broker data and log in {data_dir}", flush=True)
    broker = BrokerProcess(data_dir).start()
    try:
        rows = []
        for n in args.subscriptions:
            rows.append(await run_case(broker, n, args.seconds, args.rate, args.concurrency))
            print(rows[-1], flush=True)
        print_table(rows, args.rate)
    finally:
        broker.close()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscriptions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 512])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=50.0, help="publications/s in the latency phase")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--keep", action="store_true", help="keep the data directory and broker log")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
