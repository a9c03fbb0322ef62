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
from collections import Counter
from contextlib import asynccontextmanager
from typing import NamedTuple

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
INT64 = st.integers(-(2**63), 2**63 - 1)
FINITE = st.sampled_from(EDGE_FLOATS) | st.floats(allow_nan=False, allow_infinity=False)
MAX_DEPTH = 32  # the documented nesting limit (`--max-depth`)
VALID_FOR = ["1", "2592000000", " 5 "]  # 1 ms to 30 days, in ASCII digits
INVALID_FOR = ["0", "-5", "2592000001", "99999999999999999999", "\uff12", "1_000"]
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
# (type, value) pairs of the defined and row forms that the SELIS type system converts: the type
# implied by the value, or declared under one of its names with a value of it or spelled as a string
typed_values = st.one_of(
    st.tuples(st.none(), INT64 | FINITE | st.booleans() | st.text(max_size=30)),
    st.tuples(st.sampled_from(["int", "integer", "long", "INT"]), INT64 | INT64.map(str)),
    st.tuples(st.sampled_from(["float", "double"]), FINITE | INT64 | FINITE.map(repr)),
    st.tuples(st.sampled_from(["boolean", "bool"]), st.booleans() | st.sampled_from(["true", "false", "TRUE", " false "])),
    st.tuples(st.sampled_from(["string", "str"]), st.text(max_size=30) | INT64 | FINITE | st.booleans()),
)


class Case(NamedTuple):
    """A generated request and the status it must get: None where the test does not decide it (the
    request only must not fail the broker)."""

    form: str
    body: bytes
    headers: dict[str, str]
    must: int | None


def nested(depth: int, leaf: object) -> object:
    for level in range(depth):
        leaf = {"n": leaf} if level % 2 else [leaf]
    return leaf


def depth(value: object) -> int:
    """Levels of objects and arrays, counted as the documented limit counts them (a scalar: 0)."""
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def integers(value: object) -> list[int]:
    """Every integer in a document, however deep (booleans are not)."""
    if isinstance(value, dict):
        return [n for inner in value.values() for n in integers(inner)]
    if isinstance(value, list):
        return [n for inner in value for n in integers(inner)]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def raw_status(doc: dict) -> int | None:
    """What a raw publication must get: 400 nested beyond the limit, else 200, except that an integer
    beyond 64 bits (which JSON parsers read differently: the gateway's as a float) or a member Veil
    reserves (`veil:`) leaves it undecided here."""
    if depth(doc) > MAX_DEPTH:
        return 400
    if any(not -(2**63) <= n < 2**63 for n in integers(doc)) or any(key.startswith("veil:") for key in doc):
        return None
    return 200


# documents at the edges of JSON, valid or not, each with the status it must get
TEXTS = [
    *((b'{"v": %s}' % spelled.encode(), 200 if spelled == "1e-999" else 400) for spelled in NON_FINITE),
    (b'{"a": "\\ud800"}', 400), (b'{"a": 1,}', 400), (b"\xff\xfe{}", 400), (b'{"a": 1} {"b": 2}', 400),
    (b"[]", 400), (b"null", 400), (b"1e400", 400), (b"{}", 200), (b'{"": 0}', 200),
]  # fmt: skip


