"""Kernel benchmark: publications/s against 10^2..10^6 subscriptions, one core, logistics workload.

The index matches batches of publications; the baseline is the seeds' approach, a loop over every
subscription evaluating its predicates (the reference semantics), on identical data in the same run.
Results of both are compared on the publications the baseline gets through.

    python -m bench.kernel [--sizes 100,1000,10000,100000,1000000] [--plot docs/performance/kernel.png]
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the kernel figures ask

from bench.report import add_plot_argument, print_table, save_figure
from bench.workloads import logistics_publication, logistics_subscription
from veil.matching import Predicate, SubscriptionIndex, matches

BATCH = 2000
BUDGET = 3.0  # seconds per measurement


def naive_rate(subscriptions: list[tuple[str, list[Predicate]]], publications: list[dict]) -> tuple[float, list]:
    results = []
    started = time.perf_counter()
    for publication in publications:
        results.append(sorted(s for s, p in subscriptions if matches(p, publication)))
        if time.perf_counter() - started > BUDGET:
            break
    return len(results) / (time.perf_counter() - started), results


def index_rate(index: SubscriptionIndex, publications: list[dict]) -> tuple[float, float]:
    matched = done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < BUDGET:
        batch = publications[done % len(publications) :][:BATCH]
        pubs, _ = index.match_pairs(batch)
        matched += len(pubs)
        done += len(batch)
    return done / (time.perf_counter() - started), matched / done


def run(size: int, rng: random.Random) -> dict:
    subscriptions = [(f"s{i}", [Predicate(*p) for p in logistics_subscription(rng)]) for i in range(size)]
    publications = [logistics_publication(rng) for _ in range(20_000)]
    index = SubscriptionIndex()
    started = time.perf_counter()
    for sub_id, predicates in subscriptions:
        index.add(sub_id, predicates)
    build = time.perf_counter() - started
    rate, per_pub = index_rate(index, publications)
    naive, expected = naive_rate(subscriptions, publications)
    got = [sorted(found) for found in index.match_batch(publications[: len(expected)])]
    assert got == expected, "index and naive loop disagree"
    return {"subs": size, "index": rate, "naive": naive, "matches": per_pub, "build": build, "checked": len(expected)}


def plot(rows: list[dict], path: str) -> None:
    sizes = [r["subs"] for r in rows]

    def draw(axes: list) -> None:
        (ax,) = axes
        ax.loglog(sizes, [r["index"] for r in rows], "o-", label="Veil index (batched)")
        ax.loglog(sizes, [r["naive"] for r in rows], "s--", label="naive loop (seed approach)")
        ax.set(xlabel="subscriptions", ylabel="publications/s (one core)", title="Matching kernel, logistics workload")

    save_figure(path, draw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,10000,100000,1000000")
    add_plot_argument(parser, "kernel")
    args = parser.parse_args()
    rng = random.Random(1)
    rows = [run(int(size), rng) for size in args.sizes.split(",")]
    print_table(
        f"Matching kernel, logistics workload; {os.cpu_count()} cores, numpy threads: {os.environ['OMP_NUM_THREADS']}",
        [
            ("subs", 9, lambda r: r["subs"]),
            ("index pub/s", 12, lambda r: f"{r['index']:.0f}"),
            ("naive pub/s", 12, lambda r: f"{r['naive']:.1f}"),
            ("ratio", 8, lambda r: f"{r['index'] / r['naive']:.0f}"),
            ("matches/pub", 12, lambda r: f"{r['matches']:.3f}"),
            ("build s", 8, lambda r: f"{r['build']:.1f}"),
        ],
        rows,
    )
    plot(rows, args.plot)


if __name__ == "__main__":
    main()
