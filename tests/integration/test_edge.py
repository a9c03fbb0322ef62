"""Edge brokers (SPEC §9): the cloud sends an edge exactly the subscriptions its announcement could
serve; the edge publishes only what they want and knows when nobody wants anything."""

from __future__ import annotations

import asyncio

from tests.integration.helpers import client_for, nothing_more, run_id, take
from veil.client import EdgeBroker


async def until(condition, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)


async def test_an_edge_broker_serves_only_what_is_wanted(broker):
    rid = run_id()
    told: list[bool] = []
    announcement = [
        {"key": "run", "val": rid, "op": "eq"},
        {"key": "sensor", "val": "NO2", "op": "eq"},
        {"key": "lat", "val": [45, 46], "op": "between"},
    ]
    async with (
        client_for(broker, "eddie") as edge_client,
        client_for(broker, "sam") as subscriber,
        EdgeBroker(edge_client, announcement, on_wanted=told.append) as edge,
    ):
        await asyncio.wait_for(edge.synced.wait(), 20)
        assert not edge.wanted
        run = {"key": "run", "val": rid, "op": "eq"}
        await subscriber.subscribe([run, {"key": "sensor", "val": "CO", "op": "eq"}])  # another sensor
        await subscriber.subscribe([run, {"key": "lat", "val": 40, "op": "lt"}])  # elsewhere
        wanted = (await subscriber.subscribe([run, {"key": "lat", "val": 45.5, "op": "gt"}]))["subscriptionId"]
        await until(lambda: edge.wanted)
        assert len(edge.index) == 1 and told == [True]

        async with subscriber.deliveries(wanted) as stream:
            sent = await edge.publish({"run": rid, "sensor": "NO2", "lat": 45.7})
            assert await edge.publish({"run": rid, "sensor": "NO2", "lat": 45.2}) is None  # nobody wants it
            assert [d.id for d in await take(stream, 1)] == [sent]
            await nothing_more(stream)
        assert (edge.published, edge.withheld) == (1, 1)

        await subscriber.unsubscribe(wanted)
        await until(lambda: not edge.wanted)
        assert told == [True, False]
        assert await edge.publish({"run": rid, "sensor": "NO2", "lat": 45.7}) is None
