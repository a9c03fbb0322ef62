"""Hostile clients: each request that once stopped delivery for everybody, sent exactly as it was,
now gets a clear refusal while a canary publication sent afterwards still reaches its subscriber.
The broker runs as in production: static hashes are secrets the registry declares (`--auth` default),
no anonymous clients."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from contextlib import asynccontextmanager

import aiohttp
import orjson
import pytest

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
        await check()


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
