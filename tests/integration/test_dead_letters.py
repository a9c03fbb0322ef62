"""Queue limits and dead letters with a real broker: a subscription whose subscriber is away keeps
at most what its limits say (count, bytes, age); the oldest past them go to its dead letters with
the reason, never silently (/metrics counts them); its owner reads, replays (delivered again under
their ids, after what was queued) and purges them, by the client library and the command line."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import orjson
import pytest

from tests.integration.helpers import client_for, nothing_more, run_id, take
from veil.client import VeilError

WAIT = 90.0  # seconds for a spill and a pass of the bounds (counts every 5 s, ages every 30), with margin


async def letters(client, sub_id: str, count: int) -> list[dict]:
    """The subscription's dead letters, once there are `count` of them."""
    deadline = time.monotonic() + WAIT
    while True:
        found = [letter async for letter in client.dead_letters(sub_id)]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.5)


async def metric(client, reason: str) -> float:
    async with client.http().get(f"{client.url}/metrics") as response:
        text = await response.text()
    found = re.search(rf'^veil_dead_lettered_total{{reason="{reason}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_past_its_count_the_oldest_leave_and_are_read_replayed_and_purged(broker):
    rid = run_id()
    async with client_for(broker, "pia") as publisher, client_for(broker, "quinn") as subscriber:
        data = [{"key": "run", "val": rid, "op": "eq"}]
        sub_id = (await subscriber.subscribe(data, limits={"deliveries": 5}))["subscriptionId"]
        before = await metric(subscriber, "deliveries")
        ids = await publisher.publish_batch([{"run": rid, "n": n} for n in range(12)])
        dead = await letters(subscriber, sub_id, 7)
        assert [(d["id"], d["reason"], d["publisher"], d["publication"]) for d in dead] == [
            (ids[n], "deliveries", "pia", {"run": rid, "n": n}) for n in range(7)
        ]
        assert await metric(subscriber, "deliveries") >= before + 7
        with pytest.raises(VeilError) as refused:  # another client's: as none
            [letter async for letter in publisher.dead_letters(sub_id)]
        assert (refused.value.status, refused.value.field) == (404, "subscriptionId")
        async with subscriber.deliveries(sub_id) as stream:
            assert [d.id for d in await take(stream, 5)] == ids[7:]  # what the limit kept, in order
            assert await subscriber.replay_dead_letters(sub_id, dead[2]["seq"]) == 3
            replayed = await take(stream, 3)
            assert [(d.id, d.publication["n"]) for d in replayed] == [(ids[n], n) for n in range(3)]
            await nothing_more(stream)
        assert [d["id"] for d in await letters(subscriber, sub_id, 4)] == ids[3:7]
        assert await subscriber.purge_dead_letters(sub_id, dead[4]["seq"]) == 2
        assert [d["id"] async for d in subscriber.dead_letters(sub_id)] == ids[5:7]


async def test_past_its_bytes_and_its_age_the_oldest_leave(broker):
    rid = run_id()
    async with client_for(broker, "pia") as publisher, client_for(broker, "quinn") as subscriber:
        data = [{"key": "run", "val": rid, "op": "eq"}]
        size = len(orjson.dumps({"run": rid, "n": 0}))
        by_bytes = (await subscriber.subscribe(data, limits={"bytes": 3 * size}))["subscriptionId"]
        by_age = (await subscriber.subscribe(data, limits={"age": 1000}))["subscriptionId"]
        ids = await publisher.publish_batch([{"run": rid, "n": n} for n in range(8)])
        assert [(d["id"], d["reason"]) for d in await letters(subscriber, by_bytes, 5)] == [
            (ids[n], "bytes") for n in range(5)
        ]
        aged = await letters(subscriber, by_age, 8)
        assert [(d["id"], d["reason"]) for d in aged] == [(pub, "age") for pub in ids]
        assert all(d["at"] - d["logged"] >= 1000 for d in aged)
        async with subscriber.deliveries(by_bytes) as stream:
            assert [d.id for d in await take(stream, 3)] == ids[5:]
        async with subscriber.deliveries(by_age) as stream:
            newer = await publisher.publish({"run": rid, "n": 8})
            assert [d.id for d in await take(stream, 1)] == [newer]
            await nothing_more(stream)


def test_the_command_line_lists_replays_and_purges_dead_letters(broker):
    rid = run_id()
    veil = [sys.executable, "-m", "veil.cli"]
    flags = ["--url", broker.url, "--auth-hash", "cli-dead"]

    async def prepare() -> tuple[str, list[str]]:
        async with client_for(broker, "pia") as publisher, client_for(broker, "cli-dead") as subscriber:
            data = [{"key": "run", "val": rid, "op": "eq"}]
            sub_id = (await subscriber.subscribe(data, limits={"deliveries": 1}))["subscriptionId"]
            ids = await publisher.publish_batch([{"run": rid, "n": n} for n in range(4)])
            assert len(await letters(subscriber, sub_id, 3)) == 3
            return sub_id, ids

    sub_id, ids = asyncio.run(prepare())
    listed = subprocess.run([*veil, "dead-letters", sub_id, *flags], capture_output=True, text=True, check=True)
    dead = [orjson.loads(line) for line in listed.stdout.splitlines()]
    assert [d["id"] for d in dead] == ids[:3]
    replay = [*veil, "dead-letters", "replay", sub_id, "--upto", str(dead[0]["seq"]), *flags]
    assert subprocess.run(replay, capture_output=True, text=True, check=True).stdout.strip() == "replayed 1"
    purge = subprocess.run([*veil, "dead-letters", "purge", sub_id, *flags], capture_output=True, text=True, check=True)
    assert purge.stdout.strip() == "purged 2"
    missing = subprocess.run([*veil, "dead-letters", "nobody's", *flags], capture_output=True, text=True)
    assert missing.returncode != 0 and "subscriptionId" in missing.stderr
