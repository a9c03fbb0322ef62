"""The registry shared by two gateways on one PostgreSQL store, against clients that race each other
and push its limits: no change acknowledged through one gateway is undone by a change through the
other (one of two racing changes gets 409, or both land), a static hash revoked through one gateway
is refused by the other as soon as the revocation is acknowledged (and the connections it opened
there end within seconds), a publisher's rules are bounded,
the last admin stays, and a publisher cannot lift the policies the admins set on its publications.

The gateways run without a pipeline: what is checked is what they acknowledge and what the store
holds (the registry versions the pipeline applies)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.error
from collections.abc import Iterator

import aiohttp
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from tests.integration.helpers import LineConnection, run_id
from veil.client import VeilClient, VeilError
from veil.client.errors import Replaced
from veil.client.scope_keys import next_version
from veil.harness import BrokerProcess, postgres_database
from veil.security.registry import secret_digest
from veil.security.sealing import recipient_public

pytestmark = pytest.mark.slow
ROOT, FLEET, CAROL, DAVE, REVOKED, LEAKED = (
    "root-secret-1",
    "fleet-secret-1",
    "carol-secret-1",
    "dave-secret-1",
    "gone-secret-1",
    "carol-secret-2",  # carol's second hash, revoked while a connection it opened is open
)
PUBLISHING = "publishing-secret-1"
MEMBERS = ("alice", "bob")
PRIVATE = {user: X25519PrivateKey.generate() for user in MEMBERS}
SIGNING = {user: Ed25519PrivateKey.generate() for user in ("carol", "dave")}  # the scope's managers
PINNED = {f"{user}-1": key.public_key().public_bytes_raw() for user, key in SIGNING.items()}
HASHES = {f"{user}-secret-1": user for user in MEMBERS}
PUBLISHERS = {f"pub{i}-secret-1": f"pub{i}" for i in range(20)}
ADMIN_POLICY = {"data": [{"key": "id", "val": "truck-bcd", "op": "eq"}], "group": "A"}
REGISTRY = {
    "admins": ["root"],
    "hashes": {
        ROOT: "root",
        FLEET: "fleet",
        CAROL: "carol",
        LEAKED: "carol",
        DAVE: "dave",
        REVOKED: "gone",
        PUBLISHING: "publishing",
        **HASHES,
        **PUBLISHERS,
    },
    # a registry of some size, as in a deployment: a change takes the gateway a few milliseconds
    "users": {f"user-{i:05d}": {"groups": ["A"]} for i in range(10000)},
    "rules": {"*": [[]]},
    "policies": {"fleet": [ADMIN_POLICY]},
    "keys": {user: {key_id: base64.b64encode(PINNED[key_id]).decode()} for key_id, user in (("carol-1", "carol"), ("dave-1", "dave"))},
    "recipients": {u: base64.b64encode(recipient_public(k)).decode() for u, k in PRIVATE.items()},
    "scopes": {"customs": {"users": [*MEMBERS, "extra"], "managers": ["carol", "dave"]}},
}


def start_gateway(directory: str, name: str, store: str, registry: str) -> BrokerProcess:
    """A gateway on the shared store, serving as soon as it listens (no pipeline runs here)."""
    gateway = BrokerProcess(
        directory, "--role", "gateway", "--gateway-id", name, "--store", store, "--registry", registry,
        "--auth", "hash", "--anonymous", "false",
    ).start(wait_ready=False)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            gateway.health()
            return gateway
        except urllib.error.HTTPError:
            return gateway
        except OSError:
            time.sleep(0.2)
    gateway.close()
    raise TimeoutError(f"gateway {name} did not listen:\n{gateway.tail()}")


@pytest.fixture(scope="module")
def gateways(tmp_path_factory, postgres_server) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    directory = tmp_path_factory.mktemp("registry")
    registry = str(directory / "registry.json")
    with open(registry, "w") as handle:
        json.dump(REGISTRY, handle)
    with postgres_database(postgres_server) as store:
        first = start_gateway(str(directory / "A"), "A", store, registry)
        try:
            second = start_gateway(str(directory / "B"), "B", store, registry)
        except Exception:
            first.close()
            raise
        yield first, second
        first.close()
        second.close()


def client(gateway: BrokerProcess, auth_hash: str) -> VeilClient:
    return VeilClient(gateway.url, auth_hash=auth_hash)


async def outcome(change) -> bool:
    """Whether a change was acknowledged (True) or refused as conflicting (False)."""
    try:
        await change
    except Replaced:
        return False
    return True


async def test_an_admin_change_and_a_publisher_rule_save_through_two_gateways_both_land_or_one_is_refused(gateways):
    a, b = gateways
    publishers = [client(b, auth_hash) for auth_hash in list(PUBLISHERS)[:4]]  # saving at once, through B
    async with client(a, ROOT) as root:
        for round_ in range(10):
            document = await root.registry()
            document["scopes"]["customs"]["users"] = [*MEMBERS, "extra"]
            await root.registry(document)
            document["scopes"]["customs"]["users"].remove("extra")
            policy = {"data": [{"key": "round", "val": round_, "op": "eq"}], "group": "A"}
            body = orjson.dumps({"policies": [policy]})
            removed, *ruled = await asyncio.gather(
                outcome(root.registry(document)),
                *(outcome(p.request("/publisher/rules", body, method="PUT")) for p in publishers),
            )
            stored = await root.registry()
            if removed:
                assert "extra" not in stored["scopes"]["customs"]["users"], f"round {round_}: removal undone"
            for publisher, acknowledged in zip(publishers, ruled, strict=True):
                if acknowledged:
                    rules = await publisher.request("/publisher/rules", b"", method="GET")
                    assert rules["policies"] == [policy], f"round {round_}: a publisher's save was undone"
            assert removed or any(ruled)
    for publisher in publishers:
        await publisher.close()


async def test_two_rotations_through_two_gateways_store_one_version_each_time(gateways):
    """Both managers make the next version at once: one is stored, the other is refused (409), and
    what was acknowledged is what members get."""
    a, b = gateways
    vouched = {member: recipient_public(key) for member, key in PRIVATE.items()}
    async with client(a, CAROL) as carol, client(b, DAVE) as dave, client(a, ROOT) as root:
        for _ in range(5):
            described = await carol.request("/scopes/customs", b"", method="GET")

            def save(manager: VeilClient, name: str, described: dict = described):
                body, rotation = next_version("customs", described, (f"{name}-1", SIGNING[name]), vouched, PINNED)
                path = f"/scopes/customs/keys/{rotation.version}"
                return outcome(manager.request(path, orjson.dumps(body), method="PUT")), body

            (carol_saved, carol_body), (dave_saved, dave_body) = save(carol, "carol"), save(dave, "dave")
            saved = await asyncio.gather(carol_saved, dave_saved)
            assert sorted(saved) == [False, True], "exactly one of two rotations to the same version is stored"
            stored = (await root.registry())["scopes"]["customs"]["keys"][str(described["version"] + 1)]
            assert stored["signature"] == (carol_body if saved[0] else dave_body)["signature"]


async def test_a_static_hash_revoked_through_one_gateway_is_refused_by_the_other_at_once(gateways):
    a, b = gateways
    async with client(a, ROOT) as root, client(b, REVOKED) as revoked:
        assert (await revoked.request("/publisher/rules", b"", method="GET"))["policies"] == []
        document = await root.registry()
        del document["hashes"][secret_digest(REVOKED)]
        await root.registry(document)
        with pytest.raises(VeilError) as refused:
            await revoked.request("/publisher/rules", b"", method="GET")
        assert refused.value.status == 401
    # publishing, which checks the version where the log takes the publication, is refused alike
    async with client(a, ROOT) as root, client(b, PUBLISHING) as publishing:
        await publishing.publish({"before": True})
        document = await root.registry()
        del document["hashes"][secret_digest(PUBLISHING)]
        await root.registry(document)
        with pytest.raises(VeilError) as refused:
            await publishing.publish({"after": True})
        assert refused.value.status == 401


async def test_a_connection_opened_with_a_hash_revoked_through_the_other_gateway_ends(gateways):
    """Revoking a leaked hash ends the delivery connections it opened, wherever they are; the same
    client's connection opened with a hash it keeps goes on."""
    a, b = gateways
    async with client(b, CAROL) as carol:
        leaked_sub, kept_sub = [
            (await carol.subscribe([{"key": "run", "val": run_id(), "op": "eq"}]))["subscriptionId"] for _ in range(2)
        ]
    leaked = await LineConnection.open(b.tcp_port, {"authHash": LEAKED, "subscriptionId": leaked_sub})
    kept = await LineConnection.open(b.tcp_port, {"authHash": CAROL, "subscriptionId": kept_sub})
    try:
        assert await leaked.silent(1.0) and await kept.silent(0.5)  # both admitted, waiting for deliveries
        async with client(a, ROOT) as root:
            document = await root.registry()
            del document["hashes"][secret_digest(LEAKED)]
            await root.registry(document)
        revoked_at = time.monotonic()
        ended = await leaked.line(timeout=15)
        assert ended is not None and (ended["status"], ended["field"]) == (401, "authHash"), ended
        assert time.monotonic() - revoked_at < 5
        assert await leaked.line(timeout=5) is None  # and closed
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(kept.reader.readline(), 2)  # still open: nothing sent, nothing ended
    finally:
        leaked.close()
        kept.close()


