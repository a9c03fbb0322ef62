"""REST behaviour of the gateway, in-process: answers, errors naming their field, ownership,
the admin API and health, and what reaches the store."""

import asyncio
import time

import orjson
import pytest

from tests.gateway.conftest import ALICE, BOB, ROOT
from veil.store import KIND_PUBLICATION, KIND_SUBSCRIBE

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the loop the fixtures run on
BOX = [{"key": "lat", "val": 1.0, "type": "double", "op": "ge"}]


async def post(http, path, doc, auth=ALICE, **headers):
    """A request as a client sends it: the static hash in the header of a publish, in the body otherwise."""
    if path != "/publish":
        doc = {"authHash": auth, **doc}
    response = await http.post(path, data=orjson.dumps(doc), headers={"X-Auth-Hash": auth, **headers})
    return response.status, orjson.loads(await response.read())


def logged(gateway, kind):
    store = gateway.threads.store
    return [entry for entry in store.log_range(0, store.head_offset()) if entry.kind == kind]


async def test_a_publication_is_logged_with_its_publisher_and_acknowledged_with_its_offset(http, gateway):
    status, reply = await post(http, "/publish", {"lat": 2.5})
    assert status == 200
    [entry] = logged(gateway, KIND_PUBLICATION)
    assert (str(entry.offset), entry.kind, entry.body, entry.client) == (
        reply["id"],
        KIND_PUBLICATION,
        b'{"lat":2.5}',
        "alice",
    )


async def test_a_batch_is_acknowledged_with_one_id_per_line_in_order(http):
    response = await http.post(
        "/publish", data=b'{"n":1}\n{"n":2}\n', headers={"X-Auth-Hash": ALICE, "Content-Type": "application/x-ndjson"}
    )
    ids = (await response.json())["ids"]
    assert response.status == 200 and len(ids) == 2 and int(ids[1]) == int(ids[0]) + 1


async def test_subscribe_says_where_deliveries_are_served_and_logs_the_subscription(http, gateway):
    status, reply = await post(http, "/subscribe", {"data": BOX, "subscriptionId": "s1"})
    config = gateway.config
    assert status == 200
    assert reply == {"host": config.hostname, "port": config.tcp, "ws-port": config.ws, "wsport": config.ws,
                     "subscriptionId": "s1"}  # fmt: skip
    store = gateway.threads.store
    [entry] = logged(gateway, KIND_SUBSCRIBE)
    assert (entry.kind, entry.sub_id, entry.client, entry.number) == (
        KIND_SUBSCRIBE, "s1", "alice", store.subscription_number("s1")
    )  # fmt: skip


@pytest.mark.parametrize(
    ("path", "doc", "field", "status"),
    [
        ("/subscribe", {"data": [{"key": "a", "val": 1, "op": "zz"}]}, "data[0].op", 400),
        ("/subscribe", {"data": [{"key": "a", "val": 1, "op": "gt"}, {"key": "a", "val": 0, "op": "lt"}]}, "data", 400),
        ("/unsubscribe", {"subscriptionId": "nobody"}, "subscriptionId", 404),
        ("/unpublish", {"id": "999"}, "id", 404),
        ("/revoke", {"announcementId": "nobody"}, "announcementId", 404),
    ],
)
async def test_mistakes_are_refused_naming_the_field(http, path, doc, field, status):
    got_status, body = await post(http, path, doc)
    assert (got_status, body["field"], body["status"]) == (status, field, status)


async def test_an_id_of_another_client_is_refused_with_403_naming_the_id_field(http):
    assert (await post(http, "/subscribe", {"data": BOX, "subscriptionId": "mine"}))[0] == 200
    status, body = await post(http, "/subscribe", {"data": BOX, "subscriptionId": "mine"}, auth=BOB)
    assert (status, body["field"]) == (403, "subscriptionId")  # ids are global: a live one is taken
    # unsubscribing another's subscription is answered as for an id nobody holds
    assert await post(http, "/unsubscribe", {"subscriptionId": "mine"}, auth=BOB) == await post(
        http, "/unsubscribe", {"subscriptionId": "nobody"}, auth=BOB
    )
    _, published = await post(http, "/publish", {"v": 1}, **{"X-Valid-For": "60000"})
    # another client's publication or announcement is answered as none, the same answer to the byte
    missing = str(int(published["id"]) + 10_000)
    assert await post(http, "/unpublish", {"id": published["id"]}, auth=BOB) == await post(
        http, "/unpublish", {"id": missing}, auth=BOB
    )
    assert (await post(http, "/announce", {"data": BOX, "announcementId": "edge"}))[0] == 200
    assert await post(http, "/revoke", {"announcementId": "edge"}, auth=BOB) == await post(
        http, "/revoke", {"announcementId": "no-such-edge"}, auth=BOB
    )


async def test_unknown_credentials_are_401_and_unknown_paths_404(http):
    status, body = await post(http, "/publish", {"v": 1}, auth="not-a-declared-secret")
    assert (status, body["field"]) == (401, "authHash")
    response = await http.get("/nowhere")
    assert response.status == 404 and (await response.json())["field"] == "path"


