"""Shared subscriptions with a real broker: the members of a subscription's group share its
deliveries, each going to one member; what a member took and did not acknowledge when it left (or
was killed) goes to another; what was acknowledged is never sent again, to anyone, even after the
whole group left and formed again."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys

import orjson

from tests.integration.helpers import LineConnection, client_for, nothing_more, run_id, take

# a member in a process of its own: acknowledges its first ACKS lines, says which, then holds
# whatever else it is given, unacknowledged, until it is killed
MEMBER = r"""
import asyncio, sys, orjson

async def main(port: int, handshake: bytes, acks: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    writer.write(handshake + b"\n")
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
            await asyncio.gather(*(stream.connected.wait() for stream in survivors))
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
                while True:
                    held.append((await silent.line())["id"])

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
