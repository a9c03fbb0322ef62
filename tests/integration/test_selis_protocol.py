"""The SELIS protocol against a real broker process with the real Spark pipeline."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from tests.integration.helpers import LineConnection, nothing_more, run_id, take
from veil.client import VeilClient, VeilError
from veil.client.channels import Channel
from veil.config import Config

pytestmark = pytest.mark.slow

SEED_SUBSCRIPTION = [
    {"key": "lat", "val": 14, "type": "int", "op": "gt"},
    {"key": "lon", "val": 53, "type": "int", "op": "lt"},
]


def seed_publication(lat: int, lon: int) -> bytes:
    """The seed's curl body: the defined form with int values."""
    return orjson.dumps(
        {"publication": [{"key": "lat", "val": lat, "type": "int"}, {"key": "lon", "val": lon, "type": "int"}]}
    )


async def post(url: str, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + path, data=body, headers={"Content-Type": content_type}) as response,
    ):
        raw = await response.read()
        return response.status, (orjson.loads(raw) if raw else {})


async def test_seed_curl_example_over_tcp(broker):
    """Exactly the seed's requests; the first test of the module, so no other publication interferes."""
    subscribe = {"authHash": "clientIdHash1", "subscriptionId": "subId", "data": SEED_SUBSCRIPTION}
    status, reply = await post(broker.url, "/subscribe", orjson.dumps(subscribe))
    assert status == 200
    assert reply == {
        "host": "localhost", "port": broker.tcp_port, "ws-port": broker.ws_port, "wsport": broker.ws_port,
        "subscriptionId": "subId",
    }  # fmt: skip
    conn = await LineConnection.open(reply["port"], {"authHash": "clientIdHash1", "subscriptionId": "subId"})
    try:
        for lat, lon in ((20, 10), (10, 10), (30, 60), (15, 52)):
            assert (await post(broker.url, "/publish", seed_publication(lat, lon)))[0] == 200
        assert await conn.line() == {"lat": 20, "lon": 10}
        assert await conn.line() == {"lat": 15, "lon": 52}
        assert await conn.silent()
    finally:
        conn.close()
    assert (await post(broker.url, "/unsubscribe", b'{"authHash": "clientIdHash1", "subscriptionId": "subId"}'))[
        0
    ] == 200


async def test_seed_example_over_websocket(broker):
    status, reply = await post(
        broker.url, "/subscribe", orjson.dumps({"authHash": "clientIdHash1", "data": SEED_SUBSCRIPTION})
    )
    assert status == 200 and reply["subscriptionId"]
    try:
        async with aiohttp.ClientSession() as http, http.ws_connect(f"ws://127.0.0.1:{reply['ws-port']}/") as ws:
            handshake = {"authHash": "clientIdHash1", "subscriptionId": reply["subscriptionId"]}
            await ws.send_str(orjson.dumps(handshake).decode())
            await post(broker.url, "/publish", seed_publication(10, 10))
            await post(broker.url, "/publish", seed_publication(20, 10))
            message = await ws.receive(timeout=60)
            assert orjson.loads(message.data) == {"lat": 20, "lon": 10}
            with pytest.raises(TimeoutError):
                await ws.receive(timeout=1.5)
    finally:
        await post(broker.url, "/unsubscribe", orjson.dumps(handshake))


PUBLICATIONS = [
    {"n": 0, "lat": 20, "lon": 10, "name": "MED FRIGO", "ok": True, "temp": -3.5},
    {"n": 1, "lat": 14, "lon": 53, "name": "frigo", "ok": False, "temp": 4},
    {"n": 2, "lat": 14.5, "lon": 52.9, "name": "MED", "code": "20"},
    {"n": 3, "pos": {"lat": 1, "geo": [7, {"c": "x"}]}, "name": "ZED"},
    {"n": 4, "lat": "20", "ok": "true"},
]
DEFINED = [  # n = 5, sent in the defined form with string values
    {"key": "n", "val": "5", "type": "int"},
    {"key": "lat", "val": "15", "type": "int"},
    {"key": "temp", "val": "0.5", "type": "double"},
    {"key": "name", "val": "MEDIUM", "type": "string"},
]
ROW = [{"key": "n", "val": 6}, {"key": "lat", "val": 100}, {"key": "ok", "val": True}]  # n = 6, row form

