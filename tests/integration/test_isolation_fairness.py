"""Isolation between clients: a client that reads nothing, on a connection carrying many
subscriptions, costs its own quota and nobody else's. Other publishers keep getting 200 and other
subscribers keep receiving; the gateway's memory stays bounded in bytes and comes back when the
connection closes; what the silent client is owed waits in the store, none of it lost. Each
per-client limit refuses with an error naming it, and a connection closed for never sending its
handshake is told why first."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import orjson
import pytest

from tests.integration.helpers import LineConnection, client_for, run_id, take
from veil.client import VeilError
from veil.harness import BrokerProcess
from veil.harness.memory import Peak, resident

pytestmark = pytest.mark.slow
MAX_SUBSCRIPTIONS = 1000  # per client: the memory test's client holds exactly this many on one connection
MAX_CONNECTIONS = 4
MAX_CLIENT_QUEUED = 2 << 20
READ_TIMEOUT = 3
MAX_UNAUTHENTICATED = 64
STALLING = 1000  # publications of 8 KiB, more than a connection's socket buffers hold
SYBILS = 9  # identities that read nothing: with one reader, most of the connected clients
READERS = 7  # other clients, each reading; with the silent one, enough to judge delivery overload
FLOOD_BATCHES, FLOOD_BATCH = 12, 250  # 3,000 publications, each matching all 1,000: 105 MB of lines owed
GROWTH_BOUND = 48 << 20  # what one silent connection of 1,000 subscriptions may add to the gateway
RETURN_BOUND = 20 << 20  # above the baseline once it closed


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    process = BrokerProcess(
        str(tmp_path_factory.mktemp("fairness")),
        "--max-client-subscriptions", str(MAX_SUBSCRIPTIONS), "--max-client-connections", str(MAX_CONNECTIONS),
        "--max-client-queued", str(MAX_CLIENT_QUEUED), "--read-timeout", str(READ_TIMEOUT),
        "--max-unauthenticated", str(MAX_UNAUTHENTICATED),
    ).start()  # fmt: skip
    yield process
    process.close()


async def subscribe_many(broker: BrokerProcess, auth_hash: str, rid: str, count: int) -> list[str]:
    async with client_for(broker, auth_hash) as client:
        gate = asyncio.Semaphore(16)

        async def one() -> str:
            async with gate:
                return (await client.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]

        return list(await asyncio.gather(*(one() for _ in range(count))))


def silent_socket(broker: BrokerProcess, handshake: dict) -> socket.socket:
    """A delivery connection that sends its handshake, then reads nothing (the kernel holds little)."""
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", broker.tcp_port))
    stuck.sendall(orjson.dumps(handshake) + b"\n")
    return stuck


async def publish_batch(http: aiohttp.ClientSession, broker: BrokerProcess, docs: list[dict]) -> list[int]:
    """One NDJSON batch, sent again after a 503 (the flood itself may outrun the pipeline)."""
    body = b"\n".join(map(orjson.dumps, docs))
    headers = {"Content-Type": "application/x-ndjson", "X-Auth-Hash": "flooder"}
    while True:
        async with http.post(f"{broker.url}/publish", data=body, headers=headers) as response:
            if response.status != 503:
                assert response.status == 200, await response.text()
                return [int(i) for i in (await response.json())["ids"]]
        await asyncio.sleep(int(response.headers["Retry-After"]))


async def until_behind(broker: BrokerProcess, subscriptions: int, flood, timeout: float = 180, silent: int = 0) -> None:
    """Flood until the silent connections' subscriptions read from the store instead of memory and
    `silent` clients count as not reading (a write of theirs waits): until then the kernel may still
    take their lines, and as far as the gateway can tell they are clients that read."""
    deadline = time.monotonic() + timeout
    while True:
        figures = broker.metrics()
        if figures["veil_sessions_behind"] >= subscriptions and figures["veil_clients_not_reading"] >= silent:
            return
        assert time.monotonic() < deadline, ("the silent connections never fell behind", figures)
        await flood()


async def stall(
    http: aiohttp.ClientSession, broker: BrokerProcess, rid: str, subscriptions: int, silent: int = 0
) -> None:
    """Publish 8 KiB publications of run `rid` until silent connections' writes wait (more than the
    sockets' buffers hold) and `subscriptions` of them read from the store."""
    pad = "x" * 8192
    sent = 0

    async def flood() -> None:
        nonlocal sent
        await publish_batch(http, broker, [{"run": rid, "n": sent + i, "pad": pad} for i in range(100)])
        sent += 100

    while sent < STALLING:
        await flood()
    await until_behind(broker, subscriptions, flood, silent=silent)


