"""Retention and replay with a real broker: a subscription asking for its matches since a time gets
exactly what a query over the broker's own SQLite log says was retained and matches, in publication
order, once, before anything newer; what the retention cannot reach is refused by name."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time

import orjson
import pytest

from tests.integration.helpers import client_for, nothing_more, run_id, take
from veil.client import VeilError
from veil.harness import BrokerProcess
from veil.store import KIND_CANCEL, KIND_PUBLICATION

RETENTION = 600  # seconds


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    process = BrokerProcess(str(tmp_path_factory.mktemp("broker")), "--retention", str(RETENTION)).start()
    yield process
    process.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def oracle(broker: BrokerProcess, rid: str, since: int, ks: set[int]) -> list[str]:
    """The retained publications of the run logged since `since` whose k is one of `ks` and that were
    not withdrawn: read from the broker's log itself."""
    db = sqlite3.connect(f"file:{os.path.join(broker.data_dir, 'veil.db')}?mode=ro", uri=True)
    try:
        withdrawn = {row[0] for row in db.execute("SELECT copy_of FROM log WHERE kind = ?", (KIND_CANCEL,))}
        rows = db.execute(
            "SELECT offset, body FROM log WHERE kind = ? AND time >= ? ORDER BY offset", (KIND_PUBLICATION, since)
        ).fetchall()
    finally:
        db.close()
    return [
        str(offset)
        for offset, body in rows
        if (doc := orjson.loads(body)).get("run") == rid and doc.get("k") in ks and offset not in withdrawn
    ]


async def test_a_replay_since_a_time_is_what_the_retained_log_says_then_live(broker):
    rid = run_id()
    async with client_for(broker, "ruth") as publisher, client_for(broker, "sam") as subscriber:
        for n in range(40):  # before `since`: never replayed
            await publisher.publish({"run": rid, "k": n % 4, "n": n})
        await asyncio.sleep(0.05)
        since = now_ms()
        await asyncio.sleep(0.05)
        ids = await publisher.publish_batch([{"run": rid, "k": n % 4, "n": n} for n in range(40, 400)])
        withdrawn = await publisher.publish({"run": rid, "k": 1, "n": 400}, valid_for=600_000)
        await publisher.publish({"run": "another", "k": 1})
        await publisher.unpublish(withdrawn)
        await asyncio.to_thread(broker.wait_processed)
        expected = oracle(broker, rid, since, {1, 2})
        assert 150 <= len(expected) <= 190 and set(expected) <= set(ids)

        data = [{"key": "run", "val": rid, "op": "eq"}, {"key": "k", "val": [1, 2], "op": "in"}]
        sub_id = (await subscriber.subscribe(data, since=since))["subscriptionId"]
        async with subscriber.deliveries(sub_id) as stream:
            replayed = await take(stream, len(expected))
            assert [d.id for d in replayed] == expected  # in publication order, each once
            live = await publisher.publish({"run": rid, "k": 2, "n": 401})
            assert [d.id for d in await take(stream, 1)] == [live]
            await nothing_more(stream)

        # a subscription without `since` gets only what comes after it
        plain = (await subscriber.subscribe(data))["subscriptionId"]
        async with subscriber.deliveries(plain) as stream:
            newer = await publisher.publish({"run": rid, "k": 1, "n": 402})
            assert [d.id for d in await take(stream, 1)] == [newer]
            await nothing_more(stream)


async def test_a_since_out_of_reach_is_refused_by_name(broker):
    async with client_for(broker, "sam") as subscriber:
        for since in (now_ms() - (RETENTION + 60) * 1000, "the day before", "2026-01-01T00:00:00"):
            with pytest.raises(VeilError) as refused:
                await subscriber.subscribe([], since=since)  # type: ignore[arg-type]  # a hostile client's
            assert (refused.value.status, refused.value.field) == (400, "since")
        topk = {"k": 1, "w": 1000, "score": [{"key": "a", "prefer": "high"}]}
        with pytest.raises(VeilError) as refused:
            await subscriber.subscribe([], topk=topk, since=now_ms())
        assert (refused.value.status, refused.value.field) == (400, "since")


def test_the_command_line_replays_since_a_time_ago(broker):
    rid = run_id()
    veil = [sys.executable, "-m", "veil.cli"]
    published = [
        subprocess.run(
            [*veil, "publish", "--url", broker.url, orjson.dumps({"run": rid, "n": n}).decode()],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        for n in range(3)
    ]  # fmt: skip
    broker.wait_processed()
    replayed = subprocess.run(
        [*veil, "subscribe", "--url", broker.url, "--auth-hash", "cli", "--since", "5m", "--count", "3", f"run={rid}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    assert [orjson.loads(line)["id"] for line in replayed.stdout.splitlines()] == published
    refused = subprocess.run(
        [*veil, "subscribe", "--url", broker.url, "--since", "2026-11-29", "a=1"], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "--since" in refused.stderr


async def test_replacing_a_subscription_with_since_sends_nothing_twice(broker):
    rid = run_id()
    data = [{"key": "run", "val": rid, "op": "eq"}]
    async with client_for(broker, "ruth") as publisher, client_for(broker, "sam") as subscriber:
        since = now_ms()
        await asyncio.sleep(0.01)
        sub_id = (await subscriber.subscribe(data))["subscriptionId"]
        async with subscriber.deliveries(sub_id) as stream:
            sent = [await publisher.publish({"run": rid, "n": n}) for n in range(3)]
            assert [d.id for d in await take(stream, 3)] == sent
        queued = [await publisher.publish({"run": rid, "n": n}) for n in range(3, 6)]  # nobody connected
        await asyncio.to_thread(broker.wait_processed)
        await subscriber.subscribe(data, sub_id, since=since)  # its replay is all six again
        async with subscriber.deliveries(sub_id) as stream:
            assert [d.id for d in await take(stream, 3)] == queued  # each once, the sent ones not again
            newer = await publisher.publish({"run": rid, "n": 6})
            assert [d.id for d in await take(stream, 1)] == [newer]
            await nothing_more(stream)
