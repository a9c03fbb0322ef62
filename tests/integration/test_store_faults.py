"""The store's own failures, on a real file system: a full disk answers 503 with Retry-After (never a
bare 500, never a 200 for what was not stored) and shows in /health; a pipeline that cannot find the
store refuses to run instead of creating an empty one. Everything acknowledged is delivered once the
fault is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import NamedTuple

import aiohttp
import orjson
import pytest

from tests.integration.helpers import nothing_more, run_id, take
from tests.prerequisites import missing
from veil.client import VeilClient
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow
DISK_MB = 96


class Disk(NamedTuple):
    path: str
    problem: str | None  # why it is not a file system of its own; None when it is


@pytest.fixture(scope="module")
def disk(tmp_path_factory) -> Iterator[Disk]:
    """A file system of its own (tmpfs), so that filling it fills the broker's disk and no other; where
    it cannot be mounted (not root), a plain directory, which serves every test but the full disk's."""
    path = str(tmp_path_factory.mktemp("disk"))
    try:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", path], capture_output=True)
    except OSError as exc:
        yield Disk(path, f"cannot run mount: {exc}")
        return
    if result.returncode != 0:
        yield Disk(path, f"cannot mount a tmpfs here (needs root): {result.stderr.decode().strip()}")
        return
    yield Disk(path, None)
    subprocess.run(["umount", "-l", path], check=False)


@pytest.fixture
def small_disk(disk: Disk) -> str:
    if disk.problem is not None:
        missing(disk.problem, "VEIL_REQUIRE_TMPFS")
    return disk.path


@pytest.fixture(scope="module")
def broker(disk: Disk) -> Iterator[BrokerProcess]:
    process = BrokerProcess(os.path.join(disk.path, "broker")).start()
    yield process
    process.close()


def client(broker: BrokerProcess) -> VeilClient:
    return VeilClient(broker.url, auth_hash="dana", tcp_port=broker.tcp_port, ws_port=broker.ws_port)


def fill(directory: str) -> str:
    """Take every free byte of the file system."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return path


async def test_a_full_disk_answers_503_and_loses_nothing(broker, small_disk):
    rid = run_id()
    async with client(broker) as dana:
        sub = (await dana.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
        filler = fill(small_disk)
        try:
            acknowledged, refused = [], None
            padding = "x" * 4000
            async with aiohttp.ClientSession() as http:
                for n in range(20_000):
                    async with http.post(
                        f"{broker.url}/publish", data=orjson.dumps({"run": rid, "n": n, "pad": padding}),
                        headers={"Content-Type": "application/json", "X-Auth-Hash": "dana"},
                    ) as response:  # fmt: skip
                        assert response.status in (200, 503), await response.text()
                        if response.status == 503:
                            refused = (dict(response.headers), await response.json())
                            break
                        acknowledged.append(n)
                assert refused is not None, "the disk never filled"
                headers, body = refused
                assert int(headers["Retry-After"]) > 0 and "store" in body["error"]
                health = broker.health()
                assert health["status"] == "degraded" and any("store" in p for p in health["problems"]), health
                async with http.get(f"{broker.url}/ready") as response:
                    assert response.status == 503
        finally:  # the module's other test runs on this disk too
            os.remove(filler)
        broker.wait_ready(timeout=120)
        await dana.publish({"run": rid, "n": "after"})
        async with dana.deliveries(sub) as stream:
            got = await take(stream, len(acknowledged) + 1, timeout=120)
            await nothing_more(stream)
    assert [d.publication["n"] for d in got] == [*acknowledged, "after"]


async def test_a_pipeline_that_cannot_see_the_store_refuses_to_run(broker):
    """As on an executor whose machine does not see the gateway's disk: no empty store appears, and
    /health says why the pipeline does not run."""
    database = os.path.join(broker.data_dir, "veil.db")
    hidden = os.path.join(broker.data_dir, "elsewhere")
    os.makedirs(hidden, exist_ok=True)
    rid = run_id()
    async with client(broker) as dana:
        sub = (await dana.subscribe([{"key": "run", "val": rid, "op": "eq"}]))["subscriptionId"]
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(database + suffix):
                os.rename(database + suffix, os.path.join(hidden, "veil.db" + suffix))
        try:
            os.kill(broker.pipeline_pid(), signal.SIGKILL)  # type: ignore[arg-type]
            deadline = time.monotonic() + 60
            while not any("no store at" in p for p in broker.health()["problems"]):
                assert time.monotonic() < deadline, broker.health()
                time.sleep(0.5)
            assert not os.path.exists(database)  # it did not create one
            await dana.publish({"run": rid, "n": 1})  # the gateway still takes publications
        finally:
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(os.path.join(hidden, "veil.db" + suffix)):
                    os.rename(os.path.join(hidden, "veil.db" + suffix), database + suffix)
        broker.wait_ready(timeout=120)
        async with dana.deliveries(sub) as stream:
            assert [d.publication["n"] for d in await take(stream, 1, timeout=120)] == [1]