async def test_overload_is_503_with_retry_after_and_nothing_is_stored(http, gateway):
    body = b"\n".join(b'{"n":%d}' % i for i in range(65))
    response = await http.post(
        "/publish", data=body, headers={"X-Auth-Hash": ALICE, "Content-Type": "application/x-ndjson"}
    )
    assert response.status == 413  # more lines than may wait for the log: refused whole
    assert logged(gateway, KIND_PUBLICATION) == []
    gateway.ingest.head, gateway.ingest.processed = gateway.config.max_lag + 10, 0
    response = await http.post("/publish", data=b"{}", headers={"X-Auth-Hash": ALICE})
    assert response.status == 503 and response.headers["Retry-After"] == "2"


async def test_the_registry_is_for_admins_and_a_replacement_is_logged(http, gateway):
    response = await http.get("/admin/registry", headers={"X-Auth-Hash": ALICE})
    assert response.status == 403
    registry = {**orjson.loads(gateway.registry.current.to_json()), "admins": ["root", "alice"]}
    headers = {"X-Auth-Hash": ROOT, "X-Registry-Version": str(gateway.registry.version)}
    response = await http.put("/admin/registry", data=orjson.dumps(registry), headers=headers)
    assert response.status == 200 and "alice" in (await response.json())["admins"]
    assert (await http.get("/admin/registry", headers={"X-Auth-Hash": ALICE})).status == 200
    assert orjson.loads(gateway.threads.store.registry_at())["admins"] == ["root", "alice"]


async def test_health_reports_a_gateway_without_a_running_pipeline_as_not_ready(http):
    health = await http.get("/health")
    assert health.status == 200 and (await health.json())["pipeline"] == "starting"
    assert (await http.get("/ready")).status == 503


async def test_metrics_in_prometheus_format_agree_with_the_traffic(http, gateway):
    from prometheus_client.parser import text_string_to_metric_families

    from veil.monitoring.metrics import STORE_FRESH

    def samples(text: str) -> dict[tuple[str, tuple], float]:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    before = samples(await (await http.get("/metrics")).text())
    for n in range(3):
        assert (await post(http, "/publish", {"n": n}))[0] == 200
    assert (await post(http, "/publish", [1, 2]))[0] == 400
    await asyncio.sleep(STORE_FRESH)  # the store's figures are read at most once a second
    response = await http.get("/metrics")
    assert response.status == 200 and response.content_type == "text/plain"
    after = samples(await response.text())

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert grew("veil_publications_total") == 3
    assert grew("veil_http_responses_total", route="/publish", status="200") == 3
    assert grew("veil_http_responses_total", route="/publish", status="400") == 1
    assert grew("veil_received_publications_total") == 3  # the store's count
    assert after[("veil_batch_duration_seconds_count", ())] == 0  # no pipeline here
    health = await (await http.get("/health")).json()
    assert after[("veil_log_head", ())] == health["head"]
    assert after[("veil_pipeline_state", (("state", health["pipeline"]),))] == 1


async def test_the_grafana_dashboard_asks_only_for_metrics_the_gateway_exposes(http):
    import json
    import pathlib
    import re

    from prometheus_client.parser import text_string_to_metric_families

    await http.get("/health")  # an answer counted, so that the labelled counters have samples
    exposed = {
        s.name for f in text_string_to_metric_families(await (await http.get("/metrics")).text()) for s in f.samples
    }
    dashboard = json.loads((pathlib.Path(__file__).parents[2] / "deploy" / "grafana-dashboard.json").read_text())
    asked = {name for panel in dashboard["panels"] for target in panel["targets"]
             for name in re.findall(r"\bveil_[a-z_]+", target["expr"])}  # fmt: skip
    assert asked and asked <= exposed, asked - exposed


async def test_a_replay_is_bounded_and_one_at_a_time_per_client(http, gateway):
    """No pipeline runs here: a subscription made with `since` stays unmatched."""
    gateway.config.retention, gateway.config.max_replay = 600, 3
    since = int(time.time() * 1000) - 1000
    for n in range(3):
        await post(http, "/publish", {"n": n})
    status, reply = await post(http, "/subscribe", {"data": [], "since": since})
    assert (status, reply["field"]) == (413, "since") and "--max-replay" in reply["error"]
    gateway.config.max_replay = 1000
    assert (await post(http, "/subscribe", {"data": [], "since": since}))[0] == 200
    status, reply = await post(http, "/subscribe", {"data": [], "since": since})
    assert (status, reply["field"]) == (429, "since")
    assert (await post(http, "/subscribe", {"data": []}))[0] == 200  # without a replay
    assert (await post(http, "/subscribe", {"data": [], "since": since}, auth=BOB))[0] == 200  # another's
    status, reply = await post(http, "/subscribe", {"data": [], "since": since - 601_000}, auth=BOB)
    assert (status, reply["field"]) == (400, "since")
