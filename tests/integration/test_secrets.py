"""Secrets where neighbours look: a broker on PostgreSQL whose store URL carries a password, with a
registry of static hashes and a scope whose key seals a payload. Neither the password, nor a
static hash, nor the scope key, nor the payload is in any process's command line, any log line, any
file of the broker's data directory (Spark's checkpoints and scratch space among them), any
registry the broker stores or serves, or the options of Spark's source."""

from __future__ import annotations

import base64
import contextlib
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from tests.integration.helpers import run_id, take
from veil.client import VeilClient
from veil.config import Config
from veil.harness import BrokerProcess, postgres_database
from veil.pipeline.job import start_query
from veil.security.sealing import recipient_public

pytestmark = pytest.mark.slow
PASSWORD = f"pw-{os.urandom(12).hex()}"  # the server trusts local connections: any password opens it
HASHES = {user: f"{user}-{os.urandom(12).hex()}" for user in ("alice", "carol", "root")}
RECIPIENT = {user: X25519PrivateKey.generate() for user in ("alice", "carol")}
MANAGER = Ed25519PrivateKey.generate()
MANAGERS = {"customs": {"carol-1": base64.b64encode(MANAGER.public_key().public_bytes_raw()).decode()}}


def with_password(url: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=f"{parts.username or 'postgres'}:{PASSWORD}@{parts.netloc.rpartition('@')[2]}").geturl()


@pytest.fixture(scope="module")
def broker(tmp_path_factory, postgres_server):
    directory = tmp_path_factory.mktemp("secrets")
    registry = {
        "admins": ["root"],
        "hashes": {secret: user for user, secret in HASHES.items()},
        "rules": {"*": [[]]},
        "keys": {"carol": MANAGERS["customs"]},
        "recipients": {u: base64.b64encode(recipient_public(k)).decode() for u, k in RECIPIENT.items()},
        "scopes": {"customs": {"users": ["alice", "carol"], "managers": ["carol"]}},
    }
    path = directory / "registry.json"
    path.write_text(json.dumps(registry))
    with postgres_database(postgres_server) as url:
        process = BrokerProcess(
            str(directory / "data"), "--registry", str(path), "--auth", "hash", "--anonymous", "false",
            env={"VEIL_STORE": with_password(url)},  # not --store: a command line is anyone's to read
        ).start()  # fmt: skip
        yield process
        process.close()


def client(broker: BrokerProcess, user: str) -> VeilClient:
    return VeilClient(broker.url, auth_hash=HASHES[user], recipient_key=RECIPIENT.get(user), scope_managers=MANAGERS)


def command_lines() -> list[bytes]:
    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # gone meanwhile
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
    return lines


async def test_no_secret_in_command_lines_logs_files_or_the_registry(broker):
    rid, payload = run_id(), f"payload {os.urandom(8).hex()}".encode()
    alice, carol, root = client(broker, "alice"), client(broker, "carol"), client(broker, "root")
    try:
        await carol.rotate_scope_key("customs", ("carol-1", MANAGER), {u: recipient_public(k) for u, k in RECIPIENT.items()})
        await carol.subscribe([{"key": "rid", "op": "eq", "val": rid}], f"s-{rid}", scope="customs")
        async with carol.deliveries(f"s-{rid}") as stream:
            await stream.connected.wait()
            await alice.publish({"rid": rid}, seal="customs", payload=payload)
            [delivery] = await take(stream, 1)
        assert delivery.payload == payload
        scope_key = (await alice.keyring.key("customs")).secret
        served = json.dumps(await root.registry()).encode()
    finally:
        for c in (alice, carol, root):
            await c.close()
    broker.wait_processed()
    secrets = {"the store password": PASSWORD.encode(), "the scope key": scope_key, "the payload": payload}
    secrets |= {f"{user}'s static hash": secret.encode() for user, secret in HASHES.items()}
    texts = {"the served registry": served, "the broker's log": Path(broker.log_path).read_bytes()}
    texts |= {f"command line {i}": line for i, line in enumerate(command_lines())}
    for root_dir, _, names in os.walk(broker.data_dir):
        for name in names:
            texts[os.path.join(root_dir, name)] = Path(root_dir, name).read_bytes()
    found = [(what, where) for what, secret in secrets.items() for where, text in texts.items() if secret in text]
    found += [
        (what, where)
        for what, secret in secrets.items()
        if what != "the payload"
        for where, text in texts.items()
        if base64.b64encode(secret) in text or secret.hex().encode() in text
    ]
    assert found == []
    assert any(b"veil.pipeline" in line for line in command_lines()), "the pipeline's command line was looked at"


class Recorder:
    """Spark's reader, as far as `start_query` uses it: it records the options it is given."""

    def __init__(self) -> None:
        self.options: dict[str, str] = {}

    def option(self, key: str, value: str) -> Recorder:
        self.options[key] = value
        return self

    def __getattr__(self, name: str) -> Recorder:
        return self

    def __call__(self, *args: object, **kwargs: object) -> Recorder:
        return self


def test_the_options_of_sparks_source_hold_no_password():
    reader = Recorder()
    start_query(reader, Config(store=f"postgresql://veil:{PASSWORD}@db.example/veil?sslmode=verify-full"))
    assert reader.options["store"] == "postgresql://veil@db.example/veil?sslmode=verify-full"
    assert not any(PASSWORD in value for value in reader.options.values())
