"""Nothing acknowledged is lost: restarts, and kill -9 of the broker under steady publishing."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.helpers import Consumers, SteadyPublisher, client_for, nothing_more, run_id, take
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow



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
            assert stream.dropped_duplicates == 0
    finally:
        broker.close()


# the triggers differ in the pipeline, the dialects in the store: micro-batch on one dialect
@pytest.mark.parametrize(
    ("store_flags", "trigger"),
    [("sqlite", "rounds"), ("postgresql", "rounds"), ("sqlite", "micro-batch")],
    indirect=["store_flags"],
)
async def test_kill_9_while_publishing_loses_and_duplicates_nothing(tmp_path, store_flags, trigger):
    broker = BrokerProcess(str(tmp_path), *store_flags, "--trigger", trigger).start()
    rid = run_id()
    try:
        async with client_for(broker, "frank") as client:
            everything = (await client.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
            evens = (
                await client.subscribe(
                    [{"key": "run", "val": rid, "op": "eq"}, {"key": "even", "val": True, "op": "eq"}]
                )
            )["subscriptionId"]
            consumers = Consumers(
                {everything: client.deliveries(everything), evens: client.deliveries(evens, transport="ws")}
            )
            await consumers.start()
            publisher = SteadyPublisher(client, rid)
            publisher.start()
            # killed after a number of acknowledgements, not after a fixed time: a loaded machine
            # acknowledges fewer per second, and the kill must still land in the middle of a stream
            await publisher.until(150)
            broker.kill()
            await asyncio.sleep(1)
            publisher.stop()
            acknowledged, attempted = publisher.acknowledged, publisher.attempted

            broker.start()
            await consumers.expect_exactly_once_in_order(
                {everything: acknowledged, evens: [n for n in acknowledged if n % 2 == 0]},
                {everything: attempted, evens: [n for n in attempted if n % 2 == 0]},
                timeout=120,
            )
            assert all(stream.reconnects >= 1 for stream in consumers.streams.values())
            await consumers.close()
    finally:
        broker.close()
