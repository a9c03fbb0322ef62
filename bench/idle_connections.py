"""The gateway's memory with many delivery connections that never read.

`--connections` clients (one identity each) hold `--subscriptions` subscriptions each on one
multiplexed connection and read nothing, while a publisher sends `--publications` publications of
`--payload` bytes; each publication matches 1 in `--selectivity` of every client's subscriptions, so
every connection is owed one line per publication. The gateway's resident memory (VmRSS) is printed
once the subscriptions are made, then in each of `--rounds` rounds once every connection is attached
(before the flood), at its peak, once everything owed is matched and queued, and 10 s and 30 s after
the connections close; and the bytes of delivery lines queued in memory (`veil_queued_bytes`, where
the broker reports it) once everything owed is queued. A second round shows whether what one round
left behind is used again or piles up.

    python -m bench.idle_connections [--connections 100] [--subscriptions 1000] [--publications 50]
                                     [--payload 1024] [--selectivity 1] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
import uuid

import aiohttp
import orjson

from bench.brokers import add_broker_arguments, benched_broker
from bench.report import print_table
from veil.harness import BrokerProcess
from veil.harness.memory import Peak, resident

MB = 1 << 20
PER_REQUEST = 100  # publications per NDJSON request


async def subscribe_all(broker: BrokerProcess, rid: str, clients: int, each: int, selectivity: int) -> list[list[str]]:
    """Every client's subscription ids; subscription j of a client matches slot j % selectivity."""
    semaphore = asyncio.Semaphore(32)
    async with aiohttp.ClientSession() as http:

        async def subscribe(client: int, j: int) -> str:
            data = [{"key": "run", "val": rid, "op": "eq"}, {"key": "slot", "val": j % selectivity, "op": "eq"}]
            body = orjson.dumps({"authHash": f"idle-{client}", "data": data})
            async with semaphore, http.post(broker.url + "/subscribe", data=body) as response:
                answer = await response.json(content_type=None)
                if response.status != 200:
                    raise RuntimeError(f"subscribe failed: {answer}")
                return answer["subscriptionId"]

        return [list(await asyncio.gather(*(subscribe(c, j) for j in range(each)))) for c in range(clients)]


async def attached(broker: BrokerProcess, subscriptions: int, timeout: float = 1800) -> None:
    """Wait until the gateway has admitted every connection's subscriptions (the handshakes are only
    sent when this is called): memory measured before that is not that of the connections."""
    deadline = time.monotonic() + timeout
    while broker.health()["subscriptionsConnected"] < subscriptions:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{broker.health()['subscriptionsConnected']} of {subscriptions} attached")
        await asyncio.sleep(1)


def connect_idle(broker: BrokerProcess, ids: list[list[str]]) -> list[socket.socket]:
    """One multiplexed connection per client that never reads (a small receive buffer, so that the
    kernel holds little of what it is sent)."""
    connections = []
    for client, sub_ids in enumerate(ids):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", broker.tcp_port))
        s.sendall(orjson.dumps({"authHash": f"idle-{client}", "subscriptionIds": sub_ids}) + b"\n")
        connections.append(s)
    return connections


async def publish(broker: BrokerProcess, rid: str, count: int, payload: int, selectivity: int) -> None:
    pad = "x" * payload
    async with aiohttp.ClientSession() as http:
        for start in range(0, count, PER_REQUEST):
            body = b"\n".join(
                orjson.dumps({"run": rid, "n": n, "slot": n % selectivity, "pad": pad})
                for n in range(start, min(start + PER_REQUEST, count))
            )
            while True:
                headers = {"Content-Type": "application/x-ndjson", "X-Auth-Hash": "publisher"}
                async with http.post(broker.url + "/publish", data=body, headers=headers) as response:
                    if response.status != 503:
                        if response.status != 200:
                            raise RuntimeError(f"publish failed: {await response.text()}")
                        break
                    await asyncio.sleep(int(response.headers.get("Retry-After", "1")))


async def run(args: argparse.Namespace, broker: BrokerProcess) -> list[dict]:
    assert broker.process is not None
    pid = broker.process.pid
    rid = uuid.uuid4().hex
    began = time.monotonic()
    ids = await subscribe_all(broker, rid, args.connections, args.subscriptions, args.selectivity)
    print(f"{args.connections * args.subscriptions} subscriptions in {time.monotonic() - began:.0f} s", flush=True)
    rows = [{"when": "subscribed, no connection yet", "rss": resident(pid)}]
    for round_ in range(1, args.rounds + 1):
        rows += await connect_flood_close(args, broker, pid, rid, ids, f"{round_}: " if args.rounds > 1 else "")
    return rows


async def connect_flood_close(
    args: argparse.Namespace, broker: BrokerProcess, pid: int, rid: str, ids: list[list[str]], label: str
) -> list[dict]:
    """One round: every client connects and reads nothing through a flood, then they all leave."""
    began = time.monotonic()
    idle = connect_idle(broker, ids)
    await attached(broker, args.connections * args.subscriptions)
    print(f"{label}every connection attached in {time.monotonic() - began:.0f} s", flush=True)
    rows = [{"when": f"{label}attached, before the flood", "rss": resident(pid)}]
    matched = broker.metrics()["veil_matches_total"]
    owed = args.publications * args.subscriptions // args.selectivity * args.connections
    peak = Peak(pid)
    await publish(broker, rid, args.publications, args.payload, args.selectivity)
    deadline = time.monotonic() + 600
    while broker.metrics()["veil_matches_total"] < matched + owed and time.monotonic() < deadline:
        await asyncio.sleep(1)
    await asyncio.sleep(5)  # the gateway has had the feed to offer to the connections
    queued = broker.metrics().get("veil_queued_bytes")
    rows.append({"when": f"{label}all owed matched and queued", "rss": resident(pid), "queued": queued})
    for s in idle:
        s.close()
    for after, wait in ((10, 10), (30, 20)):
        await asyncio.sleep(wait)
        rows.append({"when": f"{label}{after} s after the connections closed", "rss": resident(pid)})
    rows.insert(1, {"when": f"{label}peak during the flood", "rss": peak.stop()})
    lines = args.publications * args.connections
    print(f"{label}owed: {owed} (subscription, publication) pairs, {lines} lines of ~{args.payload} bytes "
          f"({lines * args.payload / MB:.0f} MB)")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--subscriptions", type=int, default=1000, help="per connection (and client)")
    parser.add_argument("--publications", type=int, default=50)
    parser.add_argument("--payload", type=int, default=1024, help="bytes of padding per publication")
    parser.add_argument("--selectivity", type=int, default=1, help="1 in N of each client's subscriptions match")
    parser.add_argument("--rounds", type=int, default=2, help="times every client connects, is flooded and leaves")
    add_broker_arguments(parser)
    args = parser.parse_args()
    with benched_broker(*args.broker_args, keep=args.keep) as broker:
        rows = asyncio.run(run(args, broker))
    print_table(
        f"Gateway memory with {args.connections} connections of {args.subscriptions} subscriptions that never read",
        [
            ("when", 40, lambda r: r["when"]),
            ("RSS MB", 8, lambda r: f"{r['rss'] / MB:.0f}"),
            ("queued lines MB", 16, lambda r: None if r.get("queued") is None else f"{r['queued'] / MB:.1f}"),
        ],
        rows,
    )


if __name__ == "__main__":
    main()
