"""Hostile clients: each request that once stopped delivery for everybody, sent exactly as it was,
now gets a clear refusal while a canary publication sent afterwards still reaches its subscriber.
The broker runs as in production: static hashes are secrets the registry declares (`--auth` default),
no anonymous clients."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import threading
import time
from contextlib import asynccontextmanager

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.helpers import LineConnection, take
from veil.client import VeilClient
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow
ALICE, BOB, ROOT = "alice-secret-1", "bob-secret-1", "root-secret-1"
FINGERPRINT = "ab" * 32  # what a client certificate's SHA-256 fingerprint looks like
REGISTRY = {
    "admins": ["root"],
    "hashes": {ALICE: "alice", BOB: "bob", ROOT: "root"},
    "users": {FINGERPRINT: {}, "carol": {}},
    "rules": {"*": [[]]},
}
UNAUTHENTICATED_CAP = 200
READ_TIMEOUT = 3


def registry_file(directory: str) -> str:
    path = os.path.join(directory, "registry.json")
    with open(path, "w") as handle:
        json.dump(REGISTRY, handle)
    return path


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("hostile"))
    process = BrokerProcess(
        os.path.join(directory, "broker"),
        "--auth", "certificate,token,hash", "--anonymous", "false", "--registry", registry_file(directory),
        "--read-timeout", str(READ_TIMEOUT), "--max-unauthenticated", str(UNAUTHENTICATED_CAP),
    ).start()  # fmt: skip
    yield process
    process.close()


def client(broker: BrokerProcess, auth_hash: str = ALICE) -> VeilClient:
    return VeilClient(broker.url, auth_hash=auth_hash, tcp_port=broker.tcp_port, ws_port=broker.ws_port)


@asynccontextmanager
async def canary(broker: BrokerProcess):
    """A connected canary subscription; `check()` publishes a canary and waits for it."""
    tag = os.urandom(8).hex()
    async with client(broker, BOB) as bob:
        sub = (await bob.subscribe([{"key": "canary", "val": tag, "op": "eq"}]))["subscriptionId"]
        async with bob.deliveries(sub) as stream:
            await stream.connected.wait()
            count = 0

            async def check() -> None:
                nonlocal count
                count += 1
                await bob.publish({"canary": tag, "n": count})
                (got,) = await take(stream, 1, timeout=120)
                assert got.publication == {"canary": tag, "n": count}

            await check()
            yield check


async def post(broker: BrokerProcess, path: str, body: bytes, **headers: str) -> tuple[int, dict, dict]:
    headers = {"Content-Type": "application/json", "X-Auth-Hash": ALICE, **headers}
    async with aiohttp.ClientSession() as http, http.post(f"{broker.url}{path}", data=body, headers=headers) as r:
        return r.status, orjson.loads(await r.read()), dict(r.headers)


async def test_a_document_nested_1000_levels_is_refused(broker):
    async with canary(broker) as check:
        deep = b'{"d":' + b'{"a":' * 999 + b"1" + b"}" * 1000
        status, body, _ = await post(broker, "/publish", deep)
        assert (status, body["field"]) == (400, "body") and "nested deeper than 32" in body["error"]
        await check()


async def test_a_request_the_http_layer_cannot_read_gets_a_json_error(broker):
    """A header line beyond the HTTP parser's limit is refused before any handler runs: in JSON too."""
    async with canary(broker) as check:
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        writer.write(b"POST /publish HTTP/1.1\r\nHost: x\r\nX-Auth-Hash: " + b"a" * 10_000 + b"\r\n\r\n")
        head, _, body = (await asyncio.wait_for(reader.read(), 10)).partition(b"\r\n\r\n")
        writer.close()
        assert head.startswith(b"HTTP/1.0 400") and b"Content-Type: application/json" in head
        error = orjson.loads(body)
        assert (error["field"], error["status"]) == ("request", 400) and "8190 bytes" in error["error"]
        await check()


@pytest.mark.parametrize("window", [1e308, 0.0001])
async def test_top_k_windows_beyond_the_clock_are_refused(broker, window):
    async with canary(broker) as check:
        doc = {"authHash": ALICE, "data": [], "topk": {"k": 1, "w": window, "score": [{"key": "v", "prefer": "high"}]}}
        status, body, _ = await post(broker, "/subscribe", orjson.dumps(doc))
        assert (status, body["field"]) == (400, "topk.w")
        async with client(broker) as alice:
            await alice.publish({"v": 1})
        await check()


