"""A subscription's dead letters over REST, in-process: read a page at a time with what its subscriber
would have been delivered, replayed as log entries for the pipeline, purged; by the owner or an
admin only, everyone else answered as for no subscription; limits refused by name."""

import time

import orjson
import pytest

from tests.gateway.conftest import ALICE, BOB, ROOT
from veil.store import KIND_REDELIVER, Publication, QueueBounds, Round

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def request(http, method, path, auth=ALICE, body=None):
    response = await http.request(method, path, data=body, headers={} if auth is None else {"X-Auth-Hash": auth})
    return response.status, orjson.loads(await response.read())


async def subscribe(http, doc, auth=ALICE):
    return await request(http, "POST", "/subscribe", auth, orjson.dumps({"authHash": auth, **doc}))


def dead_lettered(gateway, sub_id: str, count: int) -> list[int]:
    """`count` publications queued for the subscription past its bound of one delivery, dead-lettered."""
    store = gateway.threads.store
    number = store.subscription_number(sub_id)
    pubs = store.append_publications([Publication(b'{"n":%d}' % n, "bob") for n in range(count + 1)])
    store.record_round(Round([number] * len(pubs), pubs, store.head_offset()))
    while store.compact(1000, 1 << 40, time.time() + 10):
        pass
    bounds = QueueBounds(1, 10**9, 10**12)
    assert store.bound_queues(bounds, time.time_ns() // 1_000_000, time.time() - 10, 1000) == count
    return pubs[:count]


async def test_the_owner_reads_replays_and_purges_its_dead_letters(http, gateway):
    assert (await subscribe(http, {"data": [], "subscriptionId": "s"}))[0] == 200
    pubs = dead_lettered(gateway, "s", 3)
    status, page = await request(http, "GET", "/subscriptions/s/dead-letters?limit=2")
    assert status == 200 and page["next"] is not None
    assert [(d["id"], d["reason"], d["publisher"], d["publication"]) for d in page["deadLetters"]] == [
        (str(pubs[0]), "deliveries", "bob", {"n": 0}),
        (str(pubs[1]), "deliveries", "bob", {"n": 1}),
    ]
    status, rest = await request(http, "GET", f"/subscriptions/s/dead-letters?after={page['next']}")
    assert [d["id"] for d in rest["deadLetters"]] == [str(pubs[2])] and rest["next"] is None
    first = page["deadLetters"][0]["seq"]
    store = gateway.threads.store
    head = store.head_offset()
    status, reply = await request(http, "POST", "/subscriptions/s/dead-letters/replay", body=b'{"upto": %d}' % first)
    assert (status, reply) == (200, {"replayed": 1, "left": 0})
    [entry] = store.log_range(head, store.head_offset())
    assert (entry.kind, entry.sub_id, entry.body) == (KIND_REDELIVER, "s", b'{"n":0}')
    assert await request(http, "DELETE", "/subscriptions/s/dead-letters", ROOT) == (200, {"purged": 2})  # an admin
    assert (await request(http, "GET", "/subscriptions/s/dead-letters"))[1]["deadLetters"] == []


async def test_another_client_is_answered_as_for_no_subscription_and_bad_requests_name_their_field(http, gateway):
    assert (await subscribe(http, {"data": [], "subscriptionId": "t"}))[0] == 200
    dead_lettered(gateway, "t", 1)
    for method, path in (("GET", "/subscriptions/t/dead-letters"), ("DELETE", "/subscriptions/t/dead-letters"),
                         ("POST", "/subscriptions/t/dead-letters/replay")):  # fmt: skip
        status, reply = await request(http, method, path, BOB)
        assert (status, reply["field"]) == (404, "subscriptionId")
        status, reply = await request(http, method, path, None)
        assert status in (401, 403)
    for path, field in (("?limit=0", "limit"), ("?limit=1001", "limit"), ("?after=-1", "after")):
        status, reply = await request(http, "GET", "/subscriptions/t/dead-letters" + path)
        assert (status, reply["field"]) == (400, field)
    status, reply = await request(http, "POST", "/subscriptions/t/dead-letters/replay", body=b'{"upto": "x"}')
    assert (status, reply["field"]) == (400, "upto")
    assert (await request(http, "GET", "/subscriptions/t/dead-letters"))[1]["deadLetters"] != []  # untouched


async def test_limits_beyond_the_operators_are_refused_by_name(http, gateway):
    gateway.config.max_queued_deliveries = 100
    status, reply = await subscribe(http, {"data": [], "limits": {"deliveries": 101}})
    assert (status, reply["field"]) == (400, "limits.deliveries") and "--max-queued-deliveries" in reply["error"]
    for limits, field in (({"deliveries": 0}, "limits.deliveries"), ({"age": True}, "limits.age"),
                          ({"size": 1}, "limits"), ([1], "limits")):  # fmt: skip
        status, reply = await subscribe(http, {"data": [], "limits": limits})
        assert (status, reply["field"]) == (400, field)
    assert (await subscribe(http, {"data": [], "subscriptionId": "u", "limits": {"deliveries": 100, "age": 60000}}))[
        0
    ] == 200