CASES = [
    ([{"key": "lat", "val": 14, "type": "int", "op": "gt"}], {0, 2, 5, 6}),
    ([{"key": "lon", "val": 53, "type": "int", "op": "lt"}], {0, 2}),
    (SEED_SUBSCRIPTION, {0, 2}),
    ([{"key": "lat", "val": "14", "type": "int", "op": "ge"}], {0, 1, 2, 5, 6}),
    ([{"key": "lat", "val": "14.0", "type": "float", "op": "le"}], {1}),
    ([{"key": "lat", "val": 14, "type": "int", "op": "lq"}], {1}),
    ([{"key": "lat", "val": 20.0, "type": "double", "op": "eq"}], {0}),
    ([{"key": "lat", "val": "20", "type": "string", "op": "eq"}], {4}),
    ([{"key": "lat", "val": 20, "type": "int", "op": "ne"}], {1, 2, 5, 6}),
    ([{"key": "temp", "val": [-4, 1], "type": "float", "op": "between"}], {0, 5}),
    ([{"key": "lat", "val": [14, 100], "op": "in"}], {1, 6}),
    ([{"key": "name", "val": "FRIGO", "type": "string", "op": "contains"}], {0}),
    ([{"key": "name", "val": "MED", "type": "string", "op": "ss"}], {0, 2, 5}),
    ([{"key": "name", "val": "MED", "op": "starts_with"}], {0, 2, 5}),
    ([{"key": "name", "val": "GO", "op": "ends_with"}], {0}),
    ([{"key": "name", "val": "MEDIUM", "type": "string", "op": "gt"}], {1, 3}),
    ([{"key": "ok", "val": "true", "type": "boolean", "op": "eq"}], {0, 6}),
    ([{"key": "ok", "val": True, "type": "boolean", "op": "ne"}], {1}),
    ([{"key": "name", "val": "*", "op": "eq"}], {0, 1, 2, 3, 5}),
    ([{"key": "pos.geo.[1].c", "val": "x", "op": "eq"}], {3}),
    ([{"key": "pos.lat", "val": 1, "op": "eq"}, {"key": "pos.geo.[0]", "val": 5, "op": "gt"}], {3}),
    ([{"key": "code", "val": 20, "type": "int", "op": "eq"}], set()),
    ([{"key": "temp", "val": 100, "op": "ne"}], {0, 1, 5}),
    ([{"key": "lat", "val": 14, "op": "GT"}, {"key": "ok", "val": True, "op": "eq"}], {0, 6}),
]


async def test_every_operator_type_and_form(broker):
    rid = run_id()
    run = {"key": "run", "val": rid, "op": "eq"}
    async with VeilClient(broker.url, auth_hash="ops", tcp_port=broker.tcp_port, ws_port=broker.ws_port) as client:
        streams = []
        for data, _ in CASES:
            reply = await client.subscribe([*data, run])
            stream = client.deliveries(reply["subscriptionId"])
            await stream.__aenter__()
            streams.append(stream)
        try:
            for publication in PUBLICATIONS:
                await client.publish({**publication, "run": rid})
            await client.publish({"publication": [*DEFINED, {"key": "run", "val": rid, "type": "string"}]})
            await client.publish([*ROW, {"key": "run", "val": rid}])
            for (data, expected), stream in zip(CASES, streams, strict=True):
                got = await take(stream, len(expected))
                assert {d.publication["n"] for d in got} == expected, data
            broker.wait_processed()
            for stream in streams:
                await nothing_more(stream, 0.3)
        finally:
            for stream in streams:
                await stream.aclose()


