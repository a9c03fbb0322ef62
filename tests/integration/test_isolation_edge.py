"""What a client learns at the broker's edges, against real gateways: an edge broker's channel shows
only the subscriptions its owner may publish to, and announcing takes the registry's privilege; the
monitoring handshake is read like every other one (a duplicate key refused); and /health's head is
the log's, whichever gateway logged what. The gateways run without a pipeline: nothing here needs a
match."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.helpers import LineConnection, client_for, run_id, serving
from veil.client import VeilError
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow
USERS = ("alice", "eve", "edgar", "insider", "root", "revoked-edge")
MAX_CONNECTIONS = 3
MONITOR = "monitor-secret-1"


def secret(user: str) -> str:
    return f"{user}-secret-1"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("edge")
    registry = {
        "admins": ["root"],
        "hashes": {secret(user): user for user in USERS},
        "rules": {"*": [[]]},
        "scopes": {"customs": {"users": ["alice", "insider"]}},
        "announce": {"edgar": [[]], "insider": [[]], "revoked-edge": [[]]},  # eve may not announce
    }
    (directory / "registry.json").write_text(json.dumps(registry))
    (directory / "monitoring.conf").write_text(MONITOR + "\n")
    process = BrokerProcess(
        str(directory / "data"), "--role", "gateway", "--auth", "hash", "--anonymous", "false",
        "--registry", str(directory / "registry.json"),
        "--metrics-auth-hash-file", str(directory / "monitoring.conf"),
        "--max-client-connections", str(MAX_CONNECTIONS),
    ).start(wait_ready=False)  # fmt: skip
    yield serving(process)
    process.close()


async def edge_view(broker: BrokerProcess, user: str, data: list[dict]) -> list[list]:
    """The filters an edge broker of `user` announcing `data` is sent before it is synced."""
    async with client_for(broker, secret(user)) as edge:
        reply = await edge.announce(data)
    connection = await LineConnection.open(
        broker.tcp_port, {"announcementId": reply["announcementId"], "authHash": secret(user)}
    )
    try:
        filters = []
        while (line := await connection.line(timeout=10)) is not None and "synced" not in line:
            assert "subscribe" in line, line
            filters.append(line["data"])
    finally:
        connection.close()
    return filters


async def test_announcing_takes_the_registrys_announce_privilege(broker):
    async with client_for(broker, secret("eve")) as eve:
        with pytest.raises(VeilError) as refused:
            await eve.announce([])
    assert (refused.value.status, refused.value.field) == (403, "authHash")
    assert "announce" in refused.value.problem


async def test_an_edge_sees_only_the_subscriptions_its_owner_may_publish_to(broker):
    rid = run_id()
    async with client_for(broker, secret("alice")) as alice:
        await alice.subscribe([{"key": "run", "val": rid, "op": "eq"}, {"key": "where", "val": "world", "op": "eq"}])
        await alice.subscribe(
            [{"key": "run", "val": rid, "op": "eq"}, {"key": "where", "val": "customs", "op": "eq"}], scope="customs"
        )
    announced = [{"key": "run", "val": rid, "op": "eq"}]

    def places(filters: list[list]) -> set[str]:
        return {value for flt in filters for key, _, value in flt if key == "where"}

    assert places(await edge_view(broker, "edgar", announced)) == {"world"}
    assert places(await edge_view(broker, "insider", announced)) == {"world", "customs"}


async def test_the_monitoring_handshake_refuses_a_duplicate_key_like_every_handshake(broker):
    honest = await LineConnection.open(broker.tcp_port, {"authHash": MONITOR})
    try:
        report = await honest.line(timeout=10)
    finally:
        honest.close()
    assert report is not None and "operations" in report
    twice = f'{{"authHash": "{secret("eve")}", "authHash": "{MONITOR}"}}\n'.encode()
    doubled = await LineConnection.open(broker.tcp_port, twice)
    try:
        refused = await doubled.line(timeout=10)
    finally:
        doubled.close()
    assert refused is not None and (refused["status"], refused["field"]) == (400, "handshake")
    assert "given twice" in refused["error"]


async def test_health_head_counts_what_another_gateway_logged(tmp_path, postgres_url):
    store = ("--role", "gateway", "--store", postgres_url)
    gateways = [
        BrokerProcess(str(tmp_path / name), *store, "--gateway-id", name).start(wait_ready=False) for name in "AB"
    ]
    try:
        a, b = (serving(gateway) for gateway in gateways)
        async with client_for(b, "bob") as bob:
            for n in range(3):
                last = int(await bob.publish({"n": n}))
        deadline = time.monotonic() + 10
        while a.health()["head"] < last and time.monotonic() < deadline:
            time.sleep(0.1)
        assert a.health()["head"] >= last == b.health()["head"]
    finally:
        for gateway in gateways:
            gateway.close()


async def test_edge_channels_count_against_the_clients_connection_limit(broker):
    async with client_for(broker, secret("edgar")) as edgar:
        reply = await edgar.announce([{"key": "run", "val": run_id(), "op": "eq"}])
    handshake = {"announcementId": reply["announcementId"], "authHash": secret("edgar")}
    edges = [await LineConnection.open(broker.tcp_port, handshake) for _ in range(MAX_CONNECTIONS)]
    try:
        for edge in edges:
            assert "synced" in (await edge.line(timeout=10) or {})
        over = await LineConnection.open(broker.tcp_port, handshake)
        refusal = await over.line(timeout=10)
        assert refusal is not None and (refusal["status"], refusal["field"]) == (429, "handshake"), refusal
        over.close()
    finally:
        for edge in edges:
            edge.close()


async def test_an_edge_whose_owner_loses_the_privilege_is_ended_with_its_error_line(broker):
    rid = run_id()
    async with client_for(broker, secret("revoked-edge")) as owner:
        reply = await owner.announce([{"key": "run", "val": rid, "op": "eq"}])
    edge = await LineConnection.open(
        broker.tcp_port, {"announcementId": reply["announcementId"], "authHash": secret("revoked-edge")}
    )
    try:
        assert "synced" in (await edge.line(timeout=10) or {})
        async with client_for(broker, secret("root")) as root:
            await root.change_registry(lambda document: document["announce"].pop("revoked-edge"))
        async with client_for(broker, secret("alice")) as alice:  # a subscription it would have been shown
            await alice.subscribe([{"key": "run", "val": rid, "op": "eq"}, {"key": "salary", "val": 1, "op": "eq"}])
        ended = await edge.line(timeout=10)
        assert ended is not None and (ended["status"], ended["field"]) == (403, "authHash"), ended
        assert await edge.line(timeout=10) is None  # and nothing after it
    finally:
        edge.close()