@st.composite
def publication_bodies(draw: st.DrawFn, tag: str) -> Case:
    """A raw, defined or row publication at the edges, as bytes (some not even JSON), with the status
    it must get where the way it was made decides it: defined and row forms are made valid (their
    attributes converted by the SELIS type system, under unique non-empty keys) or fuzzed."""
    form = draw(st.sampled_from(["raw", "deep", "defined", "row", "fuzzed defined", "fuzzed row", "text", "dup"]))
    must: int | None = 200
    doc: object
    if form == "raw":
        doc = draw(st.dictionaries(st.text(max_size=12), json_values, max_size=8))
        if draw(st.booleans()):
            doc["fuzz"] = tag
        must = raw_status(doc)
    elif form == "deep":
        doc = {"d": nested(draw(st.integers(0, 70)), draw(json_scalars))}
        must = raw_status(doc)
    elif form in ("defined", "row"):
        entries = []
        for key, (declared, value) in draw(st.dictionaries(st.text(min_size=1, max_size=8), typed_values,
                                                           min_size=1, max_size=6)).items():  # fmt: skip
            entry = {"key": key, draw(st.sampled_from(["val", "value"])): value}
            if declared is not None:
                entry["type"] = declared
            entries.append(entry)
        doc = {"publication": entries} if form == "defined" else entries
    elif form in ("fuzzed defined", "fuzzed row"):
        entries = draw(st.lists(st.fixed_dictionaries(
            {"key": st.text(max_size=8), "val": json_values},
            optional={"type": st.sampled_from(["int", "float", "double", "boolean", "string", "long", "x", 7])},
        ), max_size=6))  # fmt: skip
        doc = {"publication": entries} if form == "fuzzed defined" else entries
        must = None
    if form == "text":  # NaN and infinities spelled as JSON parsers never agreed on, and broken documents
        body, must = draw(st.sampled_from(TEXTS))
    elif form == "dup":
        key = draw(st.text(min_size=1, max_size=6)).replace('"', "").replace("\\", "") or "k"
        body, must = b'{"%s": 1, "%s": 2}' % (key.encode(), key.encode()), 400
    else:
        body = json.dumps(doc).encode()  # the standard library writes integers beyond 64 bits too
    headers = {}
    if draw(st.booleans()):
        headers["X-Valid-For"] = draw(st.sampled_from(VALID_FOR + INVALID_FOR))
        if headers["X-Valid-For"] in INVALID_FOR:
            must = 400  # read before the body
    return Case(form, body, headers, must)


numbers = st.integers(-(2**53), 2**53) | st.floats(-1e300, 1e300, allow_nan=False)


@st.composite
def valid_constraint(draw: st.DrawFn, key: str) -> dict:
    """A constraint the subscription language takes and some value satisfies (the only one on its key)."""
    kind = draw(st.sampled_from(["number", "string", "boolean", "exists", "between", "in"]))
    constraint: dict = {"key": key}
    if kind == "number":
        value = draw(numbers)
        constraint |= {"op": draw(st.sampled_from(["eq", "ne", "gt", "lt", "ge", "le", "=", ">=", "lq"])), "val": value}
        declared = draw(st.sampled_from([None, "int", "long", "float"] if isinstance(value, int) else [None, "double"]))
    elif kind == "string":
        ops = ["eq", "ne", "gt", "lt", "ge", "le", "contains", "ss", "starts_with", "ends_with"]
        constraint |= {"op": draw(st.sampled_from(ops)), "val": draw(st.text(min_size=1, max_size=12))}
        declared = draw(st.sampled_from([None, "string"]))
    elif kind == "boolean":
        constraint |= {"op": draw(st.sampled_from(["eq", "ne", "!="])), "val": draw(st.booleans())}
        declared = draw(st.sampled_from([None, "boolean"]))
    elif kind == "exists":
        constraint |= {"op": "eq", "val": "*"}
        declared = None
    elif kind == "between":
        constraint |= {"op": "between", "val": sorted(draw(st.lists(numbers, min_size=2, max_size=2)))}
        declared = None
    else:
        values = st.lists(numbers, min_size=1, max_size=5) | st.lists(st.text(max_size=8), min_size=1, max_size=5)
        constraint |= {"op": "in", "val": draw(values)}
        declared = None
    if declared is not None:
        constraint["type"] = declared
    return constraint


valid_topk = st.fixed_dictionaries({
    "k": st.integers(1, 10_000),
    "w": st.integers(1, 2_592_000_000) | st.floats(1, 2_592_000_000),
    "score": st.lists(
        st.fixed_dictionaries(
            {"key": st.sampled_from(["v", "w", "d"])},
            optional={"weight": st.floats(5e-324, 1e15) | st.integers(1, 10**15)},
        ).flatmap(lambda term: st.sampled_from([{"prefer": "high"}, {"prefer": "low"}]).map(term.__or__)
                  | st.floats(-1e15, 1e15).map(lambda target: term | {"target": target})),
        min_size=1, max_size=3,
    ),
})  # fmt: skip


