"""Scopes at the gateway, in-process: who may publish into a scope and subscribe in one, allowed
filters, sealed publications only under the current key held by current members with the keys the
registry lists, and the scope key endpoints: only managers store signed rosters, only current
members fetch envelopes, and the admin API installs none."""

import asyncio
import base64

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from tests.gateway.conftest import ALICE, BOB, REGISTRY, ROOT
from tests.gateway.test_rest import post
from veil.gateway import registry as registry_module
from veil.gateway.registry import CurrentRegistry
from veil.security.rosters import Roster, envelope_digest, sign_roster
from veil.security.sealing import ScopeKey, recipient_public, seal, wrap

pytestmark = pytest.mark.asyncio(loop_scope="module")
CAROL = "carol-secret-1"
PRIVATE = {user: X25519PrivateKey.generate() for user in ("alice", "bob", "carol")}
SIGNING = {user: Ed25519PrivateKey.generate() for user in ("alice", "carol")}


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def registry(members: list[str], recipients: dict | None = None, **scope: object) -> dict:
    return {
        **REGISTRY,
        "hashes": {**REGISTRY["hashes"], CAROL: "carol"},
        "keys": {u: {f"{u}-1": b64(k.public_key().public_bytes_raw())} for u, k in SIGNING.items()},
        "recipients": {u: b64(recipient_public(k)) for u, k in (recipients or PRIVATE).items()},
        "scopes": {"customs": {"users": members, "managers": ["carol"], **scope}},
    }


def signed_version(key: ScopeKey, members: list[str], signer: str = "carol", private=None) -> dict:
    envelopes = {m: wrap(key, recipient_public((private or PRIVATE)[m])) for m in members}
    roster = Roster("customs", key.version, {m: recipient_public((private or PRIVATE)[m]) for m in members},
                    {m: envelope_digest(e) for m, e in envelopes.items()})  # fmt: skip
    body = sign_roster(roster, f"{signer}-1", SIGNING[signer]).document()
    return body | {"envelopes": {m: b64(e) for m, e in envelopes.items()}}


async def put_registry(http, doc: dict) -> None:
    version = (await http.get("/admin/registry", headers={"X-Auth-Hash": ROOT})).headers["X-Registry-Version"]
    headers = {"X-Auth-Hash": ROOT, "X-Registry-Version": version}
    response = await http.put("/admin/registry", data=orjson.dumps(doc), headers=headers)
    assert response.status == 200, await response.text()


async def put_key(http, key: ScopeKey, members: list[str], auth: str = CAROL, body: dict | None = None):
    response = await http.put(
        f"/scopes/customs/keys/{key.version}",
        data=orjson.dumps(body or signed_version(key, members)),
        headers={"X-Auth-Hash": auth},
    )
    return response.status, await response.json()


def sealed(key: ScopeKey, **attributes: object) -> dict:
    doc = {**attributes, "veil:scope": "customs"}
    return {**doc, "veil:sealed": base64.b64encode(seal(b"secret", key, orjson.dumps(doc))).decode()}


async def test_only_members_publish_into_a_scope(http):
    await put_registry(http, registry(["alice"]))
    assert (await post(http, "/publish", {"n": 1, "veil:scope": "customs"}))[0] == 200
    status, reply = await post(http, "/publish", {"n": 1, "veil:scope": "customs"}, auth=BOB)
    assert (status, reply["field"]) == (403, "veil:scope")
    status, reply = await post(http, "/publish", {"n": 1, "veil:scope": "nowhere"})
    assert (status, reply["field"]) == (403, "veil:scope")
    assert (await post(http, "/publish", {"n": 1, "veil:scope": 7}))[1]["field"] == "veil:scope"
    status, reply = await post(http, "/publish", {"n": 1, "veil:sealed": "AAAA"})
    assert (status, reply["field"]) == (400, "veil:scope")
    status, reply = await post(http, "/publish", {"n": 1, "veil:scope": "customs", "veil:sealed": "not base64!"})
    assert (status, reply["field"]) == (400, "veil:sealed")
    theirs = {"publisher": "bob", "id": "x1", "time": 1}
    status, reply = await post(http, "/publish", {"n": 1, "veil:scope": "customs", "veil:origin": theirs})
    assert (status, reply["field"]) == (403, "veil:origin") and "you are 'alice'" in reply["error"]
    status, reply = await post(http, "/publish", {"n": 1, "veil:origin": {"publisher": "alice"}})
    assert (status, reply["field"]) == (400, "veil:origin")
    assert (await post(http, "/publish", {"n": 1, "veil:origin": {**theirs, "publisher": "alice"}}))[0] == 200
    escaped = b'{"n": 1, "veil\\u003ascope": "customs"}'  # the same member, spelled with an escape
    response = await http.post("/publish", data=escaped, headers={"X-Auth-Hash": BOB})
    assert response.status == 403
    batch = b'{"n":1}\n{"n":2,"veil:scope":"customs"}\n'
    response = await http.post(
        "/publish", data=batch, headers={"X-Auth-Hash": BOB, "Content-Type": "application/x-ndjson"}
    )
    assert (response.status, (await response.json())["field"]) == (403, "line 2: veil:scope")


