"""Bounded memory: when the pipeline cannot keep up, publishes get 503 with Retry-After; when a
subscriber reads nothing, what it is owed waits in the store and the gateway's resident memory stays
far below what it is owed; either way everything acknowledged is still delivered."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import orjson
import pytest

from tests.integration.helpers import run_id, take
from veil.client import VeilClient
from veil.harness import BrokerProcess
from veil.harness.memory import Peak, resident

pytestmark = pytest.mark.slow
PAYLOAD = 8 * 1024
FLOOD = 40_000  # 320 MB of deliveries owed to a subscriber that reads none of them
PER_REQUEST = 120  # publications per NDJSON request, under the 1 MiB body limit
GROWTH_BOUND = 128 << 20  # a gateway holding what it owes in memory grows by 320 MB or more


async def test_lagging_pipeline_sheds_load_with_503(tmp_path):
    # Publish before the Spark pipeline is up: the log runs ahead of the matcher at once.
    broker = BrokerProcess(str(tmp_path), "--max-lag", "20").start(wait_ready=False)
    rid = run_id()
    try:
        async with VeilClient(broker.url, auth_hash="gina", tcp_port=broker.tcp_port) as client:
            for _ in range(100):
                try:
                    reply = await client.subscribe([{"key": "run", "val": rid, "op": "eq"}])
                    break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
            accepted, refused = [], []
            async with aiohttp.ClientSession() as http:
                for n in range(60):
                    async with http.post(f"{broker.url}/publish", data=orjson.dumps({"run": rid, "n": n})) as response:
                        if response.status == 200:
                            accepted.append(n)
                        else:
                            assert response.status == 503
                            assert int(response.headers["Retry-After"]) >= 1
                            error = await response.json()
                            assert "behind" in error["error"]
                            refused.append(n)
            assert refused, "nothing was refused although the pipeline was not running"
            assert len(accepted) <= 22
            broker.wait_ready()
            broker.wait_processed()
            await client.publish({"run": rid, "n": 60})
            async with client.deliveries(reply["subscriptionId"]) as stream:
                got = await take(stream, len(accepted) + 1)
                assert [d.publication["n"] for d in got] == [*accepted, 60]
    finally:
        broker.close()


async def publish_flood(broker: BrokerProcess, rid: str, count: int) -> None:
    """`count` publications of PAYLOAD bytes in NDJSON batches, one after the other so that the log
    holds them in order, each sent again after a 503 (the pipeline may lag behind such a flood)."""
    pad = "x" * PAYLOAD
    batches = [
        b"\n".join(
            orjson.dumps({"run": rid, "n": n, "pad": pad}) for n in range(start, min(start + PER_REQUEST, count))
        )
        for start in range(0, count, PER_REQUEST)
    ]
    async with aiohttp.ClientSession() as http:

        async def send(batch: bytes) -> None:
            while True:
                async with http.post(f"{broker.url}/publish", data=batch,
                                     headers={"Content-Type": "application/x-ndjson", "X-Auth-Hash": "hugo"}) as response:  # fmt: skip
                    if response.status != 503:
                        assert response.status == 200, await response.text()
                        return
                await asyncio.sleep(int(response.headers["Retry-After"]))

        for batch in batches:
            await send(batch)


async def test_a_subscriber_that_never_reads_costs_bounded_memory(tmp_path):
    broker = BrokerProcess(str(tmp_path)).start()
    try:
        assert broker.process is not None
        rid = run_id()
        async with VeilClient(broker.url, auth_hash="hugo", tcp_port=broker.tcp_port) as client:
            sub = (await client.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
        await publish_flood(broker, run_id(), 2 * PER_REQUEST)  # the publish path's buffers, before the baseline
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for it either
        stuck.connect(("127.0.0.1", broker.tcp_port))
        stuck.sendall(orjson.dumps({"authHash": "hugo", "subscriptionId": sub}) + b"\n")
        matched = broker.metrics()["veil_matches_total"]
        baseline = resident(broker.process.pid)
        peak = Peak(broker.process.pid)
        try:
            await publish_flood(broker, rid, FLOOD)
            deadline = time.monotonic() + 300
            while broker.metrics()["veil_matches_total"] < matched + FLOOD:  # every delivery owed is queued
                assert time.monotonic() < deadline, "the pipeline did not match the flood"
                await asyncio.sleep(0.5)
            await asyncio.sleep(5)  # and the gateway has had the feed to offer to the session
            written = broker.metrics()["veil_deliveries_total"]
        finally:
            grown = peak.stop() - baseline
        assert written < FLOOD / 4, written  # the subscriber really read nothing: most of it is owed
        assert grown < GROWTH_BOUND, f"the gateway grew by {grown >> 20} MiB for one subscriber that reads nothing"
        reader, writer = await asyncio.open_connection(sock=stuck)
        try:
            async with asyncio.timeout(300):
                got = [orjson.loads(await reader.readline())["n"] for _ in range(FLOOD)]
        finally:
            writer.close()
        assert got == list(range(FLOOD))  # all of it waited in the store, in order
    finally:
        broker.close()