async def test_empty_subscription_matches_everything(broker):
    rid = run_id()
    async with VeilClient(broker.url, auth_hash="all", tcp_port=broker.tcp_port) as client:
        reply = await client.subscribe([])
        async with client.deliveries(reply["subscriptionId"]) as stream:
            await client.publish({"anything": rid})
            got = await take(stream, 1)
            assert got[0].publication == {"anything": rid}
        await client.unsubscribe(reply["subscriptionId"])


async def test_bad_input_gets_clear_errors_and_loses_nothing(broker):
    rid = run_id()
    url = broker.url
    async with VeilClient(url, auth_hash="alice", tcp_port=broker.tcp_port, ws_port=broker.ws_port) as alice:
        reply = await alice.subscribe([{"key": "run", "val": rid, "op": "eq"}], f"alice-{rid}")
        sub_id = reply["subscriptionId"]
        await alice.publish({"run": rid, "n": 0})

        http_cases = [
            ("/publish", b"{not json", "body", 400),
            ("/publish", b"42", "body", 400),
            ("/publish", b'{"publication": [{"key": "lat", "val": "north", "type": "int"}]}', "publication[0].val", 400),
            ("/publish", b'{"publication": [{"key": "lat", "val": 1, "type": "decimal"}]}', "publication[0].type", 400),
            ("/publish", b'{"publication": [{"key": "a", "val": 1}, {"key": "a", "val": 2}]}', "publication[1].key", 400),
            ("/publish", b'{"a": "' + b"x" * (2 << 20) + b'"}', "body", 413),
            ("/subscribe", b'{"authHash": "alice", "data": [{"key": "a", "val": 1, "op": "like"}]}', "data[0].op", 400),
            ("/subscribe", b'{"authHash": "alice", "data": [{"key": "a", "val": true, "op": "gt"}]}', "data[0].op", 400),
            ("/subscribe", b'{"authHash": "alice", "data": [{"key": "a", "val": 5, "op": "gt"}, '
                           b'{"key": "a", "val": 3, "op": "lt"}]}', "data", 400),
            ("/subscribe", b'{"authHash": 7, "data": []}', "authHash", 400),
            ("/subscribe", b'{"authHash": "alice", "data": {"key": "a"}}', "data", 400),
            ("/subscribe", b'{"authHash": "mallory", "subscriptionId": "alice-' + rid.encode() + b'", "data": []}',
             "subscriptionId", 403),
            ("/unsubscribe", b'{"authHash": "alice", "subscriptionId": "no-such-subscription"}', "subscriptionId", 404),
            ("/unsubscribe", b'{"authHash": "mallory", "subscriptionId": "alice-' + rid.encode() + b'"}',
             "subscriptionId", 404),  # as for an id nobody holds
            ("/nowhere", b"{}", "path", 404),
        ]  # fmt: skip
        for path, body, field, status in http_cases:
            got_status, error = await post(url, path, body)
            assert (got_status, error.get("field")) == (status, field), (path, body[:80], error)
            assert error["error"]
        got_status, error = await post(url, "/publish", b'{"a": 1}\n{"a": \n', "application/x-ndjson")
        assert got_status == 400 and error["field"].startswith("line 2")
        async with aiohttp.ClientSession() as http, http.get(url + "/publish") as response:
            assert response.status == 405

        line_cases = [
            (b"this is not json\n", "handshake", 400),
            (b'{"authHash": "alice"}\n', "subscriptionId", 400),
            (b'{"authHash": "alice", "subscriptionId": "no-such-subscription"}\n', "subscriptionId", 404),
            (b'{"authHash": "mallory", "subscriptionId": "alice-' + rid.encode() + b'"}\n', "subscriptionId", 404),
            (b"{" + b" " * (70 * 1024) + b"}\n", "handshake", 400),
        ]
        for handshake, field, status in line_cases:
            conn = await LineConnection.open(broker.tcp_port, handshake)
            error = await conn.line()
            assert (error["field"], error["status"]) == (field, status), error
            assert await conn.line() is None  # closed after the error line
            conn.close()
        async with aiohttp.ClientSession() as http, http.ws_connect(f"ws://127.0.0.1:{broker.ws_port}/") as ws:
            await ws.send_str('{"authHash": "mallory", "subscriptionId": "alice-' + rid + '"}')
            message = await ws.receive(timeout=10)
            assert orjson.loads(message.data)["status"] == 404

        await alice.publish({"run": rid, "n": 1})
        async with alice.deliveries(sub_id) as stream:
            got = await take(stream, 2)
            assert [d.publication["n"] for d in got] == [0, 1]
        assert broker.health()["status"] == "ok"


