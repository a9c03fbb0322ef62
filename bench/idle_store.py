"""What an idle Veil asks of its store: statements a second on PostgreSQL with nothing published.

For each of `--partitions` in each of `--modes`, a broker (`--role all`, `--trigger rounds`) on a
throwaway PostgreSQL server of the benchmark's own, loaded with pg_stat_statements. Once its pipeline
runs and `--settle` seconds have passed, the statement counts are reset; nothing is published for
`--seconds`; then the statements its database ran are counted, BEGIN and COMMIT included (each is a
round trip). The table prints statements a second in all, and the `--top` most frequent of the
busiest case by their text.

    python -m bench.idle_store [--partitions 1,4] [--modes subscriptions,publications] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os

import psycopg

from bench.brokers import benched_broker, subscription_counts
from bench.report import print_table
from veil.harness import PostgresServer, postgres_database

COUNTS = """
SELECT query, calls FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def statements(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as db:
        return {query: calls for query, calls in db.execute(COUNTS).fetchall()}


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("SELECT pg_stat_statements_reset()")


async def measure(server: PostgresServer, partitions: int, mode: str, seconds: float, settle: float) -> dict:
    with postgres_database(server.url) as url:
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("CREATE EXTENSION pg_stat_statements")
        serve = ("--store", url, "--partitions", str(partitions), "--partition-mode", mode, "--trigger", "rounds")
        with benched_broker(*serve):
            await asyncio.sleep(settle)
            reset(url)
            await asyncio.sleep(seconds)
            counted = statements(url)
    counted = {query: calls for query, calls in counted.items() if "pg_stat_statements" not in query}
    total = sum(counted.values())
    row = {"partitions": partitions, "mode": mode, "per_second": total / seconds, "counted": counted}
    print(partitions, mode, f"{total / seconds:.1f} statements/s", flush=True)
    return row


async def main_async(args: argparse.Namespace) -> None:
    server = PostgresServer().start(shared_preload_libraries="pg_stat_statements")
    rows = []
    try:
        for mode in args.modes:
            for partitions in args.partitions:
                rows.append(await measure(server, partitions, mode, args.seconds, args.settle))
    finally:
        server.stop()
    print_table(
        f"An idle broker's store statements on PostgreSQL, over {args.seconds:g} s; {os.cpu_count()} cores",
        [
            ("mode", 14, lambda r: r["mode"]),
            ("partitions", 10, lambda r: r["partitions"]),
            ("statements/s", 13, lambda r: f"{r['per_second']:.1f}"),
        ],
        rows,
    )
    busiest = max(rows, key=lambda r: r["per_second"])
    print(f"\nMost frequent in the busiest ({busiest['mode']}, {busiest['partitions']} partitions), per second:")
    for query, calls in sorted(busiest["counted"].items(), key=lambda pair: -pair[1])[: args.top]:
        print(f"{calls / args.seconds:9.1f}  {' '.join(query.split())[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=subscription_counts, default=[1, 4])
    parser.add_argument("--modes", type=lambda text: text.split(","), default=["subscriptions", "publications"])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after the pipeline runs, before counting")
    parser.add_argument("--top", type=int, default=10, help="most frequent statements listed")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