async def test_huge_subscriptions_are_refused_quickly_and_nobody_waits(broker):
    async with canary(broker) as check:
        values = orjson.dumps({"authHash": ALICE, "data": [{"key": "x", "op": "in", "val": list(range(145_000))}]})
        many = orjson.dumps({"authHash": ALICE, "data": [{"key": f"k{i}", "val": 1} for i in range(22_000)]})
        for body, field in ((values, "data[0].val"), (many, "data")):
            assert len(body) < 1 << 20  # under the body limit: the limits at the door refuse them
            started = time.monotonic()
            refused = asyncio.create_task(post(broker, "/subscribe", body))
            async with aiohttp.ClientSession() as http, http.get(f"{broker.url}/health") as response:
                assert response.status == 200  # the event loop answered meanwhile
            status, error, _ = await refused
            assert (status, error["field"]) == (413, field) and "at most" in error["error"]
            assert time.monotonic() - started < 5
        await check()


async def test_half_sent_requests_cannot_take_the_gateway(broker):
    logged = os.path.getsize(broker.log_path)
    async with canary(broker) as check:
        loop = asyncio.get_running_loop()
        sockets = []
        for port in (broker.port, broker.ws_port, broker.tcp_port):
            for _ in range(UNAUTHENTICATED_CAP + 50):
                s = socket.socket()
                s.setblocking(False)
                await loop.sock_connect(s, ("127.0.0.1", port))
                await loop.sock_sendall(s, b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Le" if port != broker.tcp_port else b'{"auth')
                sockets.append(s)
        await check()  # new clients get in while hundreds wait half-sent
        await asyncio.sleep(READ_TIMEOUT + 2)
        async def closed(s: socket.socket) -> bool:
            """Whether the gateway closed it (after an error line, for the TCP handshake)."""
            try:
                async with asyncio.timeout(2):
                    while await loop.sock_recv(s, 4096):
                        pass
            except TimeoutError:
                return False
            except ConnectionError:
                pass
            return True

        assert all([await closed(s) for s in sockets])  # by the cap, or by the read timeout
        for s in sockets:
            s.close()
        health = broker.health()
        assert health["status"] == "ok", health
        for port in (broker.port, broker.ws_port):  # malformed HTTP: a line in the log each, no traceback
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nno colon here\r\n\r\n")
            assert b" 400 " in await reader.readline()
            writer.close()
        await check()
    with open(broker.log_path, errors="replace") as handle:
        handle.seek(logged)
        log = handle.read()
    assert "Traceback" not in log and log.count("malformed request from") == 2, log[-3000:]


async def test_a_batch_larger_than_the_commit_queue_gets_413(broker):
    async with canary(broker) as check:
        batch = b"\n".join(orjson.dumps({"n": n}) for n in range(20_001))
        status, body, headers = await post(broker, "/publish", batch, **{"Content-Type": "application/x-ndjson"})
        assert (status, body["field"]) == (413, "body") and "at most 20000" in body["error"]
        assert "Retry-After" not in headers
        await check()


async def test_resume_after_beyond_64_bits_gets_an_error_line(broker):
    async with canary(broker) as check, client(broker) as alice:
        sub = (await alice.subscribe([{"key": "x", "val": 1}]))["subscriptionId"]
        conn = await LineConnection.open(
            broker.tcp_port, b'{"authHash": "%s", "subscriptionId": "%s", "resumeAfter": 9223372036854775808}\n'
            % (ALICE.encode(), sub.encode()),
        )  # fmt: skip
        error = await conn.line(timeout=10)
        assert (error["status"], error["field"]) == (400, "resumeAfter")
        conn.close()
        await check()


async def test_duplicate_keys_and_odd_digits_are_refused(broker):
    async with canary(broker) as check:
        status, body, _ = await post(broker, "/publish", b'{"type": "y", "type": "x"}')
        assert (status, body["field"]) == (400, "body") and "'type' given twice" in body["error"]
        for spelled in ("\uff12", "\u0663", "1_000"):  # a full-width 2, an Arabic-Indic 3
            status, body, _ = await post(broker, "/publish", b'{"a": 1}', **{"X-Valid-For": spelled})
            assert (status, body["field"]) == (400, "X-Valid-For")
        await check()


async def test_names_are_not_credentials(broker):
    """A user id, a certificate fingerprint or a token subject claimed as authHash gets 401; a declared
    secret works, and acts as the user it maps to."""
    async with canary(broker) as check:
        for claimed in ("alice", FINGERPRINT, "carol"):
            status, body, _ = await post(broker, "/subscribe", orjson.dumps({"authHash": claimed, "data": []}))
            assert (status, body["field"]) == (401, "authHash")
        async with client(broker) as alice:
            sub = (await alice.subscribe([{"key": "x", "val": 1}]))["subscriptionId"]
        impostor = await LineConnection.open(broker.tcp_port, {"authHash": "alice", "subscriptionId": sub})
        assert (await impostor.line(timeout=10))["status"] == 401
        impostor.close()
        await check()


EDGE_FLOATS = [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1.7976931348623157e308, -1.7976931348623157e308]
NON_FINITE = ["NaN", "-NaN", "Infinity", "-Infinity", "inf", "-inf", "nan", "1e999", "-1e999", "1e-999", "Inf"]
json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from(EDGE_FLOATS)
    | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(NON_FINITE)
    | st.text(max_size=30) | st.text(st.characters(codec="utf-8"), max_size=5)
)  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=40,
)


