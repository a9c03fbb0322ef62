"""Authorization on vs off at saturation (the papers report 28 % overhead with 4 rules: S1 Fig. 9, S0 Fig. 19).

The SELIS lat/lon workload (`--subscriptions` boxes, a quarter of the publications each), owned by
four subscriber users and connected over TCP from a separate process; a separate publisher process
saturates the broker over 16 HTTP connections. One broker per case: authorization off, then on with
4, 100 and 10,000 rules spread over the four users, each rule a random `lon >= x` bound. With
`--allow all` (the default) every bound lies below the publications' values, so the rules allow
every match: the output is the same as without authorization and the difference is the cost of
checking them (every rule is satisfied, the worst case for the stage). With `--allow some` the
bounds fall inside the values and the rules deny part of the matches. Throughput is end to end:
until the last delivery arrived. The papers' overhead is printed apart, as a quoted figure (source in
docs/performance/peers.md).

    python -m bench.authorization [--rules 4,100,10000] [--allow all|some] [--subscriptions 128] [--batch 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time

import orjson

from bench.brokers import add_broker_arguments, benched_broker, subscription_counts
from bench.loadgen import Processes
from bench.report import print_quoted, print_table
from bench.selis import box, finished_matching
from veil.client import VeilClient

USERS = [f"subscriber-{i}" for i in range(4)]  # so that even 4 rules give every user one
SEED_OVERHEAD = 0.28  # quoted: S1 §V-C.4 Fig. 9 and S0 §7.4 Fig. 19, at saturation with 4 rules


def registry(rules: int, allow: str = "all") -> dict:
    rng = random.Random(rules)
    low, high = (-100, 0) if allow == "all" else (0, 100)
    granted: dict[str, list] = {user: [] for user in USERS}
    for i in range(rules):
        granted[USERS[i % len(USERS)]].append([{"key": "lon", "val": rng.uniform(low, high), "op": "ge"}])
    return {"rules": {user: listed for user, listed in granted.items() if listed}}


async def run_case(
    rules: int | None, allow: str, subscriptions: int, seconds: float, batch: int, extra: list[str]
) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "registry.json")
        with open(path, "w") as handle:
            json.dump(registry(rules or 0, allow), handle)
        flags = ["--with-authorization", "false"] if rules is None else ["--registry", path]
        with benched_broker(*flags, *extra) as broker:
            rng = random.Random(subscriptions)
            run = f"auth-{time.time_ns()}"
            handshakes = []
            for i in range(subscriptions):
                owner = USERS[i % len(USERS)]
                async with VeilClient(broker.url, auth_hash=owner) as client:
                    sub_id = (await client.subscribe(box(rng, run)))["subscriptionId"]
                handshakes.append(orjson.dumps({"authHash": owner, "subscriptionId": sub_id}))
            processes = Processes()
            processes.subscribers(broker.tcp_port, handshakes, 30)  # warm-up, below saturation
            processes.publisher(broker.url, run, 3, 200)
            processes.results()
            processes.subscribers(broker.tcp_port, handshakes, seconds + 120)
            processes.publisher(broker.url, run, seconds, None, batch=batch, seed=1)
            processed_at = await finished_matching(broker, seconds)
            published, received = sorted(processes.results(), key=lambda r: hasattr(r, "lines"))
    elapsed = max(received.last, processed_at) - published.started
    return {
        "rules": "off" if rules is None else rules,
        "sustained": published.acked / elapsed,
        "delivered": received.lines / elapsed,
        "share": received.lines / max(1, published.acked) / subscriptions,
    }


async def main_async(args: argparse.Namespace) -> None:
    rows = []
    for rules in [None, *args.rules]:
        rows.append(await run_case(rules, args.allow, args.subscriptions, args.seconds, args.batch, args.broker_args))
        print(rows[-1], flush=True)
    base = rows[0]["sustained"]
    form = f"NDJSON batches of {args.batch}" if args.batch > 1 else "one publication per POST"
    print_table(
        f"Authorization at saturation: SELIS lat/lon, {args.subscriptions} subscriptions of {len(USERS)} users, "
        f"{form}, "
        f"16 HTTP connections; {os.cpu_count()} cores",
        [
            ("rules", 6, lambda r: r["rules"]),
            ("allowed", 8, lambda r: f"{min(1.0, r['share'] * 4):.0%}"),
            ("e2e pub/s", 10, lambda r: f"{r['sustained']:.0f}"),
            ("deliveries/s", 13, lambda r: f"{r['delivered']:.0f}"),
            ("overhead", 9, lambda r: "" if r["rules"] == "off" or not base else f"{1 - r['sustained'] / base:.0%}"),
        ],
        rows,
    )
    print_quoted(
        "permission filtering in PubSub-SGX and SELIS",
        [("overhead at saturation, 4 rules", f"{SEED_OVERHEAD:.0%}", "S1 §V-C.4 Fig. 9; S0 §7.4 Fig. 19")],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", type=subscription_counts, default=[4, 100, 10_000])
    parser.add_argument("--subscriptions", type=int, default=128)
    parser.add_argument("--batch", type=int, default=50, help="publications per POST")
    parser.add_argument("--allow", choices=("all", "some"), default="all", help="what the rules allow of the matches")
    parser.add_argument("--seconds", type=float, default=10.0)
    add_broker_arguments(parser)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