async def test_sealed_publications_need_the_current_key_held_by_current_members_only(http):
    await put_registry(http, registry(["alice", "bob"]))
    first = ScopeKey.new("customs")
    status, reply = await post(http, "/publish", sealed(first, n=1))
    assert (status, reply["field"]) == (409, "veil:sealed") and "no key yet" in reply["error"]
    assert (await put_key(http, first, ["alice", "bob"]))[0] == 200
    assert (await post(http, "/publish", sealed(first, n=1)))[0] == 200
    await put_registry(http, registry(["alice"]))  # the keys are kept as they are
    status, reply = await post(http, "/publish", sealed(first, n=2))
    assert status == 409 and "former member" in reply["error"] and "bob" in reply["error"]
    second = first.rotate()
    assert (await put_key(http, second, ["alice"]))[0] == 200
    assert (await post(http, "/publish", sealed(second, n=3)))[0] == 200
    status, reply = await post(http, "/publish", sealed(first, n=4))
    assert status == 409 and "the current one is 2" in reply["error"]
    await put_registry(http, registry(["alice"], recipients={**PRIVATE, "alice": X25519PrivateKey.generate()}))
    status, reply = await post(http, "/publish", sealed(second, n=5))  # a recipient key changed: rotate first
    assert status == 409 and "no longer has" in reply["error"] and "alice" in reply["error"]


async def test_scope_keys_are_stored_signed_by_managers_and_fetched_by_current_members(http):
    await put_registry(http, registry(["alice", "bob"]))
    key = ScopeKey.new("customs")
    assert (await put_key(http, key, ["alice"], auth=ALICE))[0] == 404  # a member, not a manager
    assert (await put_key(http, key._replace(version=2), ["alice"]))[0] == 409  # versions do not skip
    status, reply = await put_key(http, key, ["alice", "carol"])
    assert (status, reply["field"]) == (409, "body.roster.members.carol")  # not a member
    status, reply = await put_key(http, key, ["alice"], body=signed_version(key, ["alice"], signer="alice"))
    assert (status, reply["field"]) == (403, "body.keyId")  # signed with someone else's key
    forged = signed_version(key, ["alice"])
    forged["roster"]["members"]["bob"] = b64(recipient_public(PRIVATE["bob"]))  # after it was signed
    forged["roster"]["envelopes"]["bob"] = forged["roster"]["envelopes"]["alice"]
    forged["envelopes"]["bob"] = forged["envelopes"]["alice"]
    status, reply = await put_key(http, key, ["alice"], body=forged)
    assert (status, reply["field"]) == (403, "body.signature")
    swapped = signed_version(key, ["alice"], private={"alice": X25519PrivateKey.generate()})
    status, reply = await put_key(http, key, ["alice"], body=swapped)
    assert (status, reply["field"]) == (409, "body.roster.members.alice")  # not the key the registry lists
    unsigned = signed_version(key, ["alice"])
    del unsigned["envelopes"]["alice"]
    assert (await put_key(http, key, ["alice"], body=unsigned))[1]["field"] == "body.envelopes.alice"
    assert (await put_key(http, key, ["alice", "bob"]))[0] == 200
    assert (await put_key(http, key, ["alice"]))[0] == 409  # version 1 exists: rotate instead
    response = await http.get("/scopes/customs", headers={"X-Auth-Hash": CAROL})
    described = await response.json()
    assert described["version"] == 1 and set(described["members"]) == {"alice", "bob"}
    assert set(described["roster"]["roster"]["members"]) == {"alice", "bob"}
    # one answer for a scope the client may not manage and one that does not exist
    hidden = await http.get("/scopes/customs", headers={"X-Auth-Hash": BOB})
    absent = await http.get("/scopes/nowhere", headers={"X-Auth-Hash": BOB})
    assert hidden.status == absent.status == 404
    assert (await hidden.json())["error"] == (await absent.json())["error"].replace("nowhere", "customs")
    response = await http.get("/scopes/customs/key", headers={"X-Auth-Hash": BOB})
    fetched = await response.json()
    assert (fetched["version"], len(base64.b64decode(fetched["envelope"])), fetched["keyId"]) == (1, 80, "carol-1")
    assert (await http.get("/scopes/customs/key", headers={"X-Auth-Hash": CAROL})).status == 404
    assert (await http.get("/scopes/customs/key?version=x", headers={"X-Auth-Hash": BOB})).status == 400
    stranger = await http.get("/scopes/customs/key", headers={"X-Auth-Hash": CAROL})
    absent = await http.get("/scopes/nowhere/key", headers={"X-Auth-Hash": BOB})
    assert (await stranger.json())["error"] == (await absent.json())["error"].replace("nowhere", "customs")
    await put_registry(http, registry(["alice"]))  # bob leaves: no envelope is served to him any more
    assert (await http.get("/scopes/customs/key?version=1", headers={"X-Auth-Hash": BOB})).status == 404
    assert (await put_key(http, key.rotate(), ["alice"]))[0] == 200
    await put_registry(http, registry(["alice", "bob"]))  # and back: version 1's envelope was pruned
    assert (await http.get("/scopes/customs/key?version=1", headers={"X-Auth-Hash": BOB})).status == 404
    assert (await http.get("/scopes/customs/key?version=1", headers={"X-Auth-Hash": ALICE})).status == 200


