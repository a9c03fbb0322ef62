"""Registry versions at the gateway, in-process: changes are compare-and-set on the version they were
made from, a request sees the store's newest version whichever gateway stored it, looks at the store
are shared by the requests that arrive while one runs, and the client redoes its changes on 409."""

import asyncio

import orjson
import pytest

from tests.gateway.conftest import ALICE, ROOT
from veil.client import VeilClient
from veil.gateway.registry import CurrentRegistry
from veil.protocol import ProtocolError
from veil.security.registry import secret_digest

pytestmark = pytest.mark.asyncio(loop_scope="module")


def another_gateway(gateway) -> CurrentRegistry:
    """The registry as a second gateway on the same store holds it."""
    return CurrentRegistry(gateway.threads, gateway.parsing, gateway.config.max_registry)


async def test_a_request_sees_a_version_another_gateway_stored_without_waiting_to_follow(gateway):
    other = another_gateway(gateway)
    await other.load(None)
    await gateway.registry.amend(lambda _, doc: doc["hashes"].pop(secret_digest(ALICE)))
    assert ALICE not in (await other.fresh()).hashes and other.version == gateway.registry.version


async def test_requests_arriving_together_share_looks_at_the_store(gateway, monkeypatch):
    store = gateway.threads.store
    looks = 0
    version = store.registry_version

    def counted() -> int:
        nonlocal looks
        looks += 1
        return version()

    monkeypatch.setattr(store, "registry_version", counted)
    await asyncio.gather(*(gateway.registry.fresh() for _ in range(100)))
    assert 1 <= looks <= 2  # the one under way when they came, and one that began after them


async def test_a_change_from_a_stale_version_is_refused_and_one_without_is_made_again(gateway):
    other = another_gateway(gateway)
    await other.load(None)
    base = other.version
    await gateway.registry.amend(lambda _, doc: doc["admins"].append("first"))
    with pytest.raises(ProtocolError) as stale:
        await other.amend(lambda _, doc: doc["admins"].append("second"), base)
    assert stale.value.status == 409 and f"at version {gateway.registry.version}" in stale.value.problem
    registry, _ = await other.amend(lambda _, doc: doc["admins"].append("third"))  # redone from the newest
    assert registry.document["admins"] == ["root", "first", "third"]


async def test_the_admin_api_needs_the_base_version_and_keeps_the_last_admin(http, gateway):
    current = await http.get("/admin/registry", headers={"X-Auth-Hash": ROOT})
    version, document = current.headers["X-Registry-Version"], await current.json()
    missing = await http.put("/admin/registry", data=orjson.dumps(document), headers={"X-Auth-Hash": ROOT})
    assert (missing.status, (await missing.json())["field"]) == (428, "X-Registry-Version")
    headers = {"X-Auth-Hash": ROOT, "X-Registry-Version": version}
    nobody = await http.put("/admin/registry", data=orjson.dumps({**document, "admins": []}), headers=headers)
    assert (nobody.status, (await nobody.json())["field"]) == (409, "admins")
    changed = await http.put("/admin/registry", data=orjson.dumps({**document, "users": {"x": {}}}), headers=headers)
    assert changed.status == 200 and int(changed.headers["X-Registry-Version"]) > int(version)
    stale = await http.put("/admin/registry", data=orjson.dumps(document), headers=headers)
    assert (
        stale.status == 409 and f"at version {changed.headers['X-Registry-Version']}" in (await stale.json())["error"]
    )
    assert gateway.registry.current.admins == {"root"} and "x" in gateway.registry.current.document["users"]


async def test_the_client_makes_its_change_again_when_another_came_first(http, gateway):
    """Five admins change the registry at once from the same version: the broker takes one at a time
    and refuses the others (409), and each client redoes its own until it lands."""
    url = str(http.make_url("")).rstrip("/")
    clients = [VeilClient(url, auth_hash=ROOT) for _ in range(5)]
    try:
        await asyncio.gather(
            *(c.change_registry(lambda doc, n=n: doc["admins"].append(f"admin-{n}")) for n, c in enumerate(clients))
        )
    finally:
        for c in clients:
            await c.close()
    assert gateway.registry.current.admins == {"root", *(f"admin-{n}" for n in range(5))}


async def test_a_publishers_rules_are_bounded(http, gateway):
    limit = gateway.config.max_publisher_rules
    policy = {"data": [{"key": "k", "val": "x" * 200, "op": "eq"}], "group": "A"}
    body = orjson.dumps({"policies": [policy] * (limit // 200)})
    response = await http.put("/publisher/rules", data=body, headers={"X-Auth-Hash": ALICE})
    reply = await response.json()
    assert response.status == 413 and str(limit) in reply["error"] and "--max-publisher-rules" in reply["error"]
    assert "publishers" not in gateway.registry.current.document