async def test_oversized_rules_are_refused_naming_the_limit_and_change_nothing(gateways):
    a, b = gateways
    big = [{"data": [{"key": f"k{i}", "val": "x" * 100, "op": "eq"}], "group": "A"} for i in range(900)]
    async with client(b, FLEET) as fleet, client(a, ROOT) as root:
        before = await root.registry()
        with pytest.raises(VeilError) as refused:
            await fleet.request("/publisher/rules", orjson.dumps({"policies": big}), method="PUT")
        assert refused.value.status == 413 and "--max-publisher-rules" in refused.value.problem
        assert await root.registry() == before
    # many publishers at their limit each: the registry stops growing at its own bound
    rules = [{"data": [{"key": f"k{i}", "val": "x" * 100, "op": "eq"}], "group": "A"} for i in range(400)]
    refusals = []
    for auth_hash in PUBLISHERS:
        async with client(a, auth_hash) as publisher:
            try:
                await publisher.request("/publisher/rules", orjson.dumps({"policies": rules}), method="PUT")
            except VeilError as exc:
                refusals.append(exc)
    assert refusals and all(r.status == 413 and "--max-registry" in r.problem for r in refusals)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{a.url}/admin/registry", headers={"X-Auth-Hash": ROOT}) as response,
    ):
        assert len(await response.read()) <= 1 << 20


async def test_a_publisher_cannot_lift_the_policies_the_admins_set_on_its_publications(gateways):
    a, b = gateways
    async with client(b, FLEET) as fleet, client(a, ROOT) as root:
        await fleet.request("/publisher/rules", orjson.dumps({"policies": []}), method="PUT")
        assert (await root.registry())["policies"]["fleet"] == [ADMIN_POLICY]
        rules = await fleet.request("/publisher/rules", b"", method="GET")
        assert rules["admins"]["policies"] == [ADMIN_POLICY]


async def test_the_last_admin_cannot_be_removed(gateways):
    """Last: on a broker without the guard, it locks the module's admin out."""
    _, b = gateways
    async with client(b, ROOT) as root:
        document = await root.registry()
        with pytest.raises(VeilError) as refused:
            await root.registry({**document, "admins": []})
        assert (refused.value.status, refused.value.field) == (409, "admins")
        assert (await root.registry())["admins"] == ["root"]
