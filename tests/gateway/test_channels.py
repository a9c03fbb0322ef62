"""Delivery connections in-process: handshakes refused with the reason, and an edge broker's channel
(which needs the log, not the pipeline)."""

import asyncio

import orjson
import pytest

from tests.gateway.conftest import ALICE, BOB
from veil.gateway.tcp import start_tcp
from veil.matching.stored import encode_subscription

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
