"""Shared subscriptions with a real broker: the members of a subscription's group share its
deliveries, each going to one member; what a member took and did not acknowledge when it left (or
was killed) goes to another; what was acknowledged is never sent again, to anyone, even after the
whole group left and formed again. Hypothesis draws publishes with and without idempotency keys,
retried, and members joining, taking, acknowledging and leaving."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import uuid

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.helpers import LineConnection, client_for, nothing_more, run_id, take
from veil.harness import BrokerProcess

ACK_WAIT = 5  # the broker's --ack-wait here: seconds a member may hold lines without acknowledging any

# a member in a process of its own: says when its handshake is sent, acknowledges its first ACKS
# lines, says which, then holds whatever else it is given, unacknowledged, until it is killed
MEMBER = r"""
import asyncio, sys, orjson

async def main(port: int, handshake: bytes, acks: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    writer.write(handshake + b"\n")
    await writer.drain()
    print("joined", flush=True)
    acked = []
    while len(acked) < acks:
        doc = orjson.loads(await reader.readline())
        writer.write(orjson.dumps({"ack": doc["seq"]}) + b"\n")
        await writer.drain()
        acked.append(doc["id"])
    print(orjson.dumps(acked).decode(), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(int(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3])))
"""


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    process = BrokerProcess(str(tmp_path_factory.mktemp("broker")), "--ack-wait", str(ACK_WAIT)).start()
    yield process
    process.close()


def subscribed(rid: str) -> list[dict]:
    return [{"key": "run", "val": rid, "op": "eq"}]


async def test_three_members_share_3000_deliveries_one_killed_midway(broker):
    rid = run_id()
    async with client_for(broker, "pia") as publisher, client_for(broker, "gia") as owner:
        sub_id = (await owner.subscribe(subscribed(rid)))["subscriptionId"]
        handshake = orjson.dumps({"authHash": "gia", "subscriptionId": sub_id, "group": True, "ack": True})
        doomed = subprocess.Popen(
            [sys.executable, "-c", MEMBER, str(broker.tcp_port), handshake.decode(), "300"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        survivors = [owner.deliveries(sub_id, group=True) for _ in range(2)]
        taken: list[list[str]] = [[], []]

        async def consume(place: int) -> None:
            async for delivery in survivors[place]:
                taken[place].append(delivery.id)

        consumers = [asyncio.create_task(consume(place)) for place in range(2)]
        try:
            # all three members in before the first publication: one that joined late could find the
            # others had taken everything (a slow machine starts a Python process in seconds)
            await asyncio.gather(*(stream.connected.wait() for stream in survivors))
            await asyncio.wait_for(asyncio.to_thread(doomed.stdout.readline), 60)
            ids: list[str] = []
            for start in range(0, 3000, 500):
                ids += await publisher.publish_batch([{"run": rid, "n": n} for n in range(start, start + 500)])
            line = await asyncio.wait_for(asyncio.to_thread(doomed.stdout.readline), 60)
            acked_by_doomed = orjson.loads(line)
            await asyncio.sleep(1.0)  # its acknowledgements are in; what it holds past them is not
            doomed.kill()
            doomed.wait()
            async with asyncio.timeout(60):
                while len(taken[0]) + len(taken[1]) + len(acked_by_doomed) < len(ids):
                    await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # nothing more comes
        finally:
            doomed.kill()
            for task in consumers:
                task.cancel()
            for stream in survivors:
                await stream.aclose()
        everything = taken[0] + taken[1] + acked_by_doomed
        assert len(acked_by_doomed) == 300
        assert sorted(everything, key=int) == sorted(ids, key=int), "each delivery once, across the group"
        assert taken[0] and taken[1], "both survivors had a share"


async def test_what_members_acknowledged_is_never_sent_again_after_the_group_forms_anew(broker):
    rid = run_id()
    async with client_for(broker, "pia") as publisher, client_for(broker, "gia") as owner:
        sub_id = (await owner.subscribe(subscribed(rid)))["subscriptionId"]
        handshake = {"authHash": "gia", "subscriptionId": sub_id, "group": True, "ack": True}
        silent = await LineConnection.open(broker.tcp_port, handshake)  # takes lines, acknowledges none
        async with owner.deliveries(sub_id, group=True) as acking:
            await acking.connected.wait()
            ids = await publisher.publish_batch([{"run": rid, "n": n} for n in range(40)])
            held: list[str] = []
            consumed: list[str] = []

            async def hold() -> None:
                while (doc := await silent.line()) is not None and "seq" in doc:
                    held.append(doc["id"])

            holding = asyncio.create_task(hold())
            async with asyncio.timeout(60):
                while len(held) + len(consumed) < len(ids):
                    with contextlib.suppress(TimeoutError):
                        consumed += [d.id for d in await take(acking, 1, timeout=0.2)]
            holding.cancel()
        assert sorted(held + consumed, key=int) == ids
        assert held, "the member that acknowledges nothing was given lines"
        silent.close()
        await asyncio.sleep(0.5)
        # the group formed again: what the silent member held, and nothing the other acknowledged
        again = await LineConnection.open(broker.tcp_port, handshake)
        redelivered = [(await again.line())["id"] for _ in range(len(held))]
        assert redelivered == held
        assert await again.silent()
        again.writer.write(orjson.dumps({"ack": int(redelivered[-1])}) + b"\n")
        newer = await publisher.publish({"run": rid, "n": 40})
        assert (await again.line())["id"] == newer
        again.writer.write(orjson.dumps({"ack": int(newer)}) + b"\n")
        await again.writer.drain()
        await asyncio.sleep(0.5)
        again.close()
        await asyncio.sleep(0.5)
        async with owner.deliveries(sub_id) as alone:  # a connection of one, after the group
            await nothing_more(alone)


async def test_a_member_that_acknowledges_nothing_past_the_ack_wait_is_closed_and_its_lines_go_on(broker):
    rid = run_id()
    async with client_for(broker, "pia") as publisher, client_for(broker, "gia") as owner:
        sub_id = (await owner.subscribe(subscribed(rid)))["subscriptionId"]
        handshake = {"authHash": "gia", "subscriptionId": sub_id, "group": True, "ack": True}
        hung = await LineConnection.open(broker.tcp_port, handshake)
        async with owner.deliveries(sub_id, group=True) as worker:
            await worker.connected.wait()
            ids = await publisher.publish_batch([{"run": rid, "n": n} for n in range(10)])
            working = asyncio.create_task(take(worker, len(ids), timeout=4 * ACK_WAIT))  # (acknowledging)
            taken: list[str] = []
            while (doc := await hung.line()) is not None and "seq" in doc:
                taken.append(doc["id"])
            assert taken and (doc["field"], doc["status"]) == ("ack", 408), doc
            rest = [d.id for d in await working]
            assert sorted(rest, key=int) == ids and set(taken) <= set(rest)
        hung.close()


async def test_a_slow_member_that_acknowledges_as_it_goes_is_never_closed(broker):
    """The client library acknowledges at least every second: a worker that takes longer than the
    ack wait over its window's lines keeps them, and nothing comes twice."""
    rid = run_id()
    async with client_for(broker, "pia") as publisher, client_for(broker, "gia") as owner:
        sub_id = (await owner.subscribe(subscribed(rid)))["subscriptionId"]
        async with owner.deliveries(sub_id, group=True) as worker:
            await worker.connected.wait()
            ids = await publisher.publish_batch([{"run": rid, "n": n} for n in range(120)])
            taken = []
            async with asyncio.timeout(60):
                while len(taken) < len(ids):
                    taken.append((await worker.__anext__()).id)
                    await asyncio.sleep(1.5 * ACK_WAIT / len(ids))  # all of them: past the ack wait
            assert taken == ids and worker.reconnects == 0
            await nothing_more(worker)


