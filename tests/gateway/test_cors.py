"""Browser pages of other origins: those the operator names may call the REST API (a preflight
answered, the answers, errors included, carrying the CORS headers); any other page's requests get
none of them, so its browser keeps the answers from it."""

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.gateway.conftest import ALICE
from veil.gateway.rest import create_app

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
        answer = await http.post("/publish", data=b'{"n":2}', headers=other)
        assert answer.status == 200 and "Access-Control-Allow-Origin" not in answer.headers
        assert orjson.loads(await answer.read())["id"]
    finally:
        await http.close()
