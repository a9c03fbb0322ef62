"""Nothing acknowledged is lost: restarts, and kill -9 of the broker under steady publishing."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.integration.helpers import nothing_more, run_id, take
from veil.client import VeilClient, VeilError
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow


def client_for(broker: BrokerProcess, auth_hash: str) -> VeilClient:
    return VeilClient(broker.url, auth_hash=auth_hash, tcp_port=broker.tcp_port, ws_port=broker.ws_port)


async def test_subscriptions_and_queues_survive_a_restart(tmp_path, store_flags):
    broker = BrokerProcess(str(tmp_path), *store_flags).start()
    rid = run_id()
    try:
        async with client_for(broker, "erin") as client:
            reply = await client.subscribe([{"key": "run", "val": rid, "op": "eq"}], "erin-1")
            for n in range(5):
                await client.publish({"run": rid, "n": n})
            broker.wait_processed()
        assert broker.stop() == 0

        broker.start()
        async with client_for(broker, "erin") as client, client.deliveries(reply["subscriptionId"]) as stream:
            got = await take(stream, 5)
            assert [d.publication["n"] for d in got] == [0, 1, 2, 3, 4]
            await client.publish({"run": rid, "n": 5})
            assert [d.publication["n"] for d in await take(stream, 1)] == [5]
            await nothing_more(stream)
    finally:
        broker.close()


async def test_kill_9_while_publishing_loses_and_duplicates_nothing(tmp_path, store_flags):
    broker = BrokerProcess(str(tmp_path), *store_flags).start()
    rid = run_id()
    acknowledged: list[int] = []
    try:
        async with client_for(broker, "frank") as client:
            everything = (await client.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
            evens = (
                await client.subscribe(
                    [{"key": "run", "val": rid, "op": "eq"}, {"key": "even", "val": True, "op": "eq"}]
                )
            )["subscriptionId"]
            streams = {everything: client.deliveries(everything), evens: client.deliveries(evens, transport="ws")}
            received: dict[str, list[int]] = {everything: [], evens: []}
            for stream in streams.values():
                await stream.__aenter__()

            async def consume(sub_id: str) -> None:
                async for delivery in streams[sub_id]:
                    received[sub_id].append(delivery.publication["n"])

            consumers = [asyncio.create_task(consume(s)) for s in streams]

            async def publish_steadily() -> None:
                n = 0
                while True:
                    try:
                        await client.publish({"run": rid, "n": n, "even": n % 2 == 0})
                        acknowledged.append(n)
                    except (aiohttp.ClientError, VeilError, OSError):
                        pass
                    n += 1
                    await asyncio.sleep(0.01)  # ~100 publications/s

            publisher = asyncio.create_task(publish_steadily())
            # killed after a number of acknowledgements, not after a fixed time: a loaded machine
            # acknowledges fewer per second, and the kill must still land in the middle of a stream
            started = time.monotonic()
            while len(acknowledged) < 150 and time.monotonic() - started < 60:
                await asyncio.sleep(0.05)
            broker.kill()
            killed_at = len(acknowledged)
            await asyncio.sleep(1)
            publisher.cancel()
            assert killed_at >= 150, "the publisher was not publishing at a steady rate"

            broker.start()
            deadline = time.monotonic() + 120
            expected = {everything: acknowledged, evens: [n for n in acknowledged if n % 2 == 0]}
            while time.monotonic() < deadline and any(not set(expected[s]) <= set(received[s]) for s in streams):
                await asyncio.sleep(0.2)
            for sub_id in streams:
                got = received[sub_id]
                assert set(expected[sub_id]) <= set(got), f"lost {sorted(set(expected[sub_id]) - set(got))[:10]}"
                assert len(got) == len(set(got)), "a publication was delivered twice"
                assert got == sorted(got), "publish order was not kept"
            assert all(streams[s].reconnects >= 1 for s in streams)
            for task in consumers:
                task.cancel()
            for stream in streams.values():
                await stream.aclose()
    finally:
        broker.close()
