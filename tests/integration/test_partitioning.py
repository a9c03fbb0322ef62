"""Both partitioning modes of the pipeline keep the log's order: a publication is matched against
exactly the subscription versions logged before it, whichever task holds them."""

from __future__ import annotations

import pytest

from tests.integration.helpers import nothing_more, run_id, take
from veil.client import VeilClient
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow


# modes and triggers differ in the pipeline, the dialects in the store, which the unit tests run on
# both: each pair once would cost the suite minutes and test nothing new
@pytest.mark.parametrize(
    ("mode", "trigger", "store_flags"),
    [
        ("subscriptions", "rounds", "postgresql"),
        ("publications", "rounds", "sqlite"),
        ("publications", "micro-batch", "postgresql"),  # its slices of a batch; subscriptions: test_topkw
    ],
    indirect=["store_flags"],
)
async def test_interleaved_changes_in_both_modes(tmp_path, mode, trigger, store_flags):
    flags = ("--partitions", "3", "--partition-mode", mode, "--trigger", trigger, *store_flags)
    broker = BrokerProcess(str(tmp_path), *flags).start()
    try:
        async with VeilClient(broker.url, auth_hash="ivy") as client:
            runs = [run_id() for _ in range(4)]
            for rid in runs:
                run = {"key": "run", "val": rid, "op": "eq"}
                steps = [
                    ("sub", "A", "gt"), ("pub", 1, 1), ("sub", "B", "gt"), ("pub", 2, 1), ("sub", "A", "lt"),
                    ("pub", 3, 1), ("sub", "C", "gt"), ("pub", 4, -1), ("sub", "B", "lt"), ("pub", 5, -1),
                    ("pub", 6, 1),
                ]  # fmt: skip
                for kind, name, arg in steps:
                    if kind == "sub":
                        await client.subscribe([run, {"key": "x", "val": 0, "op": arg}], f"{name}-{rid}")
                    else:
                        await client.publish({"run": rid, "n": name, "x": arg})
            broker.wait_processed()
            for rid in runs:
                for name, expected in (("A", [1, 2, 4, 5]), ("B", [2, 3, 5]), ("C", [6])):
                    async with client.deliveries(f"{name}-{rid}") as stream:
                        got = await take(stream, len(expected))
                        assert [d.publication["n"] for d in got] == expected, (mode, name)
                        await nothing_more(stream, 0.3)
    finally:
        broker.close()


async def test_changing_the_partitions_between_restarts_redistributes_the_subscriptions(tmp_path):
    """The subscriptions come from the store, not from the partitions that held them: a restart with
    more (or fewer) partitions loses and repeats nothing."""
    broker = BrokerProcess(str(tmp_path), "--partitions", "2").start()
    rid = run_id()
    names = [f"p{i}-{rid}" for i in range(12)]
    try:
        async with VeilClient(broker.url, auth_hash="ivy", tcp_port=broker.tcp_port) as client:
            for i, name in enumerate(names):
                await client.subscribe([{"key": "run", "val": rid, "op": "eq"}, {"key": "x", "val": i, "op": "ge"}], name)
            for x in range(0, 12, 2):
                await client.publish({"run": rid, "x": x})
            broker.wait_processed()
        for partitions in ("3", "1"):
            assert broker.stop() == 0
            broker.extra[broker.extra.index("--partitions") + 1] = partitions
            broker.start()
            async with VeilClient(broker.url, auth_hash="ivy", tcp_port=broker.tcp_port) as client:
                await client.publish({"run": rid, "x": int(partitions) * 10})
            broker.wait_processed()
        async with VeilClient(broker.url, auth_hash="ivy", tcp_port=broker.tcp_port) as client:
            for i, name in enumerate(names):
                expected = [x for x in (*range(0, 12, 2), 30, 10) if x >= i]
                async with client.deliveries(name) as stream:
                    got = await take(stream, len(expected))
                    assert [d.publication["x"] for d in got] == expected, name
                    await nothing_more(stream, 0.3)
    finally:
        broker.close()
