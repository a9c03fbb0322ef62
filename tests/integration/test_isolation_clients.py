"""Many clients on one broker, drawn by hypothesis: readers on plain and multiplexed connections, a
client that never reads what it subscribed to, clients that free their subscription ids for an
outsider to take, edge brokers announcing with and without the privilege. Every delivery must be one
an oracle of the receiving client's own subscriptions and rules allows (exactly once), no edge learns
of a subscription in a scope its owner is outside of, and every publish from every publisher is
acknowledged while any one client misbehaves."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.helpers import DELIVERY_TIMEOUT, LineConnection, client_for, run_id
from veil.client import DeliveryStream, VeilClient, VeilError
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow
TENANTS = ["c0", "c1", "c2", "c3"]
OUTSIDER = "mallory"  # in no rule of its own: it may receive public publications only
FLOOD = 150  # publications for each client that never reads, to fill its queue
NEVER_READER_SUBSCRIPTIONS = 16
ANNOUNCERS = ["c0", "c2"]  # the others may not announce
VAULT = "vault"  # a scope of c3's alone: its subscriptions are shown to no other client's edge


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """Each tenant may receive its own publications and public ones; anyone else public ones only."""
    directory = tmp_path_factory.mktemp("clients")
    registry = {
        "admins": ["root"],
        "rules": {
            **{name: [[{"key": "tenant", "val": name, "op": "eq"}]] for name in TENANTS},
            "*": [[{"key": "public", "val": True, "op": "eq"}]],
        },
        "announce": {name: [[]] for name in ANNOUNCERS},
        "scopes": {VAULT: {"users": ["c3"]}},
    }
    (directory / "registry.json").write_text(json.dumps(registry))
    process = BrokerProcess(str(directory), "--registry", str(directory / "registry.json")).start()
    yield process
    process.close()


# a filter: (operator on k, its value, the tenant it asks for or None)
FILTERS = st.tuples(st.sampled_from(["eq", "ne", "lt", "ge"]), st.integers(0, 3), st.sampled_from([None, *TENANTS]))
# a publication: (k, tenant or None, public)
PUBLICATIONS = st.tuples(st.integers(0, 3), st.sampled_from([None, *TENANTS]), st.booleans())
ROLES = st.sampled_from(["plain", "multiplexed", "never-reads", "frees", "announces"])
SCENARIOS = st.fixed_dictionaries(
    {
        "clients": st.lists(st.tuples(ROLES, st.lists(FILTERS, min_size=1, max_size=3)), min_size=2, max_size=4),
        "before": st.lists(PUBLICATIONS, min_size=3, max_size=15),
        "after": st.lists(PUBLICATIONS, min_size=3, max_size=15),
        "outsider_filter": FILTERS,
    }
)


@dataclass
class Publication:
    n: int
    k: int
    tenant: str | None
    public: bool

    def document(self, rid: str) -> dict:
        doc = {"run": rid, "n": self.n, "k": self.k, "public": self.public}
        if self.tenant is not None:
            doc["tenant"] = self.tenant
        return doc


def matches(flt: tuple[str, int, str | None], pub: Publication) -> bool:
    op, value, tenant = flt
    if tenant is not None and pub.tenant != tenant:
        return False
    return {"eq": pub.k == value, "ne": pub.k != value, "lt": pub.k < value, "ge": pub.k >= value}[op]


def allowed(client: str, pub: Publication) -> bool:
    return pub.public or pub.tenant == client


def constraints(rid: str, flt: tuple[str, int, str | None]) -> list[dict]:
    op, value, tenant = flt
    data = [{"key": "run", "val": rid, "op": "eq"}, {"key": "k", "val": value, "op": op}]
    if tenant is not None:
        data.append({"key": "tenant", "val": tenant, "op": "eq"})
    return data


@dataclass
class Reader:
    """One client's subscriptions (id -> filter) and what its connections delivered (id -> n)."""

    name: str
    filters: dict[str, tuple[str, int, str | None]]
    received: dict[str, list[int]] = field(default_factory=dict)
    strangers: list[tuple[str, ...]] = field(default_factory=list)  # deliveries for ids not its own
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    streams: list[DeliveryStream] = field(default_factory=list)

    def expected(self, pubs: list[Publication]) -> dict[str, set[int]]:
        return {
            sub_id: {p.n for p in pubs if matches(flt, p) and allowed(self.name, p)}
            for sub_id, flt in self.filters.items()
        }

    async def read(self, client: VeilClient, multiplexed: bool) -> None:
        self.received = {sub_id: [] for sub_id in self.filters}
        if multiplexed:
            stream: DeliveryStream = client.multiplexed(list(self.filters))
            self.streams.append(stream)
            self.tasks.append(asyncio.create_task(self._consume(stream, None)))
            return
        for sub_id in self.filters:
            stream = client.deliveries(sub_id)
            self.streams.append(stream)
            self.tasks.append(asyncio.create_task(self._consume(stream, sub_id)))

    async def _consume(self, stream: DeliveryStream, sub_id: str | None) -> None:
        async with stream:
            async for delivery in stream:
                targets = delivery.subscription_ids or (sub_id,)
                if not set(targets) <= set(self.received):
                    self.strangers.append(targets)
                for target in set(targets) & set(self.received):
                    self.received[target].append(delivery.publication["n"])

    async def check(self, pubs: list[Publication]) -> None:
        expected = self.expected(pubs)
        deadline = asyncio.get_running_loop().time() + DELIVERY_TIMEOUT
        while asyncio.get_running_loop().time() < deadline and any(
            not want <= set(self.received[s]) for s, want in expected.items()
        ):
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # what should not come has had time to
        assert not self.strangers, f"{self.name} was given deliveries for {self.strangers[:3]}"
        for sub_id, want in expected.items():
            got = self.received[sub_id]
            assert set(got) <= want, f"{self.name}/{sub_id} received {sorted(set(got) - want)} it may not"
            assert want <= set(got), f"{self.name}/{sub_id} lost {sorted(want - set(got))}"
            assert len(got) == len(set(got)), f"{self.name}/{sub_id} received a publication twice"

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for stream in self.streams:
            await stream.aclose()


