"""Publication validity (SPEC §2.5): valid publications are kept and a new subscription receives the
still-valid ones it matches, before anything newer; a publisher can withdraw its own."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.helpers import client_for, nothing_more, run_id, take
from veil.client import VeilError


async def test_new_subscriptions_get_the_still_valid_publications_first(broker):
    rid = run_id()
    async with client_for(broker, "vera") as publisher, client_for(broker, "walt") as subscriber:
        kept = await publisher.publish({"run": rid, "n": 1}, valid_for=600_000)
        await publisher.publish({"run": rid, "n": 2})  # no validity: matched once, never kept
        withdrawn = await publisher.publish({"run": rid, "n": 3}, valid_for=600_000)
        short = await publisher.publish({"run": rid, "n": 4}, valid_for=1000)
        await publisher.publish({"run": "another", "n": 5}, valid_for=600_000)
        await asyncio.to_thread(broker.wait_processed)
        await asyncio.sleep(1.5)  # n=4 is no longer valid

        first = (await subscriber.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
        async with subscriber.deliveries(first) as stream:
            got = await take(stream, 2)
            assert [(d.id, d.publication["n"]) for d in got] == [(kept, 1), (withdrawn, 3)]
            newer = await publisher.publish({"run": rid, "n": 6})
            assert [d.id for d in await take(stream, 1)] == [newer]
            await nothing_more(stream)

        await publisher.unpublish(withdrawn)
        second = (await subscriber.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
        async with subscriber.deliveries(second) as stream:
            assert [d.id for d in await take(stream, 1)] == [kept]
            await nothing_more(stream)

        with pytest.raises(VeilError) as caught:  # another's is answered as none
            await subscriber.unpublish(kept)
        assert (caught.value.status, caught.value.field) == (404, "id")
        for gone in (withdrawn, short, "999999999"):
            with pytest.raises(VeilError) as caught:
                await publisher.unpublish(gone)
            assert (caught.value.status, caught.value.field) == (404, "id")


async def test_bad_validity_is_refused_by_name(broker):
    async with client_for(broker, "vera") as publisher:
        for valid_for in (0, -5, 10**12):
            with pytest.raises(VeilError) as caught:
                await publisher.publish({"n": 1}, valid_for=valid_for)
            assert (caught.value.status, caught.value.field) == (400, "X-Valid-For")
