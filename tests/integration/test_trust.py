"""Trust end to end (SPEC §3, §6, §7) over real TLS with bearer tokens: the seeds' border-agency and
truck-bcd examples, cropping, signed publications, the admin API, and the ways a client may try to
get in or get more than it may — each refused with a clear error while the broker keeps serving."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import aiohttp
import jwt
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from tests.integration.helpers import LineConnection, nothing_more, run_id, take
from veil.client import TamperedPublication, VeilClient, VeilError
from veil.harness import BrokerProcess
from veil.security import signatures
from veil.security.tls import client_context

pytestmark = pytest.mark.slow
ISSUER = "https://idp.example"
AUDIENCE = "veil-test"
SALE = {"key": "_type", "val": "sale_statistics", "type": "string", "op": "eq"}


class IdentityProvider:
    def __init__(self, kid: str = "idp-1") -> None:
        self.kid = kid
        self.key = ec.generate_private_key(ec.SECP256R1())

    def jwks(self) -> dict:
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**jwk, "kid": self.kid, "alg": "ES256", "use": "sig"}]}

    def token(
        self, subject: str, ttl: float = 600, audience: str = AUDIENCE, issuer: str = ISSUER, **extra: object
    ) -> str:
        claims = {"sub": subject, "exp": int(time.time() + ttl), "aud": audience, "iss": issuer, **extra}
        return jwt.encode(claims, self.key, algorithm="ES256", headers={"kid": self.kid})


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("trust"))
    subprocess.run([sys.executable, "-m", "veil.cli", "certs", "--dir", directory], check=True, capture_output=True)
    idp = IdentityProvider()
    with open(f"{directory}/jwks.json", "w") as handle:
        json.dump(idp.jwks(), handle)
    fleet_key, fleet_public = signatures.new_key()
    registry = {
        "admins": ["root"],
        "users": {"client-a": {"groups": ["A"]}, "client-b": {}, "agency-gb": {"groups": ["auditors"]}},
        "rules": {
            "agency-fr": [[SALE, {"key": "country", "val": "FR", "type": "string", "op": "eq"}]],
            "agency-gb": [[SALE, {"key": "country", "val": "GB", "type": "string", "op": "eq"}]],
            "client-a": [[]],
            "client-b": [[]],
            "inspector": [[]],
        },
        "policies": {"fleet": [{"data": [{"key": "id", "val": "truck-bcd", "op": "eq"}], "group": "A"}]},
        "cropping": {"company": [{"data": [SALE], "fields": ["amount"], "groups": ["auditors"]}]},
        "keys": {"fleet": {"k1": fleet_public}},
        "scopes": {"customs": {"users": ["agency-fr"]}},
    }
    with open(f"{directory}/registry.yaml", "w") as handle:
        json.dump(registry, handle)  # JSON is YAML
    broker = BrokerProcess(
        f"{directory}/broker",
        "--certificate", f"{directory}/server.pem", "--private-key", f"{directory}/server-key.pem",
        "--client-ca", f"{directory}/ca.pem", "--auth", "certificate,token", "--anonymous", "false",
        "--jwks", f"{directory}/jwks.json", "--token-issuer", ISSUER, "--token-audience", AUDIENCE,
        "--registry", f"{directory}/registry.yaml",
        ca_file=f"{directory}/ca.pem",
    ).start()  # fmt: skip
    yield broker, directory, idp, fleet_key, fleet_public
    broker.close()


def client(setting, subject: str | None, claims: dict | None = None, **kw) -> VeilClient:
    broker, directory, idp, *_ = setting
    token = idp.token(subject, **(claims or {})) if subject else None
    return VeilClient(
        broker.url, token=token, ca_file=f"{directory}/ca.pem", tcp_port=broker.tcp_port, ws_port=broker.ws_port, **kw
    )


async def test_border_agencies_see_only_their_country_and_auditors_get_cropped_copies(setting):
    rid = run_id()
    want = [SALE, {"key": "run", "val": rid, "op": "eq"}]
    async with client(setting, "agency-fr") as fr, client(setting, "agency-gb") as gb:
        fr_sub = (await fr.subscribe(want))["subscriptionId"]
        gb_sub = (await gb.subscribe(want))["subscriptionId"]
        async with fr.deliveries(fr_sub) as fr_stream, gb.deliveries(gb_sub) as gb_stream:
            await fr_stream.connected.wait()
            await gb_stream.connected.wait()
            async with client(setting, "company") as company:
                for country, amount in (("FR", "1000"), ("GB", "2000"), ("FR", "3000")):
                    await company.publish(
                        {"_type": "sale_statistics", "country": country, "amount": amount, "run": rid}
                    )
            got_fr = await take(fr_stream, 2)
            got_gb = await take(gb_stream, 1)
            await nothing_more(fr_stream)
            await nothing_more(gb_stream)
    assert [d.publication["amount"] for d in got_fr] == ["1000", "3000"]
    assert {d.publication["country"] for d in got_fr} == {"FR"} and not any(d.cropped for d in got_fr)
    assert got_gb[0].publication == {"_type": "sale_statistics", "country": "GB", "run": rid}  # amount cropped
    assert got_gb[0].cropped and got_fr[0].publisher == "company"
    assert got_gb[0].publisher == "company"  # a cropped copy drops the signature, not its origin


async def test_truck_bcd_reaches_only_group_a(setting):
    rid = run_id()
    want = [{"key": "lat", "val": "*", "op": "eq"}, {"key": "run", "val": rid, "op": "eq"}]
    async with client(setting, "client-a") as a, client(setting, "client-b") as b:
        a_sub = (await a.subscribe(want))["subscriptionId"]
        b_sub = (await b.subscribe(want))["subscriptionId"]
        async with a.deliveries(a_sub) as a_stream, b.deliveries(b_sub, transport="ws") as b_stream:
            await a_stream.connected.wait()
            await b_stream.connected.wait()
            async with client(setting, "fleet") as fleet:
                await fleet.publish({"id": "truck-bcd", "lat": 51.05, "lon": 13.74, "run": rid})
                await fleet.publish({"id": "truck-abc", "lat": 52.52, "lon": 13.40, "run": rid})
            got_a = await take(a_stream, 2)
            got_b = await take(b_stream, 1)
            await nothing_more(b_stream)
    assert [d.publication["id"] for d in got_a] == ["truck-bcd", "truck-abc"]
    assert got_b[0].publication["id"] == "truck-abc"


async def test_signed_publications_verify_end_to_end_and_tampered_ones_are_refused(setting):
    *_, fleet_key, fleet_public = setting
    rid = run_id()
    want = [{"key": "run", "val": rid, "op": "eq"}]
    trusted = {"fleet": {"k1": fleet_public}}
    async with client(setting, "client-a", trusted_keys=trusted) as a:
        sub = (await a.subscribe(want))["subscriptionId"]
        async with a.deliveries(sub) as stream:
            await stream.connected.wait()
            async with client(setting, "fleet") as fleet:
                await fleet.publish({"id": "truck-abc", "run": rid, "n": 1}, signing_key=("k1", fleet_key))
                body = orjson.dumps({"id": "truck-abc", "run": rid, "n": 2})
                forged = signatures.sign(fleet_key, body.replace(b'"n":2', b'"n":3'))
                with pytest.raises(VeilError) as refused:
                    await fleet.request("/publish", body, extra={"X-Key-Id": "k1", "X-Signature": forged})
                assert (refused.value.status, refused.value.field) == (400, "X-Signature")
                with pytest.raises(VeilError) as unknown:
                    await fleet.publish({"run": rid}, signing_key=("k9", fleet_key))
                assert (unknown.value.status, unknown.value.field) == (403, "X-Key-Id")
                await fleet.publish({"id": "truck-abc", "run": rid, "n": 4}, signing_key=("k1", fleet_key))
            first, second = await take(stream, 2)
            await nothing_more(stream)
    assert first.verified and first.publication["n"] == 1 and second.publication["n"] == 4
    # a subscriber holding another key for the publisher refuses what it cannot verify
    async with client(setting, "client-b", trusted_keys={"fleet": {"k1": signatures.new_key()[1]}}) as wary:
        sub = (await wary.subscribe(want))["subscriptionId"]
        async with wary.deliveries(sub) as stream:
            await stream.connected.wait()
            async with client(setting, "fleet") as fleet:
                await fleet.publish({"id": "truck-abc", "run": rid, "n": 5}, signing_key=("k1", fleet_key))
            with pytest.raises(TamperedPublication):
                await take(stream, 1)


async def test_tokens_that_are_expired_forged_or_for_someone_else_are_refused(setting):
    broker, directory, idp, *_ = setting
    impostor = IdentityProvider(kid=idp.kid)  # same key id, another key
    cases = [
        (idp.token("agency-fr", ttl=-120), "expired"),
        (impostor.token("agency-fr"), "signature"),
        (idp.token("agency-fr", audience="another-broker"), "audience"),
        (idp.token("agency-fr", issuer="https://evil.example"), "issued by"),
        ("not.a.token", "invalid"),
    ]
    context = client_context(f"{directory}/ca.pem")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http:
        for token, reason in cases:
            async with http.post(
                f"{broker.url}/subscribe",
                data=orjson.dumps({"data": []}),
                headers={"Authorization": f"Bearer {token}"},
            ) as response:
                error = await response.json()
                assert response.status == 401 and error["field"] == "token" and reason in error["error"], error
        async with http.post(f"{broker.url}/publish", data=b'{"a":1}') as response:
            assert response.status == 401 and (await response.json())["field"] == "authHash"
        async with http.post(f"{broker.url}/subscribe", data=b'{"authHash":"agency-fr","data":[]}') as response:
            assert response.status == 401  # static hashes are not accepted by this broker
    conn = await LineConnection.open(
        broker.tcp_port, {"subscriptionId": "x", "token": impostor.token("client-a")}, ssl=context
    )
    assert (await conn.line())["field"] == "token"
    assert broker.health()["status"] == "ok"


async def test_nobody_takes_over_another_clients_subscription(setting):
    broker, directory, idp, *_ = setting
    async with client(setting, "client-a") as a:
        sub = (await a.subscribe([{"key": "nothing", "val": 1, "op": "eq"}]))["subscriptionId"]
    context = client_context(f"{directory}/ca.pem")
    for handshake, refused in (
        ({"subscriptionId": sub, "token": idp.token("client-b")}, (404, "subscriptionId")),  # as an unknown id
        ({"subscriptionId": sub, "token": idp.token("client-b"), "authHash": "client-a"}, (403, "authHash")),
    ):
        conn = await LineConnection.open(broker.tcp_port, handshake, ssl=context)
        error = await conn.line()
        assert (error["status"], error["field"]) == refused, error
    async with client(setting, "client-b") as b:
        with pytest.raises(VeilError) as stolen:
            await b.unsubscribe(sub)
        assert stolen.value.status == 404
        with pytest.raises(VeilError) as replaced:
            await b.subscribe([], sub)
        assert replaced.value.status == 403


async def test_admin_api_changes_apply_to_later_publications(setting):
    rid = run_id()
    want = [{"key": "run", "val": rid, "op": "eq"}]
    async with client(setting, "client-b") as b, client(setting, "root") as root:
        with pytest.raises(VeilError) as denied:
            await b.registry()
        assert denied.value.status == 403
        with pytest.raises(VeilError) as invalid:
            await root.registry({"rules": {"x": [[{"key": "k", "op": "like", "val": 1}]]}})
        assert (invalid.value.status, invalid.value.field) == (400, "rules.x[0][0].op")
        sub = (await b.subscribe(want))["subscriptionId"]
        async with b.deliveries(sub) as stream:
            await stream.connected.wait()
            async with client(setting, "company") as company:
                await company.publish({"run": rid, "n": 1})
                assert (await take(stream, 1))[0].publication["n"] == 1
                document = await root.registry()
                document["rules"]["client-b"] = [[{"key": "n", "val": 2, "op": "ne"}]]
                assert (await root.registry(document))["rules"]["client-b"] == document["rules"]["client-b"]
                for n in (2, 3):
                    await company.publish({"run": rid, "n": n})
            assert (await take(stream, 1))[0].publication["n"] == 3
            await nothing_more(stream)


async def test_a_token_claim_admits_into_a_scope_and_bounds_what_may_be_asked(setting):
    """Seed 003's attribute certificates: the identity provider states the scopes and the filters a
    client may subscribe with; the scope's publications reach it, and a filter beyond what it was
    allowed is refused before it exists."""
    rid = run_id()
    allowed = [{"key": "country", "val": "FR", "op": "eq"}]
    claims = {"veil": {"scopes": ["customs"], "subscribe": [allowed]}}
    want = [*allowed, {"key": "run", "val": rid, "op": "eq"}]
    async with client(setting, "inspector", claims) as inspector, client(setting, "agency-fr") as member:
        reply = await inspector.subscribe(want, scope="customs")
        with pytest.raises(VeilError) as refused:
            await inspector.subscribe([{"key": "run", "val": rid, "op": "eq"}], scope="customs")
        assert (refused.value.status, refused.value.field) == (403, "data")
        async with client(setting, "outsider") as outsider:
            with pytest.raises(VeilError) as refused:
                await outsider.subscribe(want, scope="customs")
            assert (refused.value.status, refused.value.field) == (403, "scope")
        async with inspector.deliveries(reply["subscriptionId"]) as stream:
            await stream.connected.wait()
            await member.publish({"country": "FR", "run": rid, "veil:scope": "customs"})
            await member.publish({"country": "FR", "run": rid, "note": "in the world"})
            [delivery] = await take(stream, 1)
            await nothing_more(stream)
    assert delivery.publication["veil:scope"] == "customs"