async def publish_all(publishers: list[VeilClient], rid: str, pubs: list[Publication]) -> None:
    """Alternating between publishers, concurrently: every publication must be acknowledged."""

    async def publish(index: int, pub: Publication) -> None:
        await publishers[index % len(publishers)].publish(pub.document(rid))

    await asyncio.gather(*(publish(i, pub) for i, pub in enumerate(pubs)))


async def edge_feed(broker: BrokerProcess, client: VeilClient, name: str, rid: str) -> list[dict]:
    """What an edge of `name` announcing this run's publications is told is wanted, up to `synced`
    (an announcement without the privilege must be refused)."""
    try:
        reply = await client.announce([{"key": "run", "val": rid, "op": "eq"}])
    except VeilError as exc:
        assert name not in ANNOUNCERS and exc.status == 403, exc
        return []
    assert name in ANNOUNCERS, f"{name} announced without the privilege"
    handshake = {"authHash": name, "announcementId": reply["announcementId"]}
    edge = await LineConnection.open(broker.tcp_port, handshake)
    try:
        lines = []
        while (line := await edge.line()) is not None and "synced" not in line:
            lines.append(line)
        return lines
    finally:
        edge.close()
        await client.revoke(reply["announcementId"])


async def scenario(broker: BrokerProcess, drawn: dict) -> None:
    rid = run_id()
    numbered = iter(range(1_000_000))

    def publications(drawn_pubs: list[tuple[int, str | None, bool]]) -> list[Publication]:
        return [Publication(next(numbered), k, tenant, public) for k, tenant, public in drawn_pubs]

    clients = {f"c{i}": client_for(broker, f"c{i}") for i in range(len(drawn["clients"]))}
    publishers = [client_for(broker, "publisher-1"), client_for(broker, "publisher-2")]
    outsider = client_for(broker, OUTSIDER)
    readers: list[Reader] = []
    idle: list[LineConnection] = []
    freed: dict[str, VeilClient] = {}  # subscription id -> the client that frees it
    subscribed: list[tuple[VeilClient, str]] = []
    try:
        flood: list[tuple[int, str | None, bool]] = []
        for (name, client), (role, filters) in zip(clients.items(), drawn["clients"], strict=True):
            if role == "never-reads":
                ids = [f"{rid}-{name}-{j}" for j in range(NEVER_READER_SUBSCRIPTIONS)]
                for sub_id in ids:
                    await client.subscribe([{"key": "run", "val": rid, "op": "eq"}], sub_id)
                    subscribed.append((client, sub_id))
                handshake = {"authHash": name, "subscriptionIds": ids}
                idle.append(await LineConnection.open(broker.tcp_port, handshake))
                flood += [(0, name, False)] * FLOOD
                continue
            ids = {f"{rid}-{name}-{j}": flt for j, flt in enumerate(filters)}
            for sub_id, flt in ids.items():
                await client.subscribe(constraints(rid, flt), sub_id)
                if role == "frees":
                    freed[sub_id] = client
                else:
                    subscribed.append((client, sub_id))
            if role != "frees":
                reader = Reader(name, ids)
                await reader.read(client, multiplexed=role == "multiplexed")
                readers.append(reader)
        if "c3" in clients:  # a subscription in c3's own scope, which only c3's edges may learn of
            vault_id = f"{rid}-c3-vault"
            await clients["c3"].subscribe([{"key": "run", "val": rid, "op": "eq"}, {"key": "secret", "val": rid, "op": "eq"}], vault_id, scope=VAULT)  # fmt: skip
            subscribed.append((clients["c3"], vault_id))
        for (name, client), (role, _) in zip(clients.items(), drawn["clients"], strict=True):
            if role == "announces":
                for line in await edge_feed(broker, client, name, rid):
                    keys = {constraint[0] for constraint in line.get("data", [])}
                    assert "secret" not in keys, f"{name}'s edge was shown a subscription of scope {VAULT}"
        before = publications(drawn["before"] + flood)
        await publish_all(publishers, rid, before)
        # the freed ids' matches are queued (their owners never connected); an outsider takes the ids
        for sub_id, owner in freed.items():
            await owner.unsubscribe(sub_id)
        taker = Reader(OUTSIDER, {sub_id: drawn["outsider_filter"] for sub_id in freed})
        readers.append(taker)
        for sub_id in freed:
            await outsider.subscribe(constraints(rid, drawn["outsider_filter"]), sub_id)
            subscribed.append((outsider, sub_id))
        if freed:
            await taker.read(outsider, multiplexed=False)
        after = publications(drawn["after"])
        await publish_all(publishers, rid, after)
        for reader in readers:
            # the outsider: nothing of what the freed ids matched before it took them
            await reader.check(after if reader is taker else before + after)
    finally:
        for connection in idle:
            connection.close()
        for reader in readers:
            await reader.close()
        for client, sub_id in subscribed:
            await client.unsubscribe(sub_id)
        for client in [*clients.values(), *publishers, outsider]:
            await client.close()


@settings(max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(drawn=SCENARIOS)
def test_no_client_receives_what_its_own_subscriptions_and_rules_do_not_allow(broker, drawn):
    asyncio.run(scenario(broker, drawn))
