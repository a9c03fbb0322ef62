"""Defence in depth: log entries that make the match task raise or hang (switched on by the fault
injection points of `veil.pipeline.guard`) are quarantined, and everything else is delivered exactly
once, in order; the quarantine shows in /health and in the admin API."""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import pytest

from tests.integration.helpers import LineConnection, nothing_more, run_id, take
from veil.client import VeilClient
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow
ADMIN, ALICE = "root-secret-1", "alice-secret-1"
RAISE, HANG = "poison-raises", "poison-hangs"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("quarantine"))
    registry = os.path.join(directory, "registry.json")
    with open(registry, "w") as handle:
        json.dump({"admins": ["root"], "hashes": {ADMIN: "root", ALICE: "alice"}, "rules": {"*": [[]]}}, handle)
    process = BrokerProcess(
        os.path.join(directory, "broker"), "--auth", "hash", "--anonymous", "false", "--registry", registry,
        "--entry-timeout", "3",
        env={"VEIL_FAULT_RAISE": RAISE, "VEIL_FAULT_HANG": HANG},
    ).start()  # fmt: skip
    yield process
    process.close()


def client(broker: BrokerProcess, auth_hash: str = ALICE) -> VeilClient:
    return VeilClient(broker.url, auth_hash=auth_hash, tcp_port=broker.tcp_port, ws_port=broker.ws_port)


async def quarantined(broker: BrokerProcess) -> list[dict]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{broker.url}/admin/quarantine", headers={"X-Auth-Hash": ADMIN}) as response,
    ):
        assert response.status == 200
        return (await response.json())["entries"]


async def test_poison_publications_are_set_aside_and_the_rest_delivered_once_in_order(broker):
    rid = run_id()
    started = time.monotonic()
    async with client(broker) as alice:
        sub = (await alice.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
        async with alice.deliveries(sub) as stream:
            await stream.connected.wait()
            sent, poison = [], {}
            for n in range(150):
                if n in (40, 100):
                    marker = RAISE if n == 40 else HANG
                    reply = await alice.publish({"run": rid, "n": n, "marker": marker})
                    poison[int(reply)] = marker
                    continue
                sent.append(n)
                await alice.publish({"run": rid, "n": n})
            got = await take(stream, len(sent), timeout=120)
            await nothing_more(stream, 3)
            assert stream.dropped_duplicates == 0
    assert [d.publication["n"] for d in got] == sent  # each once, in order, none of the poison
    assert time.monotonic() - started < 120
    entries = {e["offset"]: e for e in await quarantined(broker)}
    assert set(poison) <= set(entries)
    for offset, marker in poison.items():
        entry = entries[offset]
        assert entry["kind"] == "publication" and entry["owner"] == "alice" and marker in entry["body"]
        assert ("RuntimeError" if marker == RAISE else "EntryTimeout") in entry["error"]
    health = broker.health()
    assert health["status"] == "degraded" and health["quarantined"] >= 2
    assert any("quarantined" in problem for problem in health["problems"])
    assert health["pipeline"] == "running"  # degraded by the quarantine, yet serving

    async with aiohttp.ClientSession() as http:
        for offset in poison:
            async with http.delete(f"{broker.url}/admin/quarantine/{offset}", headers={"X-Auth-Hash": ALICE}) as r:
                assert r.status == 403  # admins only
            async with http.delete(f"{broker.url}/admin/quarantine/{offset}", headers={"X-Auth-Hash": ADMIN}) as r:
                assert r.status == 200
            async with http.delete(f"{broker.url}/admin/quarantine/{offset}", headers={"X-Auth-Hash": ADMIN}) as r:
                assert r.status == 404
    assert not set(poison) & {e["offset"] for e in await quarantined(broker)}


async def test_a_poison_subscription_is_refused_and_its_owner_told(broker):
    rid = run_id()
    async with client(broker) as alice:
        poison = (await alice.subscribe([{"key": "run", "val": f"{rid}-{RAISE}", "op": "eq"}]))["subscriptionId"]
        conn = await LineConnection.open(broker.tcp_port, {"authHash": ALICE, "subscriptionId": poison})
        error = await conn.line(timeout=60)  # on the open channel once the pipeline set it aside
        assert (error["status"], error["field"]) == (422, "subscriptionId") and "quarantined" in error["error"]
        conn.close()
        again = await LineConnection.open(broker.tcp_port, {"authHash": ALICE, "subscriptionId": poison})
        assert (await again.line(timeout=10))["status"] == 422  # and on every later handshake
        again.close()
        healthy = (await alice.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
        async with alice.deliveries(healthy) as stream:
            await alice.publish({"run": rid, "n": 1})
            assert [d.publication["n"] for d in await take(stream, 1)] == [1]
    entry = next(e for e in await quarantined(broker) if e["subscriptionId"] == poison)
    assert entry["kind"] == "subscription" and entry["owner"] == "alice"
    async with (
        aiohttp.ClientSession() as http,
        http.delete(f"{broker.url}/admin/quarantine/{entry['offset']}", headers={"X-Auth-Hash": ADMIN}) as response,
    ):
        assert response.status == 200  # dropped: the subscription is removed with it
    conn = await LineConnection.open(broker.tcp_port, {"authHash": ALICE, "subscriptionId": poison})
    assert (await conn.line(timeout=10))["status"] == 404
    conn.close()
    deadline = time.monotonic() + 20  # the health report follows the quarantine (within seconds when idle)
    while broker.health()["quarantined"] != 0:
        assert time.monotonic() < deadline, (broker.health(), await quarantined(broker))
        await asyncio.sleep(0.2)
