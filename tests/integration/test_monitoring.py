"""The SELIS monitoring channel (seed 000 §6.1) as a monitoring client speaks it: its authHash in
the handshake, a message every interval with the state, the totals and the rates, over WebSocket
and TCP; totals that match the traffic exactly and survive a restart; the wrong hash gets nothing."""

from __future__ import annotations

import itertools

import aiohttp
import orjson
import pytest

from tests.integration.helpers import LineConnection, client_for, run_id, take
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow
SECRET = "monitoring-secret-1"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("monitoring")
    (directory / "monitoring.conf").write_text(SECRET + "\n")
    process = BrokerProcess(
        str(directory / "data"), "--metrics-auth-hash-file", str(directory / "monitoring.conf"),
        "--metrics-interval", "1",
    ).start()  # fmt: skip
    yield process
    process.close()


class Monitor:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def next(self) -> dict:
        message = await self.ws.receive(timeout=30)
        return orjson.loads(message.data)


async def test_a_monitoring_client_gets_totals_and_rates_at_the_interval(broker):
    rid = run_id()
    async with aiohttp.ClientSession() as session, session.ws_connect(f"ws://127.0.0.1:{broker.ws_port}/") as ws:
        await ws.send_str(orjson.dumps({"authHash": SECRET}).decode())
        monitor = Monitor(ws)
        first = await monitor.next()
        assert set(first) == {"timestamp", "state", "operations", "performance"}
        assert set(first["state"]) == {"subscribers", "subscriptions", "connections", "queued"}
        async with client_for(broker, "watched") as client:
            sub = (await client.subscribe([{"key": "rid", "op": "eq", "val": rid}, {"key": "n", "op": "lt", "val": 5}]))
            async with client.deliveries(sub["subscriptionId"]) as stream:
                await stream.connected.wait()
                for n in range(8):
                    await client.publish({"rid": rid, "n": n})
                await take(stream, 5)
                messages = []
                while True:
                    report = await monitor.next()
                    messages.append(report)
                    grown = {k: report["operations"][k] - first["operations"][k] for k in report["operations"]}
                    if grown == {"received": 8, "matched": 5, "forwarded": 5}:
                        break
                    assert grown["received"] <= 8 and grown["matched"] <= 5 and grown["forwarded"] <= 5
                assert report["state"]["subscriptions"] >= first["state"]["subscriptions"] + 1
                assert report["state"]["connections"] >= 2  # the subscriber and this monitor
        stamps = [first["timestamp"], *(m["timestamp"] for m in messages)]
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        assert all(800 < gap < 2000 for gap in gaps), gaps  # every second, as configured
        counted = sum(
            m["performance"]["receiveRate"] * (b - a) / 1000 for m, (a, b) in zip(messages, itertools.pairwise(stamps), strict=True)
        )
        assert abs(counted - 8) < 0.5, counted  # the rates account for what was published


async def test_the_tcp_port_serves_it_too_and_the_wrong_hash_gets_nothing(broker):
    monitor = await LineConnection.open(broker.tcp_port, {"authHash": SECRET})
    report = await monitor.line()
    assert report is not None and "operations" in report
    monitor.close()
    stranger = await LineConnection.open(broker.tcp_port, {"authHash": "monitoring-secret-2"})
    refusal = await stranger.line()
    assert refusal is not None and refusal["status"] == 400 and "operations" not in refusal
    assert await stranger.silent()
    stranger.close()


async def test_totals_survive_a_restart(broker):
    before = await LineConnection.open(broker.tcp_port, {"authHash": SECRET})
    totals = (await before.line())["operations"]
    before.close()
    assert totals["received"] >= 8
    broker.stop()
    broker.start()
    after = await LineConnection.open(broker.tcp_port, {"authHash": SECRET})
    assert (await after.line())["operations"] == totals
    after.close()
