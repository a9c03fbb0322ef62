"""Credentials over their lifetime, against real gateways: what a token's claim admitted is checked
again at every delivery handshake, a delivery connection ends when its token expires, a revoked
client certificate is refused once the revocation list names it and the connections it opened end,
and a --dev broker listens on loopback only whatever --bind says. The gateways run without a
pipeline: nothing here needs a match."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time

import jwt
import pytest

from tests.integration.helpers import LineConnection, run_id, serving
from tests.integration.test_trust import AUDIENCE, ISSUER, IdentityProvider
from veil.client import VeilClient, VeilError
from veil.harness import BrokerProcess
from veil.security import certs
from veil.security.tls import client_context

pytestmark = pytest.mark.slow
CLAIM = {"veil": {"scopes": ["customs"]}}


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("credentials"))
    certs.create(directory, ["localhost", "127.0.0.1"], ["alice", "mallory"])
    certs.revoke(directory, [])
    idp = IdentityProvider()
    with open(f"{directory}/jwks.json", "w") as handle:
        json.dump(idp.jwks(), handle)
    with open(f"{directory}/registry.json", "w") as handle:
        json.dump({"rules": {"*": [[]]}, "scopes": {"customs": {"users": []}}}, handle)
    return directory, idp


def tls_flags(directory: str) -> list[str]:
    return [
        "--certificate", f"{directory}/server.pem", "--private-key", f"{directory}/server-key.pem",
        "--client-ca", f"{directory}/ca.pem", "--anonymous", "false",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def broker(material, tmp_path_factory):
    directory, _ = material
    process = BrokerProcess(
        str(tmp_path_factory.mktemp("token-gateway")), "--role", "gateway", *tls_flags(directory),
        "--auth", "certificate,token", "--jwks", f"{directory}/jwks.json", "--token-issuer", ISSUER,
        "--token-audience", AUDIENCE, "--registry", f"{directory}/registry.json",
        ca_file=f"{directory}/ca.pem",
    ).start(wait_ready=False)  # fmt: skip
    yield serving(process)
    process.close()


def client(broker: BrokerProcess, directory: str, token: str | None = None, name: str | None = None) -> VeilClient:
    return VeilClient(
        broker.url, token=token, ca_file=f"{directory}/ca.pem", tcp_port=broker.tcp_port, ws_port=broker.ws_port,
        cert_file=f"{directory}/client-{name}.pem" if name else None,
        key_file=f"{directory}/client-{name}-key.pem" if name else None,
    )  # fmt: skip


async def handshake(broker: BrokerProcess, directory: str, doc: dict, name: str | None = None) -> LineConnection:
    context = client_context(
        f"{directory}/ca.pem",
        f"{directory}/client-{name}.pem" if name else None,
        f"{directory}/client-{name}-key.pem" if name else None,
    )
    return await LineConnection.open(broker.tcp_port, doc, ssl=context)


async def test_a_subscription_a_claim_admitted_is_refused_to_a_token_without_the_claim(broker, material):
    directory, idp = material
    rid = run_id()
    with_claim = idp.token("inspector", **CLAIM)
    async with client(broker, directory, with_claim) as inspector:
        reply = await inspector.subscribe([{"key": "run", "val": rid, "op": "eq"}], scope="customs")
    sub_id = reply["subscriptionId"]
    without = await handshake(broker, directory, {"subscriptionId": sub_id, "token": idp.token("inspector")})
    try:
        refused = await without.line(timeout=10)
        assert await without.line(timeout=5) is None  # and closed
    finally:
        without.close()
    assert refused is not None and (refused["status"], refused["field"]) == (403, "subscriptionId")
    assert "no longer admit" in refused["error"] and "customs" in refused["error"]
    again = await handshake(broker, directory, {"subscriptionId": sub_id, "token": with_claim})
    try:
        assert await again.silent(1.0)  # the claim still there: admitted, waiting for deliveries
    finally:
        again.close()


async def test_a_delivery_connection_ends_with_an_error_line_when_its_token_expires(broker, material):
    directory, idp = material
    async with client(broker, directory, idp.token("courier")) as courier:
        reply = await courier.subscribe([{"key": "run", "val": run_id(), "op": "eq"}])
    short = idp.token("courier", ttl=3)
    expires = jwt.decode(short, options={"verify_signature": False})["exp"]
    connection = await handshake(broker, directory, {"subscriptionId": reply["subscriptionId"], "token": short})
    try:
        ended = await connection.line(timeout=15)
        at = time.time()
        assert await connection.line(timeout=5) is None
    finally:
        connection.close()
    assert ended is not None and (ended["status"], ended["field"]) == (401, "token") and "expired" in ended["error"]
    assert expires - 0.5 <= at <= expires + 3


async def test_a_revoked_certificate_is_refused_once_the_revocation_list_names_it(material, tmp_path):
    directory, _ = material
    certs.revoke(directory, [])
    process = BrokerProcess(
        str(tmp_path), "--role", "gateway", *tls_flags(directory), "--crl", f"{directory}/crl.pem",
        "--auth", "certificate", ca_file=f"{directory}/ca.pem",
    ).start(wait_ready=False)  # fmt: skip
    try:
        serving(process)
        mallory_client, alice_client = (
            client(process, directory, name="mallory"),
            client(process, directory, name="alice"),
        )
        async with mallory_client as mallory, alice_client as alice:
            reply = await mallory.subscribe([{"key": "run", "val": run_id(), "op": "eq"}])
            assert await mallory.publish({"before": "revocation"})
            opened = await handshake(process, directory, {"subscriptionId": reply["subscriptionId"]}, "mallory")
            assert await opened.silent(1.0)  # admitted
            certs.revoke(directory, ["mallory"])
            try:  # the connection opened before the revocation ends with it
                ended = await opened.line(timeout=15)
                assert await opened.line(timeout=5) is None
            finally:
                opened.close()
            assert ended is not None and (ended["status"], ended["field"]) == (401, "certificate"), ended
            with pytest.raises(VeilError) as refused:
                await mallory.publish({"after": "revocation"})
            assert (refused.value.status, refused.value.field) == (401, "certificate")
            assert "revoked" in str(refused.value)
            assert await alice.publish({"still": "in"})
        connection = await handshake(process, directory, {"subscriptionId": reply["subscriptionId"]}, "mallory")
        try:
            line = await connection.line(timeout=10)
        finally:
            connection.close()
        assert line is not None and (line["status"], line["field"]) == (401, "certificate")
    finally:
        process.close()
        certs.revoke(directory, [])


def outward_address() -> str:
    """An address of this machine that is not loopback (no packet is sent to find it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # a documentation address: routed as any other
        except OSError:
            pytest.skip("this machine has no route off loopback")
        address = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this machine has no address but loopback")
    return address


async def test_dev_listens_on_loopback_only_whatever_bind_says(material, tmp_path):
    directory, _ = material
    process = BrokerProcess(
        str(tmp_path), "--role", "gateway", "--dev", "--bind", "0.0.0.0",
        "--certificate", f"{directory}/server.pem", "--private-key", f"{directory}/server-key.pem",
        ca_file=f"{directory}/ca.pem",
    ).start(wait_ready=False)  # fmt: skip
    try:
        serving(process)  # on loopback
        address = outward_address()
        context = ssl.create_default_context(cafile=f"{directory}/ca.pem")
        context.check_hostname = False
        for port in (process.port, process.tcp_port, process.ws_port):
            with pytest.raises(ConnectionRefusedError):
                _, writer = await asyncio.wait_for(asyncio.open_connection(address, port, ssl=context), timeout=5)
                writer.close()
        assert "--dev listens on loopback only" in process.tail(200)
    finally:
        process.close()