async def test_disconnected_subscription_gets_everything_in_order_once(broker):
    rid = run_id()
    async with VeilClient(broker.url, auth_hash="bob", tcp_port=broker.tcp_port, ws_port=broker.ws_port) as client:
        reply = await client.subscribe([{"key": "run", "val": rid, "op": "eq"}, {"key": "n", "val": 0, "op": "ge"}])
        sub_id = reply["subscriptionId"]
        async with client.deliveries(sub_id) as stream:
            await client.publish({"run": rid, "n": 0})
            assert [d.publication["n"] for d in await take(stream, 1)] == [0]
        for n in range(1, 41):
            await client.publish({"run": rid, "n": n})
            await client.publish({"run": rid, "n": -n})  # never matches
        broker.wait_processed()
        for transport in ("ws", "tcp"):
            async with client.deliveries(sub_id, transport=transport) as stream:
                if transport == "ws":
                    got = await take(stream, 20)
                    assert [d.publication["n"] for d in got] == list(range(1, 21))
                else:
                    got = await take(stream, 20)
                    assert [d.publication["n"] for d in got] == list(range(21, 41))
                    await nothing_more(stream)
            assert stream.dropped_duplicates == 0


async def test_a_multiplexed_stream_delivers_to_each_subscription_once_across_reconnects(broker):
    rid = run_id()
    async with VeilClient(broker.url, auth_hash="erin", tcp_port=broker.tcp_port, ws_port=broker.ws_port) as client:
        run = {"key": "run", "val": rid, "op": "eq"}
        low = (await client.subscribe([run, {"key": "n", "val": 10, "op": "lt"}]))["subscriptionId"]
        even = (await client.subscribe([run, {"key": "even", "val": True, "op": "eq"}]))["subscriptionId"]
        wanted = sorted((n, s) for n in range(14) for s, holds in ((low, n < 10), (even, n % 2 == 0)) if holds)
        async with client.multiplexed([low, even], transport="ws") as stream:
            for n in range(7):
                await client.publish({"run": rid, "n": n, "even": n % 2 == 0})
            live = await take(stream, 7)
            # live: one line per publication and matcher partition, naming the subscriptions it holds
            while sum(len(d.subscription_ids) for d in live) < 11:
                live += await take(stream, 1)
            assert stream.dropped_duplicates == 0
        named = sorted((d.publication["n"], s) for d in live for s in d.subscription_ids)
        assert named == [(n, s) for n, s in wanted if n < 7]
        assert all(sum(d.publication["n"] == n for d in live) <= Config.partitions for n in range(7))
        for n in range(7, 14):  # while disconnected
            await client.publish({"run": rid, "n": n, "even": n % 2 == 0})
        broker.wait_processed()
        got = [(d.publication["n"], s) for d in live for s in d.subscription_ids]
        async with client.multiplexed([low, even]) as stream:
            while len(got) < len(wanted):  # from the backlogs: per subscription, in order
                delivery = (await take(stream, 1))[0]
                got += [(delivery.publication["n"], s) for s in delivery.subscription_ids]
            await nothing_more(stream)
            assert stream.dropped_duplicates == 0  # the broker resumed each subscription where it stopped
        assert sorted(got) == wanted  # every (publication, subscription) once


