"""SELIS Fig. 9/11 (S0 §7.4): 1..512 subscriptions on lat/lon publications over HTTP, end to end.

Each subscription is a random lat/lon box (4 constraints) matching a quarter of uniformly random
publications; all are connected over the TCP line protocol from a separate subscriber process. A
separate publisher process sends over 16 HTTP connections:
  * latency: a constant rate; publish-sent → delivery-received, p50 and p99;
  * saturation: as fast as acknowledgements come; publications/s and matches/s counted until the last
    delivery arrived (end to end, not just acknowledged). `--batch N` sends NDJSON batches of N.
Each of the pipeline's triggers (`--triggers rounds,micro-batch`) runs the cases with a broker of
its own, one after the other, and the table shows them side by side. A phase's figures are printed
only if every delivery its acknowledged publications should have made (counted here, from the
boxes) arrived, and none more; otherwise the row says how many of how many arrived instead. The
SELIS server cannot be run here: the figures of its paper (S0 Fig. 9) and of peer runs of it are
printed apart, as quoted figures (sources in docs/performance/peers.md).

    python -m bench.selis [--subscriptions 1,2,4,8,16,32,128,512] [--seconds 10] [--rate 200] [--batch 1]
                          [--keys] [--triggers rounds,micro-batch] [--plot docs/performance/selis.png]

`--keys` runs the saturation phase a second time with an Idempotency-Key on each request (a key of its
own each, as the client library sends them) and prints its figures beside those without: what
remembering keys costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from bench.brokers import add_broker_arguments, add_trigger_argument, benched_broker, subscription_counts
from bench.loadgen import Processes, PublishResult, SubscribeResult
from bench.report import add_plot_argument, draw_quoted, print_quoted, print_table, save_figure
from veil.client import VeilClient
from veil.harness import BrokerProcess

# quoted, not measured here (docs/performance/peers.md): pub/s of the SELIS server
SELIS_PEER = {1: 459, 8: 674, 128: 264, 512: 86}  # peer run, 2026-11-21 (the README table's comparison)
SELIS_PEER_AGAIN = {1: 1638, 8: 1231, 128: 396, 512: 141}  # peer run side by side with Veil, 2026-11-23
SELIS_SEED = {1: 700, 8: 420}  # S0 §7.4 Fig. 9 (i5-4590, wrk2)


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


def expected_deliveries(boxes: list[list[dict]], publications: list[dict]) -> int:
    """How many deliveries `publications` make to `boxes` (lat ge, lat le, lon ge, lon le, run eq; every
    publication is of the boxes' run), counted here rather than asked of the broker under test."""
    bounds = np.array([[constraint["val"] for constraint in b[:4]] for b in boxes], dtype=float).reshape(-1, 4)
    total = 0
    for low in range(0, len(publications), 4096):
        chunk = publications[low : low + 4096]
        lat = np.array([p["lat"] for p in chunk])[:, None]
        lon = np.array([p["lon"] for p in chunk])[:, None]
        inside = (lat >= bounds[:, 0]) & (lat <= bounds[:, 1]) & (lon >= bounds[:, 2]) & (lon <= bounds[:, 3])
        total += int(inside.sum())
    return total


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 2 else float("nan")


async def run_case(
    broker: BrokerProcess,
    n: int,
    seconds: float,
    rate: float,
    batch: int,
    deliver_from: BrokerProcess | None = None,
    keys: bool = False,
    flat_out_window: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
) -> dict:
    """Publishers and subscriptions through `broker`, deliveries through `deliver_from` (another
    gateway on the same store) if given; `keys`: the saturation phase again, each request with an
    Idempotency-Key of its own. `flat_out_window` is entered around the saturation phase alone (from
    its first publication to its last delivery), so that what it measures leaves out the setting up
    and removing of the subscriptions and the constant-rate phase."""  # fmt: skip
    tcp_port = (deliver_from or broker).tcp_port
    rng = random.Random(n)
    run = f"selis-{n}-{time.time_ns()}"
    boxes = [box(rng, run) for _ in range(n)]
    async with VeilClient(broker.url, auth_hash="bench") as client:
        sub_ids = [(await client.subscribe(b))["subscriptionId"] for b in boxes]
    handshakes = [orjson.dumps({"authHash": "bench", "subscriptionId": s}) for s in sub_ids]
    processes = Processes()

    processes.subscribers(tcp_port, handshakes, seconds + 60, every_line=True)
    processes.publisher(broker.url, run, seconds, rate, seed=n, keep=True)
    steady, listened = sorted(processes.results(), key=lambda r: hasattr(r, "lines"))
    latencies = sorted(listened.latencies)

    with flat_out_window() if flat_out_window else contextlib.nullcontext():
        flat_out, drained, elapsed = await saturated(
            broker, tcp_port, handshakes, run, seconds, batch=batch, seed=n + 1, keep=True
        )
    keyed: dict = {}
    if keys:
        with_keys, keyed_drained, keyed_elapsed = await saturated(
            broker, tcp_port, handshakes, run, seconds, batch=batch, seed=n + 2, keep=True, keyed=True
        )
        keyed = {
            "keyed acked": with_keys.acked / (with_keys.finished - with_keys.started),
            "keyed sustained": with_keys.acked / keyed_elapsed,
            "keyed arrived": (keyed_drained.lines, expected_deliveries(boxes, with_keys.kept)),
        }
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
        "flat out published": flat_out.acked,
        "steady arrived": (listened.lines, expected_deliveries(boxes, steady.kept)),
        "flat out arrived": (drained.lines, expected_deliveries(boxes, flat_out.kept)),
        **keyed,
    }


def complete(row: dict, phase: str) -> bool:
    arrived, expected = row[f"{phase} arrived"]
    return arrived == expected