def nested(depth: int, leaf: object) -> object:
    for level in range(depth):
        leaf = {"n": leaf} if level % 2 else [leaf]
    return leaf


@st.composite
def publication_bodies(draw: st.DrawFn, tag: str) -> tuple[bytes, dict[str, str], str]:
    """A raw, defined or row publication at the edges, as bytes (some not even JSON)."""
    form = draw(st.sampled_from(["raw", "deep", "defined", "row", "text", "dup"]))
    doc: object
    if form == "raw":
        doc = draw(st.dictionaries(st.text(max_size=12), json_values, max_size=8))
    elif form == "deep":
        doc = {"d": nested(draw(st.integers(0, 70)), draw(json_scalars))}
    elif form in ("defined", "row"):
        entries = draw(st.lists(st.fixed_dictionaries(
            {"key": st.text(max_size=8), "val": json_values},
            optional={"type": st.sampled_from(["int", "float", "double", "boolean", "string", "long", "x", 7])},
        ), max_size=6))  # fmt: skip
        doc = {"publication": entries} if form == "defined" else entries
    if form == "text":  # NaN and infinities spelled as JSON parsers never agreed on, and broken documents
        body = draw(st.sampled_from([
            b'{"v": %s}' % draw(st.sampled_from(NON_FINITE)).encode(), b'{"a": "\\ud800"}', b'{"a": 1,}',
            b"\xff\xfe{}", b'{"a": 1} {"b": 2}', b"[]", b"{}", b'{"": 0}', b"null", b"1e400",
        ]))  # fmt: skip
    elif form == "dup":
        key = draw(st.text(min_size=1, max_size=6)).replace('"', "").replace("\\", "") or "k"
        body = b'{"%s": 1, "%s": 2}' % (key.encode(), key.encode())
    else:
        if isinstance(doc, dict) and form == "raw" and draw(st.booleans()):
            doc["fuzz"] = tag
        body = json.dumps(doc).encode()  # the standard library writes integers beyond 64 bits too
    headers = {}
    if draw(st.booleans()):
        headers["X-Valid-For"] = draw(
            st.sampled_from(["1", "0", "-5", "2592000000", "2592000001", "99999999999999999999", "\uff12", "1_000", " 5 "])
        )
    return body, headers, form


@st.composite
def subscription_bodies(draw: st.DrawFn, tag: str) -> bytes:
    ops = ["eq", "ne", "gt", "lt", "ge", "le", "lq", "between", "in", "contains", "ss", "starts_with", "ends_with", "op"]
    data = draw(st.lists(st.fixed_dictionaries(
        {"key": st.text(max_size=8) | st.just("v"), "op": st.sampled_from(ops), "val": json_values},
        optional={"type": st.sampled_from(["int", "float", "boolean", "string", "nope"])},
    ), max_size=5))  # fmt: skip
    data.insert(draw(st.integers(0, len(data))), {"key": "fuzz", "val": tag, "op": "eq"})
    doc: dict = {"authHash": ALICE, "data": data}
    if draw(st.booleans()):
        doc["topk"] = {
            "k": draw(st.sampled_from([0, 1, 3, 10_000, 10_001, -1, 2**63, 1.5, "3"])),
            "w": draw(st.sampled_from([0, -1, 1e-300, 0.0001, 1, 60_000, 2_592_000_000, 2_592_000_001, 1e308])),
            "score": draw(st.lists(st.fixed_dictionaries(
                {"key": st.sampled_from(["v", "w", "d"])},
                optional={
                    "prefer": st.sampled_from(["high", "low", "up"]),
                    "target": st.sampled_from([0, 1e15, 1e16, -1e308, 5e-324]),
                    "weight": st.sampled_from([1, 0, -1, 1e15, 1e300, 5e-324]),
                },
            ), max_size=3)),
        }  # fmt: skip
    return json.dumps(doc).encode()


