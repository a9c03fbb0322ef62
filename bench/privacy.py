"""What privacy costs end to end (SPEC §7).

Sealed vs clear: one broker, 128 subscriptions in a scope (SELIS lat/lon boxes, a quarter match),
publications carrying a 256-byte payload either sealed for the scope (`veil:sealed`) or in clear
beside the same attributes; the two alternate in one run, as fast as acknowledgements come over 16
HTTP connections, counted until the last delivery arrived.

Forwarded over n = 3 brokers (k = 2): three deployments on this one machine, the payload split by
`ForwardingPublisher` and gathered and opened by a `ForwardedStream` (1 subscription), against the
same client publishing the same payloads in clear through one broker, in the same run.

    python -m bench.privacy [--seconds 10] [--rounds 2] [--part sealed,forwarded]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import os
import random
import shutil
import statistics
import tempfile
import time

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from bench.loadgen import lat_lon
from bench.report import print_table
from bench.selis import box, saturated
from veil.client import VeilClient
from veil.client.forwarding import ForwardingPublisher, subscribe_forwarded
from veil.client.sealed import seal_publication
from veil.harness import BrokerProcess
from veil.protocol.reserved import SCOPE
from veil.security.sealing import ScopeKey, recipient_public

SUBSCRIPTIONS = 128
PAYLOAD = 256
CONCURRENCY = 16


def clear(rng: random.Random, run: str) -> dict:
    """The same publication into the same scope, its payload in clear (base64, as sealed ones are)."""
    return {**lat_lon(rng, run), SCOPE: "customs", "payload": base64.b64encode(rng.randbytes(PAYLOAD)).decode()}


def sealed(key: tuple[str, int, bytes], rng: random.Random, run: str) -> dict:
    return seal_publication(lat_lon(rng, run), rng.randbytes(PAYLOAD), ScopeKey(*key), "bench")


async def sealed_case(broker: BrokerProcess, make, seconds: float, label: str) -> dict:
    rng = random.Random(7)
    run = f"privacy-{label}-{time.time_ns()}"
    async with VeilClient(broker.url, auth_hash="bench") as client:
        replies = [await client.subscribe(box(rng, run), scope="customs") for _ in range(SUBSCRIPTIONS)]
    subs = [reply["subscriptionId"] for reply in replies]
    handshakes = [orjson.dumps({"authHash": "bench", "subscriptionId": s}) for s in subs]
    published, drained, elapsed = await saturated(
        broker, broker.tcp_port, handshakes, run, seconds, make=make, seed=11, auth_hash="bench"
    )
    async with VeilClient(broker.url, auth_hash="bench") as client:
        for sub in subs:
            await client.unsubscribe(sub)
    return {"case": label, "pubs": published.acked / elapsed, "matches": drained.lines / elapsed}


async def sealed_vs_clear(seconds: float, rounds: int) -> list[dict]:
    directory = tempfile.mkdtemp(prefix="veil-bench-privacy-")
    member, manager = X25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    managers = {"customs": {"m1": base64.b64encode(manager.public_key().public_bytes_raw()).decode()}}
    registry = {
        "rules": {"*": [[]]},
        "keys": {"bench": managers["customs"]},
        "recipients": {"bench": base64.b64encode(recipient_public(member)).decode()},
        "scopes": {"customs": {"users": ["bench"], "managers": ["bench"]}},
    }
    path = os.path.join(directory, "registry.json")
    with open(path, "w") as handle:
        json.dump(registry, handle)
    broker = BrokerProcess(os.path.join(directory, "data"), "--registry", path).start()
    try:
        async with VeilClient(broker.url, auth_hash="bench", recipient_key=member, scope_managers=managers) as client:
            await client.rotate_scope_key("customs", ("m1", manager), {"bench": recipient_public(member)})
            key = await client.keyring.key("customs")
        seal_with = functools.partial(sealed, tuple(key))
        await sealed_case(broker, clear, 3, "warm-up")
        rows = []
        for _ in range(rounds):
            rows.append(await sealed_case(broker, clear, seconds, "clear"))
            print(rows[-1], flush=True)
            rows.append(await sealed_case(broker, seal_with, seconds, "sealed"))
            print(rows[-1], flush=True)
        return rows
    finally:
        broker.close()
        shutil.rmtree(directory, ignore_errors=True)


async def drive(publish, count: int) -> float:
    """Publications/s of `publish(n)` over CONCURRENCY concurrent callers."""
    numbers = iter(range(count))

    async def worker() -> None:
        for n in numbers:
            await publish(n)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return started


async def forwarded_case(brokers: list[BrokerProcess], count: int, forward: bool) -> dict:
    rid = f"fw-{time.time_ns()}"
    readers = [VeilClient(b.url, auth_hash="reader", tcp_port=b.tcp_port) for b in brokers]
    writers = [VeilClient(b.url, auth_hash="writer") for b in brokers]
    payload = os.urandom(PAYLOAD)
    try:
        if forward:
            stream = await subscribe_forwarded(readers, [{"key": "rid", "op": "eq", "val": rid}], 2)
            publisher = ForwardingPublisher(writers, 2)

            async def publish(n: int) -> None:
                await publisher.publish({"rid": rid, "n": n}, payload)
        else:
            reply = await readers[0].subscribe([{"key": "rid", "op": "eq", "val": rid}])
            stream = readers[0].deliveries(reply["subscriptionId"])
            text = base64.b64encode(payload).decode()

            async def publish(n: int) -> None:
                await writers[0].publish({"rid": rid, "n": n, "payload": text})

        async with stream:
            received = 0

            async def consume() -> None:
                nonlocal received
                async for _ in stream:
                    received += 1
                    if received == count:
                        return

            consumer = asyncio.create_task(consume())
            started = await drive(publish, count)
            await asyncio.wait_for(consumer, 300)
            elapsed = time.perf_counter() - started
    finally:
        for client in [*readers, *writers]:
            await client.close()
    label = f"forwarded over {len(brokers)} (k = 2)" if forward else "clear, one broker"
    return {"case": label, "pubs": count / elapsed}


async def forwarded_vs_clear(count: int, rounds: int) -> list[dict]:
    directory = tempfile.mkdtemp(prefix="veil-bench-forwarding-")
    brokers = [BrokerProcess(os.path.join(directory, f"broker{i}")).start(wait_ready=False) for i in range(3)]
    try:
        for broker in brokers:
            broker.wait_ready()
        await forwarded_case(brokers, 200, True)  # warm-up
        rows = []
        for _ in range(rounds):
            rows.append(await forwarded_case(brokers[:1], count, False))
            print(rows[-1], flush=True)
            rows.append(await forwarded_case(brokers, count, True))
            print(rows[-1], flush=True)
        return rows
    finally:
        for broker in brokers:
            broker.close()
        shutil.rmtree(directory, ignore_errors=True)


def medians(rows: list[dict]) -> list[dict]:
    cases = list(dict.fromkeys(r["case"] for r in rows))
    out = []
    for case in cases:
        mine = [r for r in rows if r["case"] == case]
        out.append({
            "case": case, "runs": len(mine), "pubs": statistics.median(r["pubs"] for r in mine),
            "matches": statistics.median(r.get("matches", float("nan")) for r in mine),
        })  # fmt: skip
    base = out[0]["pubs"]
    for row in out:
        row["ratio"] = row["pubs"] / base
    return out


async def main_async(args: argparse.Namespace) -> None:
    columns = [
        ("case", 26, lambda r: r["case"]),
        ("runs", 5, lambda r: r["runs"]),
        ("e2e pub/s", 10, lambda r: f"{r['pubs']:.0f}"),
        ("matches/s", 10, lambda r: f"{r['matches']:.0f}"),
        ("vs first", 9, lambda r: f"{r['ratio']:.2f}"),
    ]
    if "sealed" in args.part:
        rows = medians(await sealed_vs_clear(args.seconds, args.rounds))
        print_table(
            f"Sealed vs clear, {SUBSCRIPTIONS} subscriptions in a scope, {PAYLOAD}-byte payloads, median of "
            f"{args.rounds} alternated runs; {os.cpu_count()} cores",
            columns,
            rows,
        )
    if "forwarded" in args.part:
        rows = medians(await forwarded_vs_clear(args.count, args.rounds))
        print_table(
            f"Secret forwarding, {args.count} publications of {PAYLOAD} bytes from {CONCURRENCY} concurrent "
            f"publishers to 1 subscription, median of {args.rounds} alternated runs; three brokers share "
            f"{os.cpu_count()} cores",
            columns[:3] + columns[4:],
            rows,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--count", type=int, default=2000, help="publications per forwarding run")
    parser.add_argument("--part", type=lambda t: t.split(","), default=["sealed", "forwarded"])
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