async def test_a_member_must_acknowledge_and_names_one_subscription(broker):
    async with client_for(broker, "gia") as owner:
        sub_id = (await owner.subscribe(subscribed(run_id())))["subscriptionId"]
    for handshake, field in [
        ({"authHash": "gia", "subscriptionId": sub_id, "group": True}, "group"),
        ({"authHash": "gia", "subscriptionIds": [sub_id], "group": True, "ack": True}, "group"),
        ({"authHash": "gia", "subscriptionId": sub_id, "group": True, "ack": True, "resumeAfter": 3}, "resumeAfter"),
        ({"authHash": "gia", "subscriptionId": sub_id, "group": "yes", "ack": True}, "group"),
        ({"authHash": "someone else", "subscriptionId": sub_id, "group": True, "ack": True}, "subscriptionId"),
    ]:
        connection = await LineConnection.open(broker.tcp_port, handshake)
        answer = await connection.line()
        assert answer is not None and answer["field"] == field, (handshake, answer)
        connection.close()


SETTLE = 0.2  # seconds for a member's acknowledgement to reach the broker before its connection goes

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 12), st.booleans(), st.integers(0, 2)),
        st.tuples(st.just("join")),
        st.tuples(st.just("take"), st.integers(0, 7), st.integers(1, 20), st.booleans()),
        st.tuples(st.just("leave"), st.integers(0, 7), st.booleans()),
    ),
    min_size=2,
    max_size=14,
)


