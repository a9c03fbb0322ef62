"""GET /subscriptions and /subscriptions/{id}: a client finds what it holds, and only that."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import ALICE, BOB
from veil.config import Config
from veil.gateway.rest import create_app
from veil.gateway.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the loop the fixtures run on
SCOPELESS = [{"key": "lat", "op": "gt", "val": 14}]


async def subscribe(http, secret: str, sub_id: str, **more) -> None:
    doc = {"authHash": secret, "subscriptionId": sub_id, "data": SCOPELESS, **more}
    answer = await http.post("/subscribe", json=doc)
    assert answer.status == 200, await answer.text()


async def listed(http, secret: str, **query) -> dict:
    answer = await http.get("/subscriptions", headers={"X-Auth-Hash": secret}, params=query)
    assert answer.status == 200, await answer.text()
    return await answer.json()


async def test_a_client_lists_and_shows_its_own_subscriptions_and_never_anothers(http):
    topk = {"k": 3, "w": 60000, "score": [{"key": "NO2", "prefer": "high"}]}
    await subscribe(http, ALICE, "a-1")
    await subscribe(http, ALICE, "a-2", topk=topk)
    await subscribe(http, BOB, "b-1")
    mine = await listed(http, ALICE)
    assert [s["subscriptionId"] for s in mine["subscriptions"]] == ["a-1", "a-2"] and mine["next"] is None
    assert mine["subscriptions"][0]["data"] == SCOPELESS and mine["subscriptions"][0]["created"].isdigit()
    assert mine["subscriptions"][1]["topk"] == {"k": 3, "w": 60000, "score": [{"key": "NO2", "weight": 1.0, "prefer": "high"}]}
    shown = await http.get("/subscriptions/a-2", headers={"X-Auth-Hash": ALICE})
    assert shown.status == 200 and (await shown.json()) == mine["subscriptions"][1]
    for path, secret in (("/subscriptions/b-1", ALICE), ("/subscriptions/nobody", ALICE)):  # one answer for both
        refused = await http.get(path, headers={"X-Auth-Hash": secret})
        assert refused.status == 404 and (await refused.json())["field"] == "subscriptionId"
    await http.post("/unsubscribe", json={"authHash": ALICE, "subscriptionId": "a-1"})
    assert [s["subscriptionId"] for s in (await listed(http, ALICE))["subscriptions"]] == ["a-2"]
    assert (await http.get("/subscriptions")).status == 401


async def test_pages_follow_one_another_and_a_bad_limit_names_the_field(http):
    for n in range(5):
        await subscribe(http, BOB, f"p-{n}")
    first = await listed(http, BOB, limit="2")
    second = await listed(http, BOB, limit="2", after=first["next"])
    third = await listed(http, BOB, limit="2", after=second["next"])
    ids = [s["subscriptionId"] for page in (first, second, third) for s in page["subscriptions"]]
    assert ids == [f"p-{n}" for n in range(5)] and third["next"] is None
    for limit in ("0", "10001", "x", "-1", "1e3", "٣", "9" * 5000):
        answer = await http.get("/subscriptions", headers={"X-Auth-Hash": BOB}, params={"limit": limit})
        assert answer.status == 400 and (await answer.json())["field"] == "limit"
    for path, field in (("/subscriptions?after=%00", "after"), ("/subscriptions/a%00b", "subscriptionId"),
                        ("/subscriptions?after=" + "x" * 257, "after")):  # fmt: skip
        answer = await http.get(path, headers={"X-Auth-Hash": BOB})
        assert answer.status == 400 and (await answer.json())["field"] == field


async def test_a_page_of_large_subscriptions_ends_early(http):
    values = [f"{n:0>90}" for n in range(1000)]  # about 100 KB a subscription
    for n in range(20):
        await subscribe(http, BOB, f"large-{n:02}", data=[{"key": "id", "op": "in", "val": values}])
    first = await listed(http, BOB, after="large-")
    ids = [s["subscriptionId"] for s in first["subscriptions"]]
    assert 5 < len(ids) < 12 and first["next"] == ids[-1]  # about a megabyte: 11 of them at most
    rest = await listed(http, BOB, after=first["next"])
    assert ids + [s["subscriptionId"] for s in rest["subscriptions"]] == [f"large-{n:02}" for n in range(20)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(after=st.text(max_size=40))
async def test_any_after_lists_only_ones_own(http, after):
    await subscribe(http, ALICE, "alice-only")
    answer = await http.get("/subscriptions", headers={"X-Auth-Hash": BOB}, params={"after": after})
    if answer.status == 400:  # an id no subscription could have
        assert (await answer.json())["field"] == "after" and not after.isprintable()
        return
    page = await answer.json()
    assert answer.status == 200 and all(not s["subscriptionId"].startswith("alice") for s in page["subscriptions"])


@pytest.fixture
async def anonymous_http(tmp_path):
    config = Config(data_dir=str(tmp_path), auth="hash", anonymous=True)
    broker = Broker(config, run_pipeline=False)
    await broker.prepare()
    client = TestClient(TestServer(create_app(broker.gateway)))
    await client.start_server()
    yield client
    await client.close()
    broker.gateway.threads.close()
    broker.gateway.parsing.shutdown(wait=False)


async def test_anonymous_clients_list_nothing_since_they_share_one_identity(anonymous_http):
    answer = await anonymous_http.post("/subscribe", json={"data": SCOPELESS})
    sub_id = (await answer.json())["subscriptionId"]
    for path in ("/subscriptions", f"/subscriptions/{sub_id}"):
        refused = await anonymous_http.get(path)
        assert refused.status == 403 and (await refused.json())["field"] == "authHash"
