"""Idempotent publish against a real broker: a publish sent again under its key, by hand or by the
client library's retries, across a kill -9 of the gateway, is logged and delivered once."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.integration.helpers import client_for, nothing_more, run_id, take
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow


async def post(broker: BrokerProcess, who: str | None, body: bytes, key: str, ndjson: bool = False) -> tuple[int, dict]:
    headers = {"Idempotency-Key": key} if who is None else {"X-Auth-Hash": who, "Idempotency-Key": key}
    headers["Content-Type"] = "application/x-ndjson" if ndjson else "application/json"
    async with aiohttp.ClientSession() as http, http.post(f"{broker.url}/publish", data=body, headers=headers) as reply:
        return reply.status, await reply.json()


async def test_a_publish_repeated_under_its_key_is_delivered_once_across_a_kill_9(tmp_path):
    broker = BrokerProcess(str(tmp_path)).start()
    rid = run_id()
    try:
        async with client_for(broker, "kim") as kim:
            sub = (await kim.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
            async with kim.deliveries(sub) as stream:
                first = await kim.publish({"run": rid, "n": 1}, idempotency_key="order-1")
                assert await kim.publish({"run": rid, "n": 1}, idempotency_key="order-1") == first
                # whatever the repeat carries: the key names the publication
                assert (await post(broker, "kim", b'{"run": "%s", "n": 99}' % rid.encode(), "order-1"))[1] == {
                    "id": first
                }
                # another publisher's equal key is another publication
                other = (await post(broker, "lee", b'{"run": "%s", "n": 2}' % rid.encode(), "order-1"))[1]["id"]
                assert other != first
                batch = b'{"run": "%s", "n": 3}\n{"run": "%s", "n": 4}' % (rid.encode(), rid.encode())
                status, ids = await post(broker, "kim", batch, "batch-1", ndjson=True)
                assert status == 200 and (await post(broker, "kim", batch, "batch-1", ndjson=True))[1] == ids
                status, refused = await post(broker, "kim", b'{"run": "x", "veil:key": "k"}', "order-2")
                assert status == 400 and refused["field"] == "Idempotency-Key"
                # clients without credentials share one identity: one must not silence another
                anonymous = b'{"run": "%s", "n": 5}' % rid.encode()
                assert (await post(broker, None, anonymous, "a"))[1] != (await post(broker, None, anonymous, "a"))[1]
                got = await take(stream, 6)
                assert [d.publication["n"] for d in got] == [1, 2, 3, 4, 5, 5]
                await nothing_more(stream)

            broker.kill()
            kim.publish_retry = 180  # (however long the broker takes to start again here)
            # the client library retries while the gateway is down, under one key; the answer to an
            # attempt that went through is as good as the first
            retried = asyncio.create_task(kim.publish({"run": rid, "n": 6}, idempotency_key="order-6"))
            await asyncio.sleep(0.5)
            assert not retried.done()
            await asyncio.to_thread(broker.start)
            sixth = await retried
            assert await kim.publish({"run": rid, "n": 6}, idempotency_key="order-6") == sixth
            assert await kim.publish({"run": rid, "n": 1}, idempotency_key="order-1") == first
            async with kim.deliveries(sub) as stream:
                assert [d.publication["n"] for d in await take(stream, 1)] == [6]
                await nothing_more(stream)
    finally:
        broker.close()
