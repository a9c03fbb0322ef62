"""Top-k/w subscriptions end to end: the k best of a sliding window, delivered once, including a
reading promoted when a better one leaves the window with nothing else published."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.integration.helpers import client_for, nothing_more, run_id, take
from veil.client import VeilError
from veil.harness import BrokerProcess


@pytest.fixture(scope="module", params=["rounds", "micro-batch"])
def broker(request, tmp_path_factory):
    """A broker per trigger: both decide the skybands with the same round core, recorded alike."""
    process = BrokerProcess(str(tmp_path_factory.mktemp("broker")), "--trigger", request.param).start()
    yield process
    process.close()


def top(k: int, window_ms: int) -> dict:
    return {"k": k, "w": window_ms, "score": [{"key": "v", "prefer": "high"}]}


async def test_the_k_best_of_the_window_and_a_late_promotion(broker):
    rid = run_id()
    async with client_for(broker, "tina") as client:
        sub = (await client.subscribe([{"key": "run", "val": rid, "op": "eq"}], topk=top(2, 4000)))["subscriptionId"]
        async with client.deliveries(sub) as stream:
            ids = {}
            started = time.monotonic()
            for v in (5, 9, 1, 7):
                ids[v] = await client.publish({"run": rid, "v": v})
                await asyncio.sleep(0.01)  # log times are in ms: two in one ms leave the window together
            await client.publish({"run": "someone else's", "v": 100})
            on_arrival = await take(stream, 3)
            assert [d.publication["v"] for d in on_arrival] == [5, 9, 7]  # 1 ranked third; 7 pushed 5 out
            assert [d.id for d in on_arrival] == [ids[5], ids[9], ids[7]]
            # 5 and then 9 leave the window 4 s after they came; with 9 gone, 1 is among the best two
            (late,) = await take(stream, 1, timeout=30)
            assert late.publication["v"] == 1 and late.id == ids[1]
            assert time.monotonic() - started > 3.5
            await nothing_more(stream, 2)


async def test_a_count_window_counts_only_what_enters_it(broker):
    """k=1 of the last 2: 9 is best until the second reading after it arrives; a reading the terms
    cannot rank, or another subscription's, moves nothing."""
    rid = run_id()
    async with client_for(broker, "tina") as client:
        topk = {"k": 1, "n": 2, "score": [{"key": "v", "prefer": "high"}]}
        sub = (await client.subscribe([{"key": "run", "val": rid, "op": "eq"}], topk=topk))["subscriptionId"]
        async with client.deliveries(sub) as stream:
            nine = await client.publish({"run": rid, "v": 9})
            five = await client.publish({"run": rid, "v": 5})
            await client.publish({"run": rid, "w": 3})
            await client.publish({"run": "someone else's", "v": 100})
            (first,) = await take(stream, 1)
            assert first.id == nine
            await nothing_more(stream, 2)  # 9 is still one of the last two rankable readings
            await client.publish({"run": rid, "v": 1})
            (promoted,) = await take(stream, 1)  # 9 left as 1 came: 5 is the best of {5, 1}
            assert promoted.id == five and promoted.publication["v"] == 5
            await nothing_more(stream, 2)
        listed = await client.subscriptions()
        assert [s["topk"] for s in listed if s["subscriptionId"] == sub] == [topk | {"score": [
            {"key": "v", "weight": 1.0, "prefer": "high"}]}]  # fmt: skip


async def test_bad_top_k_requests_name_the_field(broker):
    async with client_for(broker, "tina") as client:
        for topk, field in (
            ({"k": 0, "w": 10, "score": [{"key": "v", "prefer": "high"}]}, "topk.k"),
            ({"k": 1, "w": -1, "score": [{"key": "v", "prefer": "high"}]}, "topk.w"),
            ({"k": 1, "w": 10, "score": []}, "topk.score"),
            ({"k": 1, "w": 10, "score": [{"key": "v", "prefer": "up"}]}, "topk.score[0].prefer"),
            ({"k": 1, "w": 10, "score": [{"key": "v"}]}, "topk.score[0]"),
            ({"k": 1, "n": 0, "score": [{"key": "v", "prefer": "high"}]}, "topk.n"),
            ({"k": 1, "n": 10, "w": 10, "score": [{"key": "v", "prefer": "high"}]}, "topk"),
        ):
            with pytest.raises(VeilError) as caught:
                await client.subscribe([], topk=topk)
            assert caught.value.status == 400 and caught.value.field == field


async def test_skybands_survive_a_restart_without_duplicates(tmp_path):
    broker = BrokerProcess(str(tmp_path)).start()
    rid = run_id()
    try:
        async with client_for(broker, "uma") as client:
            # A cold pipeline's first batch can take seconds; the window must not close before the check
            await client.publish({"run": "warm-up"})
            await asyncio.to_thread(broker.wait_processed)
            sub = (await client.subscribe([{"key": "run", "val": rid, "op": "eq"}], topk=top(1, 10_000)))[
                "subscriptionId"
            ]
            async with client.deliveries(sub) as stream:
                first = await client.publish({"run": rid, "v": 3})
                await asyncio.sleep(0.01)  # a later ms: `second` outlives `first` in the window
                second = await client.publish({"run": rid, "v": 1})
                assert [d.id for d in await take(stream, 1)] == [first]
                await nothing_more(stream, 1)
        assert broker.stop() == 0
        broker.start()
        async with client_for(broker, "uma") as client, client.deliveries(sub) as stream:
            (late,) = await take(stream, 1, timeout=40)  # 3 left the window: 1 is now the best
            assert late.id == second
            await nothing_more(stream, 3)
    finally:
        broker.close()