class Wire:
    """A delivery connection read as the broker writes it: no client library between the test and
    the lines (the library drops repeats, and would hide a broker that re-sends)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._documents = channel.documents()

    @classmethod
    async def open(cls, client: VeilClient, transport: str, handshake: dict) -> Wire:
        channel = await client.open_channel(transport)
        await channel.send(orjson.dumps(handshake))
        return cls(channel)

    async def read(self, n: int, timeout: float = 60) -> list[dict]:
        async with asyncio.timeout(timeout):
            return [orjson.loads(await anext(self._documents)) for _ in range(n)]

    async def ack(self, seq: int) -> None:
        await self.channel.send(orjson.dumps({"ack": seq}))
        await asyncio.sleep(0.5)  # read by the broker before this connection closes

    async def silent(self, wait: float = 1.5) -> bool:
        try:
            async with asyncio.timeout(wait):
                await anext(self._documents)
        except (TimeoutError, StopAsyncIteration):
            return True
        return False

    async def close(self) -> None:
        await self.channel.close()


@pytest.mark.parametrize("transport", ["tcp", "ws"])
async def test_acknowledgements_and_resume_after_on_the_wire(broker, transport):
    rid = run_id()
    async with VeilClient(broker.url, auth_hash="ivan", tcp_port=broker.tcp_port, ws_port=broker.ws_port) as client:
        sub_id = (await client.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
        for n in range(10):
            await client.publish({"run": rid, "n": n})
        broker.wait_processed()
        hello = {"authHash": "ivan", "subscriptionId": sub_id, "envelope": True, "ack": True}
        first = await Wire.open(client, transport, hello)
        lines = await first.read(4)
        assert [line["publication"]["n"] for line in lines] == [0, 1, 2, 3]
        await first.ack(lines[1]["seq"])
        await first.close()

        # no resume point: after the acknowledged line; what was written and not acknowledged comes again
        second = await Wire.open(client, transport, hello)
        lines += await second.read(4)
        assert [line["publication"]["n"] for line in lines[4:]] == [2, 3, 4, 5]
        resume = lines[-1]["seq"]
        await second.close()

        # a resume point: nothing at or below it, whatever the acknowledgements said
        third = await Wire.open(client, transport, {**hello, "resumeAfter": resume})
        rest = await third.read(4)
        await client.publish({"run": rid, "n": 10})
        rest += await third.read(1)
        assert [line["publication"]["n"] for line in rest] == [6, 7, 8, 9, 10]
        seqs = [line["seq"] for line in rest]
        assert resume < seqs[0] and seqs == sorted(set(seqs))
        assert await third.silent()
        await third.close()


@pytest.mark.parametrize("transport", ["tcp", "ws"])
async def test_a_multiplexed_connection_resumes_each_subscription_on_the_wire(broker, transport):
    rid = run_id()
    async with VeilClient(broker.url, auth_hash="judy", tcp_port=broker.tcp_port, ws_port=broker.ws_port) as client:
        run = {"key": "run", "val": rid, "op": "eq"}
        every = (await client.subscribe([run]))["subscriptionId"]
        even = (await client.subscribe([run, {"key": "even", "val": True, "op": "eq"}]))["subscriptionId"]
        wanted = sorted([(n, every) for n in range(10)] + [(n, even) for n in range(0, 10, 2)])
        for n in range(10):
            await client.publish({"run": rid, "n": n, "even": n % 2 == 0})
        broker.wait_processed()
        hello = {"authHash": "judy", "subscriptionIds": [every, even], "ack": True}
        got: list[tuple[int, str]] = []
        last: dict[str, int] = {}
        seq_of: dict[int, int] = {}

        def received(lines: list[dict], after: dict[str, int]) -> None:
            for line in lines:
                seq_of[line["publication"]["n"]] = line["seq"]
                for sub_id in line["subscriptionIds"]:
                    assert line["seq"] > last.get(sub_id, after.get(sub_id, -1)), "repeated or out of order"
                    last[sub_id] = line["seq"]
                    got.append((line["publication"]["n"], sub_id))

        first = await Wire.open(client, transport, hello)
        while len(last) < 2 or len(got) < 5:  # both subscriptions part-way
            received(await first.read(1), {})
        await first.close()
        stopped = dict(last)

        second = await Wire.open(client, transport, {**hello, "resumeAfter": [stopped[every], stopped[even]]})
        last.clear()
        while len(got) < len(wanted):
            received(await second.read(1), stopped)
        assert await second.silent()
        assert sorted(got) == wanted  # every (publication, subscription) once
        await second.close()

        # one resume point for all of them
        third = await Wire.open(client, transport, {**hello, "resumeAfter": seq_of[5]})
        got.clear()
        last.clear()
        while len(got) < 6:
            received(await third.read(1), dict.fromkeys((every, even), seq_of[5]))
        assert await third.silent()
        assert sorted(got) == sorted([(n, every) for n in range(6, 10)] + [(6, even), (8, even)])
        await third.close()


async def test_plain_line_subscriber_resumes_after_reconnect(broker):
    rid = run_id()
    async with VeilClient(broker.url, auth_hash="carol", tcp_port=broker.tcp_port) as client:
        reply = await client.subscribe([{"key": "run", "val": rid, "op": "eq"}])
        handshake = {"authHash": "carol", "subscriptionId": reply["subscriptionId"]}
        for n in range(3):
            await client.publish({"run": rid, "n": n})
        broker.wait_processed()
        conn = await LineConnection.open(broker.tcp_port, handshake)
        assert [(await conn.line())["n"] for _ in range(3)] == [0, 1, 2]
        await asyncio.sleep(0.5)  # the cursor is saved in the background
        conn.close()
        await client.publish({"run": rid, "n": 3})
        conn = await LineConnection.open(broker.tcp_port, handshake)
        assert (await conn.line())["n"] == 3
        assert await conn.silent()
        conn.close()


async def test_unsubscribe_stops_deliveries_and_closes_the_connection(broker):
    rid = run_id()
    async with VeilClient(broker.url, auth_hash="dave", tcp_port=broker.tcp_port) as client:
        reply = await client.subscribe([{"key": "run", "val": rid, "op": "eq"}])
        stream = client.deliveries(reply["subscriptionId"])
        await stream.__aenter__()
        await stream.connected.wait()
        await client.unsubscribe(reply["subscriptionId"])
        with pytest.raises(VeilError) as err:
            await take(stream, 1, timeout=30)
        assert err.value.status in (404, 410)
        await stream.aclose()


def test_command_line_publish_and_subscribe(broker):
    import subprocess
    import sys

    rid = run_id()
    veil = [sys.executable, "-m", "veil.cli"]
    subscriber = subprocess.Popen(
        [*veil, "subscribe", "--url", broker.url, "--auth-hash", "cli", "lat>14", f"run={rid}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        said = subscriber.stderr.readline().decode()
        assert said.startswith("subscribed: ") and "removed when this command ends" in said, said
        sub_id = said.split()[1]
        for lat in (10, 20):
            published = subprocess.run(
                [*veil, "publish", "--url", broker.url, orjson.dumps({"lat": lat, "run": rid}).decode()],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            assert published.stdout.strip().isdigit()
        line = orjson.loads(subscriber.stdout.readline())
        assert line == {"seq": int(published.stdout), "id": published.stdout.strip(), "publication": {"lat": 20, "run": rid}}
        listed = subprocess.run(
            [*veil, "subscriptions", "--url", broker.url, "--auth-hash", "cli"], capture_output=True, check=True
        )
        mine = [orjson.loads(doc) for doc in listed.stdout.splitlines()]
        assert {"subscriptionId": sub_id, "data": [{"key": "lat", "op": "gt", "val": 14},
                {"key": "run", "op": "eq", "val": rid}]}.items() <= next(d for d in mine if d["subscriptionId"] == sub_id).items()  # fmt: skip
    finally:
        subscriber.terminate()  # SIGTERM: it removes the subscription it made, and says nothing more
        _, err = subscriber.communicate(timeout=10)
    assert subscriber.returncode == 143 and not err, err
    shown = subprocess.run(
        [*veil, "subscriptions", "show", sub_id, "--url", broker.url, "--auth-hash", "cli"], capture_output=True, text=True
    )  # fmt: skip
    assert shown.returncode == 1 and "404" in shown.stderr
    bad = subprocess.run(
        [*veil, "subscribe", "--url", broker.url, "--auth-hash", "cli", "lat??14"], capture_output=True, text=True
    )  # fmt: skip
    assert bad.returncode == 2 and "lat??14" in bad.stderr


def test_a_command_line_subscription_taken_over_by_id_is_kept_and_an_edge_stops_on_sigterm(broker):
    import subprocess
    import sys

    veil = [sys.executable, "-m", "veil.cli"]
    flags = ["--url", broker.url, "--auth-hash", "cli-keeper"]
    first = subprocess.Popen([*veil, "subscribe", *flags, "lat>14"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sub_id = first.stderr.readline().decode().split()[1]
    # the user keeps it: a subscribe naming its id replaces it, and ends the first command's connection
    kept = subprocess.Popen([*veil, "subscribe", *flags, "--id", sub_id, "lat>15"], stderr=subprocess.PIPE)
    assert "kept" in kept.stderr.readline().decode()
    _, err = first.communicate(timeout=30)
    assert b"subscribed again meanwhile: kept" in err and b"Traceback" not in err, err
    kept.terminate()
    kept.wait(10)
    shown = subprocess.run([*veil, "subscriptions", "show", sub_id, *flags], capture_output=True, check=True)
    assert orjson.loads(shown.stdout)["data"] == [{"key": "lat", "op": "gt", "val": 15}]
    edge = subprocess.Popen(
        [*veil, "edge", *flags, "sensor=NO2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )  # fmt: skip
    assert edge.stderr.readline().startswith(b"wanted: ")  # stdin stays open: it waits for a reading
    edge.terminate()
    assert edge.wait(10) == 143 and b"Traceback" not in edge.stderr.read()


async def test_publication_sees_exactly_the_subscriptions_before_it(broker):
    rid = run_id()
    run = {"key": "run", "val": rid, "op": "eq"}
    async with VeilClient(broker.url, auth_hash="hugo") as client:
        await client.subscribe([run, {"key": "lat", "val": 10, "op": "gt"}], f"s-{rid}")
        await client.publish({"run": rid, "lat": 20, "n": 1})  # matches the first version
        await client.subscribe([run, {"key": "lat", "val": 10, "op": "lt"}], f"s-{rid}")  # replaces it
        await client.publish({"run": rid, "lat": 20, "n": 2})  # the replaced version would have matched
        later = (await client.subscribe([run]))["subscriptionId"]  # registered after n = 1 and 2
        await client.publish({"run": rid, "lat": 5, "n": 3})
        received = []
        done = asyncio.Event()

        def on_delivery(delivery) -> None:
            received.append(delivery.publication["n"])
            if len(received) == 2:
                done.set()

        listener = asyncio.create_task(client.listen(f"s-{rid}", on_delivery))
        await asyncio.wait_for(done.wait(), 60)
        listener.cancel()
        assert received == [1, 3]
        async with client.deliveries(later) as stream:
            assert [d.publication["n"] for d in await take(stream, 1)] == [3]
            broker.wait_processed()
            await nothing_more(stream)
