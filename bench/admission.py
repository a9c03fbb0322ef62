"""How long a gateway takes to admit a delivery connection that carries many subscriptions.

For each store in `--stores` (SQLite, the default; PostgreSQL, a throwaway server of the benchmark's
own), a broker and one client with `--subscriptions` subscriptions. In each of `--repeats` rounds the
client opens one multiplexed connection naming all of them (`subscriptionIds`), and, beside it, the
same subscriptions on as many connections of one each, opened at once: the time from the handshakes
sent to the gateway counting every subscription connected (`/health`'s `subscriptionsConnected`,
looked at every 10 ms). The connections then close, and the gateway lets them go and has SETTLE
seconds before the next round. Medians, with the fastest and slowest round.

    python -m bench.admission [--subscriptions 1000] [--repeats 5] [--stores sqlite,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Iterator

import aiohttp
import orjson

from bench.brokers import add_broker_arguments, benched_broker
from bench.report import print_table
from veil.harness import BrokerProcess, PostgresServer, postgres_database

CLIENT = "admission"
LOOK = 0.01  # seconds between looks at /health
# seconds left after the connections closed: the gateway releases each closed connection's claim in a
# write of its own, and a thousand of them (0.3 s on SQLite, 0.6 s on PostgreSQL) are still queued
# ahead of the next round's claim when the last has left `subscriptionsConnected`
SETTLE = 3.0


async def subscribe(broker: BrokerProcess, count: int) -> list[str]:
    semaphore = asyncio.Semaphore(32)
    async with aiohttp.ClientSession() as http:

        async def one(n: int) -> str:
            body = orjson.dumps({"authHash": CLIENT, "data": [{"key": "n", "val": n, "op": "eq"}]})
            async with semaphore, http.post(broker.url + "/subscribe", data=body) as response:
                answer = await response.json(content_type=None)
                if response.status != 200:
                    raise RuntimeError(f"subscribe failed: {answer}")
                return str(answer["subscriptionId"])

        return list(await asyncio.gather(*(one(n) for n in range(count))))


async def connected(http: aiohttp.ClientSession, broker: BrokerProcess) -> int:
    async with http.get(broker.url + "/health") as response:
        return int((await response.json())["subscriptionsConnected"])


async def until_connected(http: aiohttp.ClientSession, broker: BrokerProcess, wanted: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while await connected(http, broker) != wanted:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{await connected(http, broker)} subscriptions connected, not {wanted}")
        await asyncio.sleep(LOOK)


async def admitted_in(broker: BrokerProcess, handshakes: list[bytes], subscriptions: int) -> float:
    """Seconds from sending `handshakes` (one connection each, opened first) to every subscription
    connected; the connections are closed and let go before it returns."""
    async with aiohttp.ClientSession() as http:
        opened = await asyncio.gather(
            *(asyncio.open_connection("127.0.0.1", broker.tcp_port) for _ in handshakes)
        )  # fmt: skip
        began = time.monotonic()
        for (_, writer), handshake in zip(opened, handshakes, strict=True):
            writer.write(handshake + b"\n")
        await asyncio.gather(*(writer.drain() for _, writer in opened))
        await until_connected(http, broker, subscriptions, 120)
        took = time.monotonic() - began
        for _, writer in opened:
            writer.close()
        for _, writer in opened:
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await until_connected(http, broker, 0, 120)
        await asyncio.sleep(SETTLE)
    return took


async def measure(broker: BrokerProcess, store: str, args: argparse.Namespace) -> list[dict]:
    ids = await subscribe(broker, args.subscriptions)
    ways = {
        "one multiplexed connection": [orjson.dumps({"authHash": CLIENT, "subscriptionIds": ids})],
        "a connection each": [orjson.dumps({"authHash": CLIENT, "subscriptionId": sub_id}) for sub_id in ids],
    }
    took: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(args.repeats):
        for way, handshakes in ways.items():
            took[way].append(await admitted_in(broker, handshakes, len(ids)))
    rows = [{"store": store, "way": way, "took": times} for way, times in took.items()]
    for row in rows:
        print(store, row["way"], " ".join(f"{t:.3f}" for t in row["took"]), flush=True)
    return rows


@contextlib.contextmanager
def store_url(store: str, server: PostgresServer | None) -> Iterator[tuple[str, ...]]:
    """`veil serve` flags for the store: none for SQLite, a fresh database of `server` for PostgreSQL."""
    if server is None:
        yield ()
        return
    with postgres_database(server.url) as url:
        yield ("--store", url)


async def main_async(args: argparse.Namespace) -> list[dict]:
    rows: list[dict] = []
    server = PostgresServer().start() if "postgres" in args.stores else None
    try:
        for store in args.stores:
            with (
                store_url(store, server if store == "postgres" else None) as flags,
                benched_broker(*flags, *args.broker_args, keep=args.keep) as broker,
            ):
                rows += await measure(broker, store, args)
    finally:
        if server is not None:
            server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscriptions", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--stores", type=lambda text: text.split(","), default=["sqlite", "postgres"], help="sqlite, postgres"
    )
    add_broker_arguments(parser)
    args = parser.parse_args()
    if set(args.stores) - {"sqlite", "postgres"}:
        parser.error(f"--stores: unknown store in {','.join(args.stores)} (sqlite, postgres)")
    rows = asyncio.run(main_async(args))
    print_table(
        f"Admitting {args.subscriptions} subscriptions of one client, {args.repeats} rounds; {os.cpu_count()} cores",
        [
            ("store", 9, lambda r: r["store"]),
            ("connections", 28, lambda r: r["way"]),
            ("median s", 9, lambda r: f"{statistics.median(r['took']):.3f}"),
            ("fastest s", 10, lambda r: f"{min(r['took']):.3f}"),
            ("slowest s", 10, lambda r: f"{max(r['took']):.3f}"),
        ],
        rows,
    )


if __name__ == "__main__":
    main()
