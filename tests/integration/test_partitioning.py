"""Both partitioning modes of the pipeline keep the log's order: a publication is matched against
exactly the subscription versions logged before it, whichever task holds them."""

from __future__ import annotations

import pytest

from tests.integration.helpers import nothing_more, run_id, take
from veil.client import VeilClient
from veil.harness import BrokerProcess

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["subscriptions", "publications"])
async def test_interleaved_changes_in_both_modes(tmp_path, mode, store_flags):
    broker = BrokerProcess(str(tmp_path), "--partitions", "3", "--partition-mode", mode, *store_flags).start()
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
