"""The gateway in-process, without a pipeline: its REST behaviour over a real socket (aiohttp's test
server), in milliseconds instead of a Spark start. Deliveries need the pipeline: those guarantees
are tested end to end in tests/integration."""

import json
import os
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from veil.config import Config
from veil.gateway.context import Gateway
from veil.gateway.rest import create_app
from veil.gateway.server import Broker

ALICE, BOB, ROOT = "alice-secret-1", "bob-secret-1", "root-secret-1"
REGISTRY = {
    "admins": ["root"],
    "hashes": {ALICE: "alice", BOB: "bob", ROOT: "root"},
    "rules": {"*": [[]]},
    "announce": {"*": [[]]},
}


@pytest.fixture
async def broker(tmp_path) -> AsyncIterator[Broker]:
    registry = os.path.join(tmp_path, "registry.json")
    with open(registry, "w") as handle:
        json.dump(REGISTRY, handle)
    config = Config(data_dir=str(tmp_path), registry=registry, auth="hash", anonymous=False, max_pending=64)
    broker = Broker(config, run_pipeline=False)
    await broker.prepare()
    yield broker
    broker.gateway.threads.close()
    broker.gateway.parsing.shutdown(wait=False)


@pytest.fixture
def gateway(broker: Broker) -> Gateway:
    return broker.gateway


@pytest.fixture
async def http(gateway: Gateway) -> AsyncIterator[TestClient]:
    client = TestClient(TestServer(create_app(gateway)))
    await client.start_server()
    yield client
    await client.close()
