"""Delivery connections in-process: handshakes refused with the reason, and an edge broker's channel
(which needs the log, not the pipeline)."""

import asyncio

import numpy as np
import orjson
import pytest

from tests.gateway.conftest import ALICE, BOB
from veil.gateway.tcp import start_tcp
from veil.matching.stored import encode_subscription
from veil.store import Publication

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the loop the fixtures run on
BOX = [["lat", "ge", 1.0]]


@pytest.fixture
async def tcp(gateway):
    server = await start_tcp(gateway, "127.0.0.1", 0, None)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def exchange(port: int, handshake: dict, lines: int = 1) -> list[dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(orjson.dumps(handshake) + b"\n")
    try:
        return [orjson.loads(await asyncio.wait_for(reader.readline(), 5)) for _ in range(lines)]
    finally:
        writer.close()


async def test_handshakes_are_refused_with_the_reason(gateway, tcp):
    await gateway.threads.write(gateway.threads.store.put_subscription, "s", "alice", encode_subscription([]))
    unknown = await exchange(tcp, {"subscriptionId": "nobody", "authHash": ALICE})
    other = await exchange(tcp, {"subscriptionId": "s", "authHash": BOB})
    assert [(d["status"], d["field"]) for d in unknown + other] == [(404, "subscriptionId"), (403, "authHash")]
    reader, writer = await asyncio.open_connection("127.0.0.1", tcp)
    writer.write(b"{not json\n")
    refused = orjson.loads(await asyncio.wait_for(reader.readline(), 5))
    assert refused["status"] == 400 and await reader.read() == b""  # and closed


async def test_an_edge_channel_gets_the_subscriptions_it_could_serve_then_synced(gateway, tcp):
    store = gateway.threads.store
    store.put_subscription("near", "alice", encode_subscription([["lat", "le", 5.0]]))
    store.put_subscription("far", "alice", encode_subscription([["lat", "le", 0.5]]))
    store.put_announcement("edge", "bob", orjson.dumps(BOX))
    wanted, synced = await exchange(tcp, {"announcementId": "edge", "authHash": BOB}, lines=2)
    assert wanted == {"subscribe": f"s{store.subscription_number('near')}", "data": [["lat", "le", 5.0]]}
    assert synced == {"synced": store.head_offset()}


async def test_a_multiplexed_connection_writes_each_publication_once_with_its_subscriptions(gateway, tcp):
    store = gateway.threads.store
    for sub_id in ("m1", "m2", "m3"):
        store.put_subscription(sub_id, "alice", encode_subscription([]))
    number = {sub_id: store.subscription_number(sub_id) for sub_id in ("m1", "m2", "m3")}
    refused = await exchange(tcp, {"subscriptionIds": ["m1", "nobody"], "authHash": ALICE})
    assert refused[0]["field"] == "subscriptionIds" and refused[0]["status"] == 404 and "nobody" in refused[0]["error"]
    polling = asyncio.create_task(gateway.hub.poll())
    reader, writer = await asyncio.open_connection("127.0.0.1", tcp)
    writer.write(orjson.dumps({"subscriptionIds": ["m1", "m2", "m3"], "authHash": ALICE}) + b"\n")
    try:
        while len(gateway.hub.holders) < 3:
            await asyncio.sleep(0.01)
        first, second = store.append_publications([Publication(b'{"n":1}', "bob"), Publication(b'{"n":2}', "bob")])
        # first to m1 and m3, second to m2 only; the feed lists matches by subscription
        pairs = sorted([(number["m1"], first), (number["m3"], first), (number["m2"], second)])
        store.record_deliveries(np.array([s for s, _ in pairs]), np.array([p for _, p in pairs]), second)
        lines = [orjson.loads(await asyncio.wait_for(reader.readline(), 5)) for _ in range(2)]
        assert [(line["seq"], sorted(line["subscriptionIds"]), line["publication"]) for line in lines] == [
            (first, ["m1", "m3"], {"n": 1}),
            (second, ["m2"], {"n": 2}),
        ]
        writer.write(orjson.dumps({"ack": second}) + b"\n")  # covers all three
        await gateway.hub.kick("m2", b'{"error":"unsubscribed","field":"subscriptionId","status":404}')
        ended = orjson.loads(await asyncio.wait_for(reader.readline(), 5))
        assert ended["subscriptionId"] == "m2" and set(gateway.hub.holders) == {"m1", "m3"}
        await gateway.hub.flush_cursors()
        assert [store.cursor(s) for s in ("m1", "m3")] == [first, first]
    finally:
        writer.close()
        polling.cancel()
