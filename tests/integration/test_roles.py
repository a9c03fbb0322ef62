"""A deployment in parts on one PostgreSQL store: two gateways (`--role gateway`) and the pipeline on
its own (`--role pipeline`). Publishers post to either gateway and subscribers read from either;
a gateway killed with -9 loses nothing acknowledged, and a subscription is delivered through one
gateway at a time."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.integration.helpers import LineConnection, run_id, take
from veil.client import VeilClient, VeilError
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow


def client_for(gateway: BrokerProcess, auth_hash: str) -> VeilClient:
    return VeilClient(gateway.url, auth_hash=auth_hash, tcp_port=gateway.tcp_port, ws_port=gateway.ws_port)


@pytest.fixture
def deployment(tmp_path, postgres_url):
    store = ("--store", postgres_url, "--partitions", "2")
    gateways = [
        BrokerProcess(str(tmp_path / name), "--role", "gateway", "--gateway-id", name, *store).start(wait_ready=False)
        for name in ("A", "B")
    ]
    pipeline = BrokerProcess(str(tmp_path / "pipeline"), "--role", "pipeline", *store).start(wait_ready=False)
    try:
        for gateway in gateways:
            gateway.wait_ready()
        yield gateways
    finally:
        for process in (*gateways, pipeline):
            process.close()


async def test_publish_anywhere_read_anywhere_and_survive_a_gateway(deployment):
    a, b = deployment
    rid = run_id()
    acknowledged: list[int] = []
    async with client_for(a, "pam") as at_a, client_for(b, "pam") as at_b:
        everything = (await at_a.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
        evens = (
            await at_b.subscribe([{"key": "run", "val": rid, "op": "eq"}, {"key": "even", "val": True, "op": "eq"}])
        )["subscriptionId"]
        streams = {everything: at_b.deliveries(everything), evens: at_b.deliveries(evens, transport="ws")}
        received: dict[str, list[int]] = {everything: [], evens: []}
        for stream in streams.values():
            await stream.__aenter__()
        await at_a.publish({"run": rid, "n": -1, "even": False})
        assert [d.publication["n"] for d in await take(streams[everything], 1)] == [-1]

        # one connection per subscription: the same subscriber through gateway A is refused
        second = await LineConnection.open(a.tcp_port, {"subscriptionId": everything, "authHash": "pam"})
        refusal = await second.line()
        second.close()
        assert refusal is not None and refusal["status"] == 503 and "gateway B" in refusal["error"]

        async def consume(sub_id: str) -> None:
            async for delivery in streams[sub_id]:
                received[sub_id].append(delivery.publication["n"])

        consumers = [asyncio.create_task(consume(s)) for s in streams]
        target = {"client": at_a}

        async def publish_steadily() -> None:
            n = 0
            while True:
                try:
                    await target["client"].publish({"run": rid, "n": n, "even": n % 2 == 0})
                    acknowledged.append(n)
                except (aiohttp.ClientError, VeilError, OSError):
                    pass
                n += 1
                await asyncio.sleep(0.01)

        publisher = asyncio.create_task(publish_steadily())
        started = time.monotonic()
        while len(acknowledged) < 100 and time.monotonic() - started < 60:
            await asyncio.sleep(0.05)
        a.kill()
        target["client"] = at_b  # the load balancer moves the publishers to the gateway left
        while len(acknowledged) < 200 and time.monotonic() - started < 120:
            await asyncio.sleep(0.05)
        publisher.cancel()
        assert len(acknowledged) >= 200, "the publisher was not publishing at a steady rate"

        expected = {everything: acknowledged, evens: [n for n in acknowledged if n % 2 == 0]}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(not set(expected[s]) <= set(received[s]) for s in streams):
            await asyncio.sleep(0.2)
        for sub_id in streams:
            got = received[sub_id]
            assert set(expected[sub_id]) <= set(got), f"lost {sorted(set(expected[sub_id]) - set(got))[:10]}"
            assert len(got) == len(set(got)), "a publication was delivered twice"
            assert got == sorted(got), "publish order was not kept"
        for task in consumers:
            task.cancel()
        for stream in streams.values():
            await stream.aclose()
