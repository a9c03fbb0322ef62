"""PubSub-SGX Fig. 2/3 (S1 §V): 256 subscriptions of 40 attributes, 1..8 matcher partitions.

Publications carry 40 numeric attributes; each subscription holds one `ge` bound per attribute, drawn
so that about 1 % of the subscriptions match a publication. For every partition count a broker runs
with `--partitions N`; a separate publisher process saturates it over 16 HTTP connections and a
separate subscriber process receives every match. The paper's figures (20 pub/s with one matcher, ~90
with eight, on eight machines with SGX) cannot be re-run here: they are printed apart from ours, as
quoted figures (source in docs/performance/peers.md).

    python -m bench.pubsub_sgx [--partitions 1,2,4,8] [--seconds 10] [--mode subscriptions]
                               [--plot docs/performance/pubsub_sgx.png]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time

import orjson

from bench.brokers import benched_broker
from bench.loadgen import Processes
from bench.report import add_plot_argument, draw_quoted, print_quoted, print_table, save_figure
from bench.selis import finished_matching
from veil.client import VeilClient

ATTRIBUTES = 40
SUBSCRIPTIONS = 256
SEED_FIGURES = {1: 20, 8: 90}  # pub/s, quoted: S1 §V-C.1 Fig. 2 (8 machines, 1 and 8 matchers)
BOUND_MAX = 21.8  # P(value >= bound) averages 0.891 per attribute: 0.891**40 ≈ 1 %


def publication(rng: random.Random, run: str) -> dict:
    doc: dict = {f"a{i}": rng.uniform(0, 100) for i in range(ATTRIBUTES)}
    doc.update(run=run, t=time.time())
    return doc


def subscription(rng: random.Random, run: str) -> list[dict]:
    bounds = [{"key": f"a{i}", "val": rng.uniform(0, BOUND_MAX), "op": "ge"} for i in range(ATTRIBUTES)]
    return [*bounds, {"key": "run", "val": run, "op": "eq"}]


async def run_case(partitions: int, seconds: float, mode: str) -> dict:
    with benched_broker("--partitions", str(partitions), "--partition-mode", mode) as broker:
        rng = random.Random(0)  # the same subscriptions and publications for every partition count
        run = f"sgx-{partitions}"
        async with VeilClient(broker.url, auth_hash="bench") as client:
            sub_ids = [(await client.subscribe(subscription(rng, run)))["subscriptionId"] for _ in range(SUBSCRIPTIONS)]
        handshakes = [orjson.dumps({"authHash": "bench", "subscriptionId": s}) for s in sub_ids]
        processes = Processes()
        processes.subscribers(broker.tcp_port, handshakes, 30)  # warm-up
        processes.publisher(broker.url, run, 3, None, make=publication)
        processes.results()
        processes.subscribers(broker.tcp_port, handshakes, seconds + 120)
        processes.publisher(broker.url, run, seconds, None, make=publication, seed=1)  # same stream each time
        processed_at = await finished_matching(broker, seconds)
        published, received = sorted(processes.results(), key=lambda r: hasattr(r, "lines"))
        elapsed = max(received.last, processed_at) - published.started
        return {
            "partitions": partitions,
            "acked": published.acked / (published.finished - published.started),
            "sustained": published.acked / elapsed,
            "matches": received.lines / elapsed,
            "selectivity": received.lines / max(1, published.acked) / SUBSCRIPTIONS,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--mode", choices=("subscriptions", "publications"), default="subscriptions")
    add_plot_argument(parser, "pubsub_sgx")
    args = parser.parse_args()
    rows = []
    for n in (int(x) for x in args.partitions.split(",")):
        rows.append(asyncio.run(run_case(n, args.seconds, args.mode)))
        print(rows[-1], flush=True)
    print_table(
        f"PubSub-SGX workload: {SUBSCRIPTIONS} subscriptions x {ATTRIBUTES} attributes, partitioned by "
        f"{args.mode}, one publication per POST, 16 HTTP connections; {os.cpu_count()} cores",
        [
            ("partitions", 10, lambda r: r["partitions"]),
            ("select.", 8, lambda r: f"{r['selectivity']:.4f}"),
            ("acked/s", 8, lambda r: f"{r['acked']:.0f}"),
            ("e2e pub/s", 10, lambda r: f"{r['sustained']:.0f}"),
            ("matches/s", 10, lambda r: f"{r['matches']:.0f}"),
        ],
        rows,
    )
    print_quoted(
        "PubSub-SGX",
        [
            (f"{n} matcher{'s' * (n > 1)}, 8 machines", f"{v} pub/s", "S1 §V-C.1 Fig. 2")
            for n, v in SEED_FIGURES.items()
        ],
    )

    def draw(axes: list) -> None:
        (ax,) = axes
        ax.plot(
            [r["partitions"] for r in rows], [r["sustained"] for r in rows], "o-", label="Veil, 1 machine (2 cores)"
        )
        draw_quoted(ax, list(SEED_FIGURES), list(SEED_FIGURES.values()), "PubSub-SGX, 8 machines (S1 Fig. 2)")
        ax.set(
            xlabel="matcher partitions",
            ylabel="publications/s",
            yscale="log",
            title="256 subscriptions x 40 attributes",
        )

    save_figure(args.plot, draw)


if __name__ == "__main__":
    main()