@st.composite
def subscription_bodies(draw: st.DrawFn, tag: str) -> Case:
    """A subscription made valid (constraints on keys of their own, a top-k/w within its bounds: it
    must be taken) or fuzzed at the edges (it must only not fail the broker)."""
    if draw(st.booleans()):
        keys = draw(st.lists(st.text(min_size=1, max_size=8).filter(lambda key: key != "fuzz"), unique=True, max_size=5))
        data = [draw(valid_constraint(key)) for key in keys]
        topk = draw(st.none() | valid_topk)
        form, must = "subscribe", 200
    else:
        ops = ["eq", "ne", "gt", "lt", "ge", "le", "lq", "between", "in", "contains", "ss", "starts_with", "ends_with", "op"]
        data = draw(st.lists(st.fixed_dictionaries(
            {"key": st.text(max_size=8) | st.just("v"), "op": st.sampled_from(ops), "val": json_values},
            optional={"type": st.sampled_from(["int", "float", "boolean", "string", "nope"])},
        ), max_size=5))  # fmt: skip
        topk = draw(st.none() | st.fixed_dictionaries({
            "k": st.sampled_from([0, 1, 3, 10_000, 10_001, -1, 2**63, 1.5, "3"]),
            "w": st.sampled_from([0, -1, 1e-300, 0.0001, 1, 60_000, 2_592_000_000, 2_592_000_001, 1e308]),
            "score": st.lists(st.fixed_dictionaries(
                {"key": st.sampled_from(["v", "w", "d"])},
                optional={
                    "prefer": st.sampled_from(["high", "low", "up"]),
                    "target": st.sampled_from([0, 1e15, 1e16, -1e308, 5e-324]),
                    "weight": st.sampled_from([1, 0, -1, 1e15, 1e300, 5e-324]),
                },
            ), max_size=3),
        }))  # fmt: skip
        form, must = "fuzzed subscribe", None
    data.insert(draw(st.integers(0, len(data))), {"key": "fuzz", "val": tag, "op": "eq"})
    doc: dict = {"authHash": ALICE, "data": data}
    if topk is not None:
        doc["topk"] = topk
    return Case(form, json.dumps(doc).encode(), {}, must)


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
    between them: every request whose status the way it was made decides gets that status (a valid
    publication or subscription 200, whatever else it carries); nothing answers 5xx but 503; every
    canary arrives once, in order; /health is truthful throughout (the pipeline runs, nothing
    accepted had to be quarantined)."""
    tag = os.urandom(8).hex()
    canaries = Canaries(broker)
    decided: Counter[tuple[str, int]] = Counter()
    count = 0

    def send(path: str, case: Case) -> None:
        nonlocal count
        status, reply = request(broker, path, case.body, **case.headers)
        deadline = time.monotonic() + 60
        while status == 503 and time.monotonic() < deadline:  # shedding load says nothing of the request
            time.sleep(1)
            status, reply = request(broker, path, case.body, **case.headers)
        assert case.must is None or status == case.must, f"{case.form}: {status} {reply}, not {case.must}, for {case}"
        if case.must is not None:
            decided[case.form, case.must] += 1
        count += 1
        if count % 50 == 0:
            canaries.send()
            health = broker.health()
            assert health["pipeline"] == "running" and health["quarantined"] == 0, health

    @settings(max_examples=2000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(publication_bodies(tag))
    def publish(case: Case) -> None:
        send("/publish", case)

    @settings(max_examples=1000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(subscription_bodies(tag))
    def subscribe(case: Case) -> None:
        send("/subscribe", case)

    subscribe()
    publish()
    canaries.send()
    canaries.all_arrived()
    broker.wait_processed(timeout=120)
    health = broker.health()
    assert health["status"] == "ok" and health["quarantined"] == 0, health
    for status, forms in ((200, {"raw", "deep", "defined", "row", "text", "subscribe"}),
                          (400, {"raw", "deep", "defined", "row", "text", "dup"})):  # fmt: skip
        assert {form for form, must in decided if must == status} >= forms, decided  # each was sent


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