class GroupRun:
    """One drawn run against one subscription: its members (raw connections) and what each read, and
    every acknowledged publication, checked as it goes: nothing acknowledged comes again."""

    def __init__(self, broker, owner, handshake: dict) -> None:
        self.broker = broker
        self.owner = owner
        self.handshake = handshake
        self.members: list[tuple[LineConnection, list[str]]] = []  # (connection, read and not acknowledged)
        self.acked: set[str] = set()

    async def join(self) -> None:
        self.members.append((await LineConnection.open(self.broker.tcp_port, self.handshake), []))

    async def take(self, which: int, most: int, acknowledge: bool) -> None:
        if not self.members:
            return
        connection, unacked = self.members[which % len(self.members)]
        for _ in range(most):
            try:
                doc = await connection.line(timeout=0.3)
            except TimeoutError:
                break
            if doc is None or "seq" not in doc:  # closed, holding lines unacknowledged past --ack-wait
                assert doc is None or (doc["field"], doc["status"]) == ("ack", 408), doc
                self.members.remove((connection, unacked))
                connection.close()
                return
            assert doc["id"] not in self.acked, f"{doc['id']} came again after it was acknowledged"
            unacked.append(doc["id"])
        if acknowledge and unacked:
            await self._acknowledge(connection, unacked)

    async def _acknowledge(self, connection: LineConnection, unacked: list[str]) -> None:
        connection.writer.write(orjson.dumps({"ack": int(unacked[-1])}) + b"\n")
        await connection.writer.drain()
        assert not self.acked.intersection(unacked)
        self.acked.update(unacked)
        unacked.clear()

    async def leave(self, which: int, acknowledge: bool) -> None:
        if not self.members:
            return
        connection, unacked = self.members.pop(which % len(self.members))
        if acknowledge and unacked:
            await self._acknowledge(connection, unacked)
        await asyncio.sleep(SETTLE)
        connection.close()

    async def finish(self, published: set[str]) -> None:
        """A last member takes what is left: every publication acknowledged once, nothing more."""
        while self.members:
            await self.leave(0, True)
        await self.join()
        connection, unacked = self.members[0]
        async with asyncio.timeout(60):
            while self.acked | set(unacked) != published:
                doc = await connection.line()
                assert doc is not None and doc["id"] not in self.acked, doc
                assert doc["id"] not in unacked, f"{doc['id']} came twice to one member"
                unacked.append(doc["id"])
        assert await connection.silent(1.0)
        await self.leave(0, True)
        assert self.acked == published


async def drawn_run(broker, steps: list[tuple]) -> None:
    rid = run_id()
    async with client_for(broker, "pia") as publisher, client_for(broker, "gia") as owner:
        sub_id = (await owner.subscribe(subscribed(rid)))["subscriptionId"]
        run = GroupRun(broker, owner, {"authHash": "gia", "subscriptionId": sub_id, "group": True, "ack": True})
        published: set[str] = set()
        n = 0
        for step in steps:
            if step[0] == "publish":
                _, count, keyed, retries = step
                batch = [{"run": rid, "n": n + i} for i in range(count)]
                n += count
                key = uuid.uuid4().hex if keyed else None
                ids = await publisher.publish_batch(batch, idempotency_key=key)
                for _ in range(retries if keyed else 0):  # a retry under the key publishes nothing new
                    assert await publisher.publish_batch(batch, idempotency_key=key) == ids
                published.update(ids)
            elif step[0] == "join":
                await run.join()
            elif step[0] == "take":
                await run.take(*step[1:])
            else:
                await run.leave(*step[1:])
        await run.finish(published)


@settings(max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(steps=STEPS)
def test_drawn_publishes_retries_and_members_lose_nothing_acknowledged_and_repeat_nothing(broker, steps):
    asyncio.run(drawn_run(broker, steps))


def test_the_command_line_joins_a_group(broker):
    rid = run_id()
    veil = [sys.executable, "-m", "veil.cli"]
    flags = ["--url", broker.url, "--auth-hash", "gia"]

    async def subscribe() -> str:
        async with client_for(broker, "gia") as owner:
            return (await owner.subscribe(subscribed(rid)))["subscriptionId"]

    sub_id = asyncio.run(subscribe())
    port = str(broker.tcp_port)
    member = subprocess.Popen(
        [*veil, "subscribe", "--existing", "--id", sub_id, "--group", "--count", "3", "--tcp-port", port, *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    async def publish() -> list[str]:
        async with client_for(broker, "pia") as publisher:
            await asyncio.sleep(2.0)  # the member connects
            return await publisher.publish_batch([{"run": rid, "n": n} for n in range(3)])

    ids = asyncio.run(publish())
    out, err = member.communicate(timeout=60)
    assert member.returncode == 0, err
    assert [orjson.loads(line)["id"] for line in out.splitlines()] == ids
    refused = subprocess.run([*veil, "subscribe", "lat>1", "--group", *flags], capture_output=True, text=True)
    assert refused.returncode != 0 and "--group" in refused.stderr and "--existing" in refused.stderr
    wrong = [*veil, "subscribe", "--existing", "--id", sub_id, "--tcp-port", "70000", *flags]
    refused = subprocess.run(wrong, capture_output=True, text=True)
    assert refused.returncode != 0 and "--tcp-port" in refused.stderr
