"""Browser pages of other origins: those the operator names may call the REST API (a preflight
answered, the answers, errors included, carrying the CORS headers) and open delivery connections;
any other page's reads get none of them, so its browser keeps the answers from it, and its writes
and WebSocket upgrades (which browsers send without asking, with a client certificate if they hold
one) are refused before they are served. Clients that are not browsers send no Origin."""

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.gateway.conftest import ALICE
from veil.gateway.rest import create_app
from veil.gateway.websocket import create_ws_app

pytestmark = pytest.mark.asyncio(loop_scope="module")
PAGE = "http://127.0.0.1:8123"


async def test_only_the_named_origins_pages_may_read_the_answers(gateway):
    gateway.config.cors_origin = (PAGE,)
    http = TestClient(TestServer(create_app(gateway)))
    await http.start_server()
    try:
        asked = {"Origin": PAGE, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type,x-auth-hash,idempotency-key"}  # fmt: skip
        preflight = await http.options("/publish", headers=asked)
        assert preflight.status == 204 and preflight.headers["Access-Control-Allow-Origin"] == PAGE
        assert "X-Auth-Hash" in preflight.headers["Access-Control-Allow-Headers"]
        answer = await http.post("/publish", data=b'{"n":1}', headers={"Origin": PAGE, "X-Auth-Hash": ALICE})
        assert answer.status == 200 and answer.headers["Access-Control-Allow-Origin"] == PAGE
        refused = await http.post("/subscribe", data=b'{"data": 1}', headers={"Origin": PAGE, "X-Auth-Hash": ALICE})
        assert refused.status == 400 and refused.headers["Access-Control-Allow-Origin"] == PAGE
        assert "Retry-After" in refused.headers["Access-Control-Expose-Headers"]
        other = {"Origin": "https://evil.example", "X-Auth-Hash": ALICE}
        preflight = await http.options("/publish", headers={**asked, "Origin": "https://evil.example"})
        assert preflight.status == 403 and "Access-Control-Allow-Origin" not in preflight.headers
        head = gateway.threads.store.head_offset()
        for path, body in (("/publish", b'{"n":2}'), ("/subscribe", b'{"data": []}'), ("/unsubscribe", b"{}")):
            answer = await http.post(path, data=body, headers={**other, "Content-Type": "text/plain"})
            assert answer.status == 403 and orjson.loads(await answer.read())["field"] == "Origin"
        assert gateway.threads.store.head_offset() == head  # nothing was done
        read = await http.get("/health", headers=other)
        assert read.status == 200 and "Access-Control-Allow-Origin" not in read.headers
        own = await http.post("/publish", data=b'{"n":3}', headers={"Origin": f"http://{http.host}:{gateway.config.port}",
                                                                    "X-Auth-Hash": ALICE})  # fmt: skip
        assert own.status == 200  # the gateway's own pages
        assert (await http.post("/publish", data=b'{"n":4}', headers={"X-Auth-Hash": ALICE})).status == 200
    finally:
        await http.close()
    ws = TestClient(TestServer(create_ws_app(gateway)))
    await ws.start_server()
    try:
        upgrade = await ws.get("/", headers={"Origin": "https://evil.example", "Connection": "Upgrade",
                                             "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                                             "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})  # fmt: skip
        assert upgrade.status == 403
        allowed = await ws.ws_connect("/", headers={"Origin": PAGE})
        await allowed.close()
    finally:
        await ws.close()
