"""Webhook subscriptions, in-process: a real HTTPS endpoint (a certificate of a CA the gateway is told
to trust) that fails, times out and answers slowly; deliveries POSTed in order, once each, signed;
an unreachable endpoint's deliveries dead-lettered; endpoints on loopback or private addresses
refused unless the operator allows them, both when the subscription is made and when a request
connects (a name may resolve elsewhere by then)."""

import asyncio
import contextlib
import json
import os
import ssl
import time
from collections.abc import AsyncIterator

import numpy as np
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tests.gateway.conftest import ALICE, BOB, REGISTRY
from veil.config import Config
from veil.gateway.rest import create_app
from veil.gateway.server import Broker
from veil.gateway.tcp import start_tcp
from veil.harness.broker import free_ports
from veil.security import certs
from veil.security.webhook_signature import HEADER, verify
from veil.store import Publication, Round, Webhook

pytestmark = pytest.mark.asyncio(loop_scope="module")
TIMEOUT = 0.5  # --webhook-timeout of the gateways here


class Endpoint:
    """An HTTPS endpoint that answers each request as its script says (then 200): "fail" (500),
    "busy" (503 with Retry-After: 0), "timeout" (no answer within the gateway's timeout), "slow" (a
    200 just within it). It keeps what it took (2xx) and the signatures it was shown."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.taken: list[tuple[dict, str, bytes]] = []  # (document, signature header, raw body)
        self.requests = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests += 1
        behaviour = self.script.pop(0) if self.script else "ok"
        if behaviour == "fail":
            return web.Response(status=500)
        if behaviour == "busy":
            return web.Response(status=503, headers={"Retry-After": "0"})
        if behaviour == "timeout":
            await asyncio.sleep(TIMEOUT * 2)
            return web.Response(status=504)  # (the gateway gave up long ago: nothing was taken)
        if behaviour == "slow":
            await asyncio.sleep(TIMEOUT / 3)
        self.taken.append((orjson.loads(body), request.headers.get(HEADER, ""), body))
        return web.Response(status=204)

    def seqs(self) -> list[int]:
        return [delivery["seq"] for doc, _, _ in self.taken for delivery in doc["deliveries"]]


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("webhook-tls"))
    certs.create(directory, ["localhost", "127.0.0.1"], [])
    return directory


@contextlib.asynccontextmanager
async def endpoint(tls: str, script: list[str]) -> AsyncIterator[tuple[Endpoint, int]]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(os.path.join(tls, "server.pem"), os.path.join(tls, "server-key.pem"))
    served = Endpoint(script)
    app = web.Application()
    app.router.add_post("/hook/{tail:.*}", served.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # (a started site has a server)
    try:
        yield served, port
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def running_gateway(tmp_path, **options) -> AsyncIterator[tuple[Broker, TestClient]]:
    """A gateway (no pipeline) with its background loops, webhook deliveries among them."""
    registry = os.path.join(tmp_path, "registry.json")
    with open(registry, "w") as handle:
        json.dump(REGISTRY, handle)
    config = Config(
        data_dir=str(tmp_path), registry=registry, auth="hash", anonymous=False, webhook_timeout=TIMEOUT,
        webhook_backoff=0.05, **options,
    )  # fmt: skip
    broker = Broker(config, run_pipeline=False)
    await broker.prepare()
    broker.background.start()
    http = TestClient(TestServer(create_app(broker.gateway)))
    await http.start_server()
    try:
        yield broker, http
    finally:
        await http.close()
        await broker.gateway.hub.stop()
        await broker.background.stop()
        broker.gateway.threads.close()
        broker.gateway.parsing.shutdown(wait=False)


async def subscribe(http: TestClient, doc: dict, auth: str = ALICE) -> tuple[int, dict]:
    response = await http.post("/subscribe", data=orjson.dumps({"authHash": auth, "data": [], **doc}))
    return response.status, await response.json()


def matched(broker: Broker, sub_ids: list[str], count: int) -> list[int]:
    """`count` publications, logged and matched to these subscriptions as a round of the pipeline would."""
    store = broker.gateway.threads.store
    pubs = store.append_publications([Publication(b'{"n":%d}' % n, "bob") for n in range(count)])
    numbers = [store.subscription_number(sub_id) for sub_id in sub_ids]
    store.record_round(Round(np.repeat(numbers, count), np.tile(pubs, len(numbers)), max(pubs)))
    return pubs


async def until(check, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.05)


async def test_deliveries_arrive_once_in_order_signed_through_failures_timeouts_and_slow_answers(tmp_path, tls):
    script = ["fail", "timeout", "slow", "ok", "busy", "fail", "slow", "timeout", "ok", "fail"] * 3
    async with (
        endpoint(tls, script) as (one_each, port_one),
        endpoint(tls, list(reversed(script))) as (batched, port_batched),
        running_gateway(tmp_path, webhook_allow=("127.0.0.0/8", "::1/128"), webhook_ca=os.path.join(tls, "ca.pem")) as (
            broker, http,
        ),
    ):  # fmt: skip
        status, one = await subscribe(
            http, {"subscriptionId": "one", "webhook": {"url": f"https://localhost:{port_one}/hook/a?k=1"}}
        )
        assert status == 200 and one["webhookSecret"].startswith("whsec_"), one
        status, many = await subscribe(
            http, {"subscriptionId": "many", "webhook": {"url": f"https://127.0.0.1:{port_batched}/hook/b", "batch": 7}}
        )
        assert status == 200 and many["webhookSecret"] != one["webhookSecret"]
        pubs = matched(broker, ["one", "many"], 40)
        await until(lambda: len(one_each.seqs()) >= 40 and len(batched.seqs()) >= 40, 60)
        await asyncio.sleep(0.5)  # (and nothing more comes)
        assert one_each.seqs() == pubs and batched.seqs() == pubs  # once each, in order
        assert [len(doc["deliveries"]) for doc, _, _ in one_each.taken] == [1] * 40
        assert max(len(doc["deliveries"]) for doc, _, _ in batched.taken) <= 7
        assert one_each.requests > 40 and batched.requests > len(batched.taken)  # retried
        for served, secret, sub_id in (
            (one_each, one["webhookSecret"], "one"),
            (batched, many["webhookSecret"], "many"),
        ):
            for doc, header, raw in served.taken:
                assert abs(verify(secret, header, raw) - time.time()) < 60 and doc["subscriptionId"] == sub_id
            assert doc["deliveries"][-1]["publication"] == {"n": 39} and doc["deliveries"][-1]["publisher"] == "bob"
        with pytest.raises(ValueError):  # another subscription's secret verifies nothing
            verify(many["webhookSecret"], one_each.taken[0][1], one_each.taken[0][2])
        store = broker.gateway.threads.store
        await until(lambda: store.cursor("one") == pubs[-1] and store.cursor("many") == pubs[-1], 10)


async def test_an_unreachable_endpoints_deliveries_are_dead_lettered_in_order_and_can_be_replayed(tmp_path, tls):
    (port,) = free_ports(1)  # nothing listens there
    async with running_gateway(
        tmp_path, webhook_allow=("127.0.0.1/32",), webhook_ca=os.path.join(tls, "ca.pem"), webhook_attempts=3
    ) as (broker, http):
        status, _ = await subscribe(http, {"subscriptionId": "gone", "webhook": {"url": f"https://127.0.0.1:{port}/"}})
        assert status == 200
        pubs = matched(broker, ["gone"], 5)
        store = broker.gateway.threads.store
        number = store.subscription_number("gone")
        await until(lambda: len(store.dead_letters(number)[0]) == 5)
        letters, _ = store.dead_letters(number)
        assert [(letter.pub, letter.reason, letter.body) for letter in letters] == [
            (pub, "attempts", b'{"n":%d}' % n) for n, pub in enumerate(pubs)
        ]
        response = await http.get("/subscriptions/gone/dead-letters", headers={"X-Auth-Hash": ALICE})
        assert [d["reason"] for d in (await response.json())["deadLetters"]] == ["attempts"] * 5
        await until(lambda: store.cursor("gone") == pubs[-1])  # consumed: never sent again as well
        assert store.totals().dead_lettered[-1] == 5


async def test_endpoints_on_loopback_or_private_addresses_are_refused_unless_allowed(tmp_path, tls):
    async with (
        endpoint(tls, []) as (served, port),
        running_gateway(tmp_path, webhook_ca=os.path.join(tls, "ca.pem"), webhook_attempts=2) as (broker, http),
    ):
        for url, problem in (
            (f"https://127.0.0.1:{port}/hook/", "--webhook-allow"),
            (f"https://localhost:{port}/hook/", "--webhook-allow"),
            ("https://10.1.2.3/", "--webhook-allow"),
            ("https://169.254.169.254/latest/meta-data/", "--webhook-allow"),
            ("https://[::ffff:127.0.0.1]/", "--webhook-allow"),
            ("https://[64:ff9b::a00:1]/", "--webhook-allow"),
            (f"http://127.0.0.1:{port}/hook/", "https only"),
            ("https://user:pw@example.com/", "credentials"),
            ("https:///nohost", "host"),
            ("https://no-such-host.invalid/", "does not resolve"),
        ):
            status, reply = await subscribe(http, {"webhook": {"url": url}})
            assert (status, reply["field"]) == (400, "webhook.url") and problem in reply["error"], (url, reply)
        status, reply = await subscribe(http, {"webhook": {"url": "https://example.com/", "batch": 0}})
        assert (status, reply["field"]) == (400, "webhook.batch")
        status, reply = await subscribe(http, {"webhook": "https://example.com/"})
        assert (status, reply["field"]) == (400, "webhook")
        # a webhook the REST check never saw (a name that resolved elsewhere when it was made): the
        # request is refused as it connects, and the endpoint never hears of it
        store = broker.gateway.threads.store
        store.put_subscription("rebound", "alice", b"[]", webhook=Webhook(f"https://localhost:{port}/hook/", "whsec_x"))
        broker.gateway.webhooks.wake.set()
        matched(broker, ["rebound"], 2)
        await until(lambda: len(store.dead_letters(store.subscription_number("rebound"))[0]) == 2)
        assert served.requests == 0


async def test_a_webhook_subscription_is_never_delivered_on_a_connection_and_follows_its_replacement(tmp_path, tls):
    async with (
        endpoint(tls, []) as (first, first_port),
        endpoint(tls, []) as (second, second_port),
        running_gateway(tmp_path, webhook_allow=("127.0.0.0/8", "::1/128"), webhook_ca=os.path.join(tls, "ca.pem")) as (
            broker, http,
        ),
    ):  # fmt: skip
        hook = {"url": f"https://localhost:{first_port}/hook/"}
        assert (await subscribe(http, {"subscriptionId": "w", "webhook": hook}))[0] == 200
        server = await start_tcp(broker.gateway, "127.0.0.1", 0, None)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(orjson.dumps({"subscriptionId": "w", "authHash": ALICE}) + b"\n")
        refused = orjson.loads(await asyncio.wait_for(reader.readline(), 5))
        assert (refused["status"], refused["field"]) == (409, "subscriptionId") and "webhook" in refused["error"]
        writer.close()
        server.close()
        assert (await subscribe(http, {"subscriptionId": "w", "webhook": hook}, auth=BOB))[0] == 403  # alice's id
        early = matched(broker, ["w"], 3)
        await until(lambda: first.seqs() == early)
        hook = {"url": f"https://127.0.0.1:{second_port}/hook/"}
        assert (await subscribe(http, {"subscriptionId": "w", "webhook": hook}))[0] == 200
        later = matched(broker, ["w"], 3)
        await until(lambda: second.seqs() == later)
        assert first.seqs() == early
        # another gateway holds it now (this one's claim lapsed while it could not renew): it stops here
        store = broker.gateway.threads.store
        store.take_over_gateway("elsewhere", "x", 0)
        assert store.claim_subscriptions(["w"], [store.subscription_number("w")], "elsewhere", time.time(), 2e9) is None
        await until(lambda: not broker.gateway.webhooks.running, 10)
        matched(broker, ["w"], 2)
        await asyncio.sleep(1)
        assert second.seqs() == later
        # and a gateway that cannot renew its claims (cut off from the store) POSTs nothing meanwhile
        claims = broker.gateway.claims
        stay_alive = next(task for task in broker.background._tasks if "stay_alive" in repr(task.get_coro()))
        stay_alive.cancel()
        claims.renewed -= 100
        store.leave("elsewhere", "x")  # (its claims go: this gateway takes it up again)
        await asyncio.sleep(3)
        assert second.seqs() == later
        claims.renewed = time.monotonic()
        await until(lambda: len(second.seqs()) == 5, 10)
        response = await http.post("/unsubscribe", data=orjson.dumps({"authHash": ALICE, "subscriptionId": "w"}))
        assert response.status == 200
        await until(lambda: not broker.gateway.webhooks.running)
