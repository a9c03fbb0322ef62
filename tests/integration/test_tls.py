"""TLS on all three listeners, mutual TLS with client certificates, and the loopback rule."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys

import aiohttp
import orjson
import pytest

from tests.integration.helpers import LineConnection, run_id, take
from veil.client import VeilClient, VeilError
from veil.harness import BrokerProcess
from veil.security.tls import client_context

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("certs"))
    result = subprocess.run(
        [sys.executable, "-m", "veil.cli", "certs", "--dir", directory, "--client", "alice", "--client", "bob"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    fingerprints = dict(line.split("  authHash ") for line in result.stdout.splitlines() if "authHash" in line)
    return directory, {name.removeprefix("client-").removesuffix(".pem"): fp for name, fp in fingerprints.items()}


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory, certs):
    directory, _ = certs
    process = BrokerProcess(
        str(tmp_path_factory.mktemp("tls-broker")),
        "--certificate", f"{directory}/server.pem", "--private-key", f"{directory}/server-key.pem",
        "--client-ca", f"{directory}/ca.pem",
        ca_file=f"{directory}/ca.pem",
    ).start()  # fmt: skip
    yield process
    process.close()


def client_for(broker: BrokerProcess, certs, name: str | None = None, auth_hash: str | None = None) -> VeilClient:
    directory, _ = certs
    cert = f"{directory}/client-{name}.pem" if name else None
    key = f"{directory}/client-{name}-key.pem" if name else None
    return VeilClient(
        broker.url, auth_hash=auth_hash, ca_file=f"{directory}/ca.pem", cert_file=cert, key_file=key,
        tcp_port=broker.tcp_port, ws_port=broker.ws_port,
    )  # fmt: skip


async def test_seed_example_over_tls_line_protocol_and_wss(tls_broker, certs):
    directory, _ = certs
    data = [
        {"key": "lat", "val": 14, "type": "int", "op": "gt"},
        {"key": "lon", "val": 53, "type": "int", "op": "lt"},
    ]

    def seed_publication(lat: int, lon: int) -> dict:
        return {"publication": [{"key": "lat", "val": lat, "type": "int"}, {"key": "lon", "val": lon, "type": "int"}]}

    async with client_for(tls_broker, certs, auth_hash="clientIdHash1") as client:
        reply = await client.subscribe(data, "subId")
        handshake = {"authHash": "clientIdHash1", "subscriptionId": reply["subscriptionId"]}
        context = client_context(f"{directory}/ca.pem")
        conn = await LineConnection.open(tls_broker.tcp_port, handshake, ssl=context)
        await client.publish(seed_publication(10, 10))
        await client.publish(seed_publication(20, 10))
        assert await conn.line() == {"lat": 20, "lon": 10}
        assert await conn.silent()
        conn.close()
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"wss://127.0.0.1:{tls_broker.ws_port}/", ssl=context) as ws,
        ):
            await ws.send_str(orjson.dumps(handshake).decode())
            await client.publish(seed_publication(10, 10))
            await client.publish(seed_publication(30, 0))
            message = await ws.receive(timeout=60)
            assert orjson.loads(message.data) == {"lat": 30, "lon": 0}
            with pytest.raises(TimeoutError):
                await ws.receive(timeout=1.5)
        await client.unsubscribe("subId")


async def test_mutual_tls_identity_is_the_certificate_fingerprint(tls_broker, certs):
    rid = run_id()
    _, fingerprints = certs
    async with client_for(tls_broker, certs, "alice") as alice:
        reply = await alice.subscribe([{"key": "run", "val": rid, "op": "eq"}])
        for transport in ("tcp", "ws"):
            async with alice.deliveries(reply["subscriptionId"], transport=transport) as stream:
                await alice.publish({"run": rid, "via": transport})
                (got,) = await take(stream, 1)
                assert got.publication == {"run": rid, "via": transport}
    # the subscription belongs to alice's certificate: bob's certificate cannot take it over or remove it
    async with client_for(tls_broker, certs, "bob") as bob:
        with pytest.raises(VeilError) as err:
            await bob.unsubscribe(reply["subscriptionId"])
        assert err.value.status == 404  # as for an id nobody holds
    async with client_for(tls_broker, certs, "bob", auth_hash=fingerprints["alice"]) as impostor:
        with pytest.raises(VeilError) as err:
            await impostor.subscribe([], reply["subscriptionId"])
        assert (err.value.status, err.value.field) == (403, "authHash")
    # the same identity without a certificate, as a static hash, is honoured (development mode)
    async with client_for(tls_broker, certs, auth_hash=fingerprints["alice"]) as by_hash:
        await by_hash.unsubscribe(reply["subscriptionId"])


async def test_plain_and_unverified_clients_are_refused(tls_broker, certs):
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            await http.post(f"http://127.0.0.1:{tls_broker.port}/publish", data=b"{}")
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await http.post(f"https://127.0.0.1:{tls_broker.port}/publish", data=b"{}")
    with pytest.raises(ssl.SSLError):
        await LineConnection.open(tls_broker.tcp_port, b"{}\n", ssl=ssl.create_default_context())


async def test_required_client_certificates(tmp_path, certs):
    directory, _ = certs
    process = BrokerProcess(
        str(tmp_path),
        "--certificate", f"{directory}/server.pem", "--private-key", f"{directory}/server-key.pem",
        "--client-ca", f"{directory}/ca.pem", "--client-cert", "required",
        ca_file=f"{directory}/ca.pem",
    ).start(wait_ready=False)  # fmt: skip
    try:
        import asyncio

        async with client_for(process, certs, "alice") as alice:
            for _ in range(100):
                try:
                    await alice.request("/publish", b'{"ping": 1}')
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            assert await alice.publish({"ping": 2})
        async with client_for(process, certs) as anonymous:
            with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
                await anonymous.publish({"ping": 3}, retry_for=0)
    finally:
        process.close()


def test_plain_listeners_only_on_loopback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "veil.cli", "serve", "--data-dir", str(tmp_path), "--bind", "0.0.0.0"],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )  # fmt: skip
    assert result.returncode == 2
    assert "--bind 0.0.0.0" in result.stderr and "--certificate" in result.stderr
