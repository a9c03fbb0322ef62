"""Bounded memory: when the pipeline cannot keep up, publishes get 503 with Retry-After, and
everything that was acknowledged is still delivered."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from tests.integration.helpers import run_id, take
from veil.client import VeilClient
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow


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