class Canaries:
    """Numbered canary publications to one subscription, read by a plain TCP subscriber in a thread."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.tag = os.urandom(8).hex()
        self.sent = 0
        self.received: list[int] = []
        status, body = request(broker, "/subscribe", orjson.dumps(
            {"authHash": BOB, "data": [{"key": "canary", "val": self.tag, "op": "eq"}]}
        ))  # fmt: skip
        assert status == 200, body
        self.socket = socket.create_connection(("127.0.0.1", broker.tcp_port))
        self.socket.sendall(orjson.dumps({"authHash": BOB, "subscriptionId": body["subscriptionId"]}) + b"\n")
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.socket.makefile("rb"):
            self.received.append(orjson.loads(line)["n"])

    def send(self) -> None:
        self.sent += 1
        status, body = request(self.broker, "/publish", orjson.dumps({"canary": self.tag, "n": self.sent}), BOB)
        assert status == 200, body

    def all_arrived(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(self.received) < self.sent and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.received == list(range(1, self.sent + 1))
        self.socket.close()


def request(broker: BrokerProcess, path: str, body: bytes, auth: str = ALICE, **headers: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=60)
    try:
        sent = {"Content-Type": "application/json", "X-Auth-Hash": auth, **headers}
        connection.request("POST", path, body, {name: value.encode() for name, value in sent.items()})
        response = connection.getresponse()
        payload = response.read()
    finally:
        connection.close()
    assert response.status < 500 or (response.status == 503 and response.getheader("Retry-After")), payload
    return response.status, orjson.loads(payload)


def test_hostile_clients_generated_at_the_edges(broker):
    """Thousands of generated requests at the edges through the real gateway and pipeline, canaries
    between them: every canary arrives once, in order; nothing answers 5xx but 503; /health is
    truthful throughout (the pipeline runs, nothing accepted had to be quarantined)."""
    tag = os.urandom(8).hex()
    canaries = Canaries(broker)
    statuses: dict[str, set[int]] = {}
    count = 0

    def between() -> None:
        nonlocal count
        count += 1
        if count % 50 == 0:
            canaries.send()
            health = broker.health()
            assert health["pipeline"] == "running" and health["quarantined"] == 0, health

    @settings(max_examples=2000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(publication_bodies(tag))
    def publish(case: tuple[bytes, dict[str, str], str]) -> None:
        body, headers, form = case
        status, _ = request(broker, "/publish", body, **headers)
        statuses.setdefault(f"publish {form}", set()).add(status)
        between()

    @settings(max_examples=1000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(subscription_bodies(tag))
    def subscribe(body: bytes) -> None:
        status, _ = request(broker, "/subscribe", body)
        statuses.setdefault("subscribe", set()).add(status)
        between()

    subscribe()
    publish()
    canaries.send()
    canaries.all_arrived()
    broker.wait_processed(timeout=120)
    health = broker.health()
    assert health["status"] == "ok" and health["quarantined"] == 0, health
    assert all(200 in found for found in statuses.values() if found != {400}), statuses


async def test_kill_9_of_the_pipeline_is_seen_at_once(broker):
    async with canary(broker) as check:
        pid = broker.pipeline_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        async with aiohttp.ClientSession() as http:
            while True:
                async with http.get(f"{broker.url}/ready") as response:
                    if response.status == 503:
                        health = await response.json()
                        break
                assert time.monotonic() - started < 5, "still ready 5 s after the pipeline died"
                await asyncio.sleep(0.1)
        assert health["status"] == "degraded" and health["pipeline"] in ("restarting", "starting")
        async with client(broker) as alice:
            await alice.publish({"acknowledged": "while the pipeline restarts"})  # accepted, delivered later
        await check()  # delivered once the new pipeline runs
        broker.wait_ready()
        assert broker.health()["status"] == "ok"