def checked(row: dict, phase: str, figure: str) -> str:
    """A figure of the phase, or, when its deliveries are not exactly the ones expected, which way they
    are off: a rate over deliveries that did not all arrive would overstate what the broker held."""
    if complete(row, phase):
        return figure
    arrived, expected = row[f"{phase} arrived"]
    return "incomplete" if arrived < expected else "extra"


def arrived(row: dict, phase: str) -> str:
    got, expected = row[f"{phase} arrived"]
    return "all" if got == expected else f"{got:,} of {expected:,}"


def print_rows(rows: list[dict], batch: int) -> None:
    form = f"NDJSON batches of {batch}" if batch > 1 else "one publication per POST"
    keyed = [
        ("keyed acked/s", 14, lambda r: f"{r['keyed acked']:.0f}"),
        ("keyed e2e pub/s", 16, lambda r: checked(r, "keyed", f"{r['keyed sustained']:.0f}")),
        ("arrived keyed", 14, lambda r: arrived(r, "keyed")),
    ]  # each request with an Idempotency-Key (--keys), beside the same phase without
    print_table(
        f"SELIS lat/lon workload, {form}, 16 HTTP connections, TCP delivery; {os.cpu_count()} cores",
        [
            ("trigger", 11, lambda r: r["trigger"]),
            ("subs", 5, lambda r: r["subs"]),
            ("select.", 7, lambda r: f"{r['selectivity']:.3f}"),
            ("at pub/s", 9, lambda r: f"{r['rate']:.0f}"),
            ("p50 ms", 7, lambda r: checked(r, "steady", f"{r['p50'] * 1000:.0f}")),
            ("p99 ms", 7, lambda r: checked(r, "steady", f"{r['p99'] * 1000:.0f}")),
            ("acked/s", 8, lambda r: f"{r['acked']:.0f}"),
            ("503s", 6, lambda r: r["refused"]),
            ("e2e pub/s", 10, lambda r: checked(r, "flat out", f"{r['sustained']:.0f}")),
            ("matches/s", 10, lambda r: checked(r, "flat out", f"{r['matches']:.0f}")),
            *(keyed if all("keyed acked" in r for r in rows) else []),
            ("arrived at pub/s", 17, lambda r: arrived(r, "steady")),
            ("arrived flat out", 17, lambda r: arrived(r, "flat out")),
        ],
        rows,
    )
    print_quoted(
        "the SELIS server, pub/s",
        [
            *((f"{n} subs, peer run 2026-11-21", f"{v:,}", "2 cores, 16 conn.") for n, v in SELIS_PEER.items()),
            *((f"{n} subs, peer run 2026-11-23", f"{v:,}", "2 cores, wrk") for n, v in SELIS_PEER_AGAIN.items()),
            *((f"{n} subs, paper", f"{v:,}", "S0 §7.4 Fig. 9, i5-4590") for n, v in SELIS_SEED.items()),
        ],
    )


def plot(rows: list[dict], path: str) -> None:
    """The first trigger's rows; only phases whose deliveries all arrived are drawn."""
    rows = [r for r in rows if r["trigger"] == rows[0]["trigger"]]
    flat_out = [r for r in rows if complete(r, "flat out")]
    steady = [r for r in rows if complete(r, "steady")]

    def draw(axes: list) -> None:
        left, right = axes
        subs = [r["subs"] for r in flat_out]
        left.semilogx(subs, [r["sustained"] for r in flat_out], "o-", base=2, label="Veil, end to end")
        draw_quoted(left, list(SELIS_PEER), list(SELIS_PEER.values()), "SELIS server, peer run 2026-11-21")
        draw_quoted(left, list(SELIS_PEER_AGAIN), list(SELIS_PEER_AGAIN.values()), "SELIS server, 2026-11-23", "D")
        draw_quoted(left, list(SELIS_SEED), list(SELIS_SEED.values()), "SELIS paper, i5-4590 (S0 Fig. 9)", "v")
        left.set(xlabel="subscriptions", ylabel="publications/s", title="Throughput (S0 Fig. 9)")
        subs = [r["subs"] for r in steady]
        right.semilogx(subs, [r["p50"] * 1000 for r in steady], "o-", base=2, label="p50")
        right.semilogx(subs, [r["p99"] * 1000 for r in steady], "^-", base=2, label="p99")
        right.set(
            xlabel="subscriptions",
            ylabel="publish → delivery, ms",
            title=f"Latency at {rows[0]['rate']:.0f} pub/s (S0 Fig. 11)",
        )

    save_figure(path, draw, columns=2)


async def main_async(args: argparse.Namespace) -> None:
    rows = []
    for trigger in args.triggers:
        with benched_broker("--trigger", trigger, *args.broker_args, keep=args.keep) as broker:
            await run_case(broker, 8, 3, args.rate, args.batch)  # warm-up: JIT, Python workers, caches
            for n in args.subscriptions:
                case = await run_case(broker, n, args.seconds, args.rate, args.batch, keys=args.keys)
                rows.append({"trigger": trigger, **case})
                print(rows[-1], flush=True)
    rows.sort(key=lambda row: (row["subs"], args.triggers.index(row["trigger"])))
    print_rows(rows, args.batch)
    plot(rows, args.plot)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscriptions", type=subscription_counts, default=[1, 2, 4, 8, 16, 32, 128, 512])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0, help="publications/s in the latency phase")
    parser.add_argument("--batch", type=int, default=1, help="publications per POST in the saturation phase")
    parser.add_argument(
        "--keys", action="store_true",
        help="run the saturation phase again with an Idempotency-Key on each request, and show both",
    )  # fmt: skip
    add_trigger_argument(parser)
    add_plot_argument(parser, "selis")
    add_broker_arguments(parser)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