async def test_a_client_that_never_reads_does_not_stop_other_publishers_or_readers(broker):
    rid, tag = run_id(), run_id()
    silent_ids = await subscribe_many(broker, "silent-bob", rid, 16)
    stuck = silent_socket(broker, {"authHash": "silent-bob", "subscriptionIds": silent_ids})
    pad = "x" * 256
    readers = [client_for(broker, f"reader-{i}") for i in range(READERS)]
    publishers = [client_for(broker, f"publisher-{i}") for i in range(READERS)]
    try:
        streams = []
        for reader in readers:
            sub = (await reader.subscribe([{"key": "canary", "val": tag, "op": "eq"}]))["subscriptionId"]
            streams.append(reader.deliveries(sub))
            await streams[-1].__aenter__()
            await streams[-1].connected.wait()
        async with aiohttp.ClientSession() as http:
            sent = 0

            async def flood() -> None:
                nonlocal sent
                await publish_batch(http, broker, [{"run": rid, "n": sent + i, "pad": pad} for i in range(500)])
                sent += 500

            await until_behind(broker, 16, flood)
            refused: list[str] = []
            rounds = 10

            async def publish(i: int) -> None:
                for n in range(rounds):
                    try:
                        await publishers[i].publish({"canary": tag, "from": i, "n": n}, retry_for=0)
                    except Exception as exc:  # every refusal is the failure
                        refused.append(f"publisher-{i}: {exc}")
                    await asyncio.sleep(0.3)

            async def keep_flooding() -> None:
                while True:
                    await flood()
                    await asyncio.sleep(0.2)

            flooding = asyncio.create_task(keep_flooding())
            try:
                await asyncio.gather(*(publish(i) for i in range(READERS)))
            finally:
                flooding.cancel()
            assert not refused, refused[:3]
            assert broker.metrics()["veil_sessions_behind"] >= 16  # the silent client was behind all along
            for stream in streams:
                got = await take(stream, READERS * rounds, timeout=120)
                assert sorted((d.publication["from"], d.publication["n"]) for d in got) == [
                    (i, n) for i in range(READERS) for n in range(rounds)
                ]
    finally:
        stuck.close()
        for client in (*readers, *publishers):
            await client.close()


async def test_many_clients_that_never_read_do_not_stop_publishers(broker):
    """Clients that read nothing, under as many identities as it takes to be most of the connected
    clients, are behind because of themselves: publishes go on, and so does a reader's delivery."""
    rid, tag = run_id(), run_id()
    stuck = []
    for i in range(SYBILS):
        ids = await subscribe_many(broker, f"sybil-{i}", rid, 2)
        stuck.append(silent_socket(broker, {"authHash": f"sybil-{i}", "subscriptionIds": ids}))
    reader, publisher = client_for(broker, "sybil-reader"), client_for(broker, "sybil-publisher")
    try:
        sub = (await reader.subscribe([{"key": "canary", "val": tag, "op": "eq"}]))["subscriptionId"]
        async with reader.deliveries(sub) as stream, aiohttp.ClientSession() as http:
            await stream.connected.wait()
            await stall(http, broker, rid, 2 * SYBILS, silent=SYBILS)
            # left out of the count once a write has waited 0.25 s for its client (the gateway's view of
            # who is behind is taken a few times a second), and a write to a client that reads nothing
            # never goes through: however much more of the flood is delivered to them, they stay out
            assert broker.metrics()["veil_clients_behind"] == 0
            refused = []
            for n in range(20):
                try:
                    await publisher.publish({"canary": tag, "n": n}, retry_for=0)  # a 503 is the failure
                except VeilError as exc:
                    refused.append(str(exc))
                await asyncio.sleep(0.1)
            assert not refused, refused[:3]
            assert sorted(d.publication["n"] for d in await take(stream, 20)) == list(range(20))
    finally:
        for connection in stuck:
            connection.close()
        await reader.close()
        await publisher.close()


async def test_ending_a_subscription_of_a_connection_that_reads_nothing_waits_for_nobody(broker):
    """Its error line is handed over, not waited for: the unsubscription (and whatever else ends a
    subscription, such as the quarantine on the gateway's own loop) answers at once."""
    rid = run_id()
    ids = await subscribe_many(broker, "silent-ender", rid, 2)
    stuck = silent_socket(broker, {"authHash": "silent-ender", "subscriptionIds": ids})
    try:
        async with aiohttp.ClientSession() as http, client_for(broker, "silent-ender") as owner:
            await stall(http, broker, rid, 2)
            began = time.monotonic()
            await asyncio.wait_for(owner.unsubscribe(ids[0]), 10)
            assert time.monotonic() - began < 5
    finally:
        stuck.close()


