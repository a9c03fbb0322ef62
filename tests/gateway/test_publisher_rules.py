"""Publisher self-service, in-process: a publisher manages the policies and cropping rules of its
own publications without admin rights, and cannot touch anyone else's."""

import orjson
import pytest

from tests.gateway.conftest import ALICE, BOB, ROOT

pytestmark = pytest.mark.asyncio(loop_scope="module")
POLICY = {"data": [{"key": "id", "val": "truck-bcd", "op": "eq"}], "group": "A"}
CROP = {"data": [], "fields": ["amount"], "groups": ["auditors"]}


async def call(http, method: str, auth: str, body: object = None):
    response = await http.request(
        method, "/publisher/rules", data=None if body is None else orjson.dumps(body), headers={"X-Auth-Hash": auth}
    )
    return response.status, await response.json()


async def registry(http) -> dict:
    return await (await http.get("/admin/registry", headers={"X-Auth-Hash": ROOT})).json()


NONE_SET = {"admins": {"policies": [], "cropping": []}}  # by the admins, on the caller's publications


async def test_a_publisher_manages_its_own_rules_and_no_one_elses(http):
    assert await call(http, "GET", ALICE) == (200, {"policies": [], "cropping": [], **NONE_SET})
    status, reply = await call(http, "PUT", ALICE, {"policies": [POLICY], "cropping": [CROP]})
    assert (status, reply) == (200, {"policies": [POLICY], "cropping": [CROP], **NONE_SET})
    assert (await call(http, "PUT", BOB, {"policies": []}))[0] == 200  # bob's own, alice's untouched
    stored = await registry(http)
    assert stored["publishers"] == {"alice": {"policies": [POLICY], "cropping": [CROP]}, "bob": {"policies": []}}
    assert stored["admins"] == ["root"] and "policies" not in stored  # nothing else changed
    assert await call(http, "GET", BOB) == (200, {"policies": [], "cropping": [], **NONE_SET})
    reply = (await call(http, "PUT", ALICE, {"cropping": []}))[1]
    assert reply == {"policies": [POLICY], "cropping": [], **NONE_SET}


async def test_mistakes_name_the_field_and_change_nothing(http):
    before = await registry(http)
    status, reply = await call(http, "PUT", ALICE, {"policies": [{"data": [], "group": ""}]})
    assert (status, reply["field"]) == (400, "publishers.alice.policies[0].group")
    status, reply = await call(http, "PUT", ALICE, {"rules": {"*": [[]]}})  # not a publisher's to set
    assert (status, reply["field"]) == (400, "body")
    assert (await call(http, "PUT", "nobody-secret"))[0] == 401
    assert await registry(http) == before