async def test_the_admin_api_installs_no_scope_key(http):
    await put_registry(http, registry(["alice"]))
    key = ScopeKey.new("customs")
    assert (await put_key(http, key, ["alice"]))[0] == 200
    document = await (await http.get("/admin/registry", headers={"X-Auth-Hash": ROOT})).json()
    installed = signed_version(key.rotate(), ["alice"])
    for keys in ({"1": installed | {"roster": {**installed["roster"], "version": 1}}}, {"2": installed}, {}):
        changed = {**document, "scopes": {"customs": {**document["scopes"]["customs"], "keys": keys}}}
        version = (await http.get("/admin/registry", headers={"X-Auth-Hash": ROOT})).headers["X-Registry-Version"]
        headers = {"X-Auth-Hash": ROOT, "X-Registry-Version": version}
        response = await http.put("/admin/registry", data=orjson.dumps(changed), headers=headers)
        assert (response.status, (await response.json())["field"]) == (403, "scopes.customs.keys")
    await put_registry(http, document)  # as read: accepted, keys unchanged
    assert set(await current_keys(http)) == {"1"}


async def current_keys(http) -> dict:
    response = await http.get("/admin/registry", headers={"X-Auth-Hash": ROOT})
    return (await response.json())["scopes"]["customs"].get("keys", {})


async def test_subscriptions_in_a_scope_are_admitted_only_inside_its_filters(http):
    await put_registry(http, registry(["alice"], subscribe=[[{"key": "country", "op": "eq", "val": "FR"}]]))
    fr = [{"key": "country", "op": "eq", "val": "FR"}, {"key": "lat", "op": "gt", "val": 3}]
    assert (await post(http, "/subscribe", {"data": fr, "scope": "customs"}))[0] == 200
    status, reply = await post(http, "/subscribe", {"data": [], "scope": "customs"})
    assert (status, reply["field"]) == (403, "data") and "scope 'customs' allows" in reply["error"]
    status, reply = await post(http, "/subscribe", {"data": fr, "scope": "customs"}, auth=BOB)
    assert (status, reply["field"]) == (403, "scope")
    assert (await post(http, "/subscribe", {"data": [], "scope": 5}))[1]["field"] == "scope"
    assert (await post(http, "/subscribe", {"data": []}, auth=BOB))[0] == 200  # the world is open


async def test_a_gateway_adopts_the_versions_another_gateway_stored(gateway, monkeypatch):
    """A scope key stored through one gateway is known to the others on the store within moments."""
    other = CurrentRegistry(gateway.threads, gateway.parsing, gateway.config.max_registry)
    await other.load(None)
    await gateway.registry.amend(lambda _, doc: doc.update(registry(["alice"])))
    await gateway.registry.amend(lambda _, doc: doc["scopes"]["customs"]["users"].append("bob"))
    monkeypatch.setattr(registry_module, "FOLLOW_INTERVAL", 0.01)
    following = asyncio.create_task(other.follow())
    await asyncio.sleep(0.2)
    following.cancel()
    assert other.current.scopes.by_name["customs"].users == {"alice", "bob"}


async def test_a_huge_subscription_is_admitted_or_refused_without_holding_anyone_else(http):
    """A body of ~1 MB of `in` values against a scope's allowed filters: checked on the parsing
    thread (as large bodies are parsed), answered with the reason, while other requests are served."""
    await put_registry(http, registry(["alice"], subscribe=[[{"key": "k", "op": "in", "val": list(range(100))}]]))
    common = list(range(1_000, 1_999))
    data = [{"key": "k", "op": "in", "val": [*common, 10_000 + i]} for i in range(100)]
    hostile = asyncio.create_task(post(http, "/subscribe", {"data": data, "scope": "customs"}))
    assert (await http.get("/health")).status == 200
    status, reply = await hostile
    assert (status, reply["field"]) == (403, "data")