async def test_a_silent_connection_of_many_subscriptions_costs_bounded_memory_and_loses_nothing(broker):
    assert broker.process is not None
    rid = run_id()
    ids = await subscribe_many(broker, "silent-mem", rid, MAX_SUBSCRIPTIONS)  # a client may have this many
    async with client_for(broker, "silent-mem") as client:
        with pytest.raises(VeilError) as refused:
            await client.subscribe([{"key": "run", "val": rid, "op": "eq"}])
    assert (refused.value.status, refused.value.field) == (429, "subscriptions"), refused.value
    assert "--max-client-subscriptions" in str(refused.value)
    handshake = {"authHash": "silent-mem", "subscriptionIds": ids, "ack": True}
    published: list[int] = []
    async with aiohttp.ClientSession() as http:
        await publish_batch(http, broker, [{"warm": n} for n in range(200)])  # the publish path's buffers
        stuck = silent_socket(broker, handshake)
        await asyncio.sleep(1)
        baseline = resident(broker.process.pid)
        peak = Peak(broker.process.pid)
        try:
            for _ in range(FLOOD_BATCHES):  # paced, as publishers in the wild are
                published.extend(await publish_batch(http, broker, [{"run": rid, "n": n} for n in range(FLOOD_BATCH)]))
                await asyncio.sleep(0.5)
            broker.wait_processed(120)
            await asyncio.sleep(3)
        finally:
            grown = peak.stop() - baseline
    assert grown < GROWTH_BOUND, f"the gateway grew by {grown >> 20} MiB for one connection that reads nothing"
    figures = broker.metrics()
    assert figures["veil_queued_bytes"] <= MAX_CLIENT_QUEUED + (1 << 20)
    assert figures["veil_sessions_behind"] >= MAX_SUBSCRIPTIONS  # what it is owed waits in the store
    stuck.close()
    await asyncio.sleep(3)
    after = resident(broker.process.pid)
    assert after < baseline + RETURN_BOUND, f"{(after - baseline) >> 20} MiB stayed after the connection closed"
    # Everything it was owed waited in the store: each publication once, to all its subscriptions.
    conn = await LineConnection.open(broker.tcp_port, handshake)
    owed = {pub: set() for pub in published}
    try:
        async with asyncio.timeout(180):
            while any(len(named) < len(ids) for named in owed.values()):
                line = await conn.line()
                assert line is not None and "error" not in line, line
                named = owed[line["seq"]]
                assert named.isdisjoint(line["subscriptionIds"]), "a subscription got a publication twice"
                named.update(line["subscriptionIds"])
    finally:
        conn.close()


async def test_a_client_over_its_connection_limit_gets_an_error_line(broker):
    rid = run_id()
    ids = await subscribe_many(broker, "many-conns", rid, MAX_CONNECTIONS + 1)
    connections = [
        await LineConnection.open(broker.tcp_port, {"authHash": "many-conns", "subscriptionId": s}) for s in ids[:-1]
    ]
    try:
        for conn in connections:
            assert await conn.silent(1.0)  # accepted, nothing to deliver yet
        extra = await LineConnection.open(broker.tcp_port, {"authHash": "many-conns", "subscriptionIds": ids[-1:]})
        error = await extra.line(timeout=10)
        assert (error["status"], error["field"]) == (429, "handshake") and "--max-client-connections" in error["error"]
        assert await extra.line(timeout=10) is None  # then closed
        other = await LineConnection.open(broker.tcp_port, {"authHash": "many-conns", "subscriptionId": ids[-1]})
        assert (await other.line(timeout=10))["status"] == 429  # a single subscription's connection counts alike
        connections.pop().close()
        await asyncio.sleep(1)
        again = await LineConnection.open(broker.tcp_port, {"authHash": "many-conns", "subscriptionId": ids[-1]})
        connections.append(again)
        assert await again.silent(1.0)  # room again once one closed
        async with client_for(broker, "someone-else") as other_client:  # the limit is per client
            sub = (await other_client.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
            async with other_client.deliveries(sub) as stream:
                await asyncio.wait_for(stream.connected.wait(), 10)
    finally:
        for conn in connections:
            conn.close()


async def test_connections_closed_for_sending_no_handshake_get_an_error_line_first(broker):
    """Over the cap the oldest go at once, the others after the read timeout: each is told why."""
    loop = asyncio.get_running_loop()
    sockets = []
    for _ in range(MAX_UNAUTHENTICATED + 8):
        s = socket.socket()
        s.setblocking(False)
        await loop.sock_connect(s, ("127.0.0.1", broker.tcp_port))
        sockets.append(s)

    async def told(s: socket.socket) -> dict:
        received = b""
        async with asyncio.timeout(READ_TIMEOUT + 10):
            while chunk := await loop.sock_recv(s, 4096):
                received += chunk
        assert received.endswith(b"\n"), f"closed without an error line ({received!r})"
        error = orjson.loads(received)
        assert error["field"] == "handshake" and error["status"] == 400, error
        return error

    try:
        # The eighth goes only once the last is admitted: the WebSocket below is then the newest.
        for s in sockets[:8]:
            assert "the oldest went" in (await told(s))["error"]
        async with aiohttp.ClientSession() as http, http.ws_connect(f"ws://127.0.0.1:{broker.ws_port}/") as ws:
            message = await ws.receive(timeout=READ_TIMEOUT + 10)
            assert message.type == aiohttp.WSMsgType.TEXT, message
            error = orjson.loads(message.data)
            assert (error["status"], error["field"]) == (400, "handshake") and "within" in error["error"]
        for s in sockets[8:]:
            await told(s)
    finally:
        for s in sockets:
            s.close()
