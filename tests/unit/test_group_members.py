"""A group's members in-process: who takes lines (a member whose one write was slow takes them
again once it is through), and how an acknowledgement counts (by position, only what was written)."""

from __future__ import annotations

import asyncio
import time

from veil.gateway.group import MEMBER_WINDOW, Member


async def test_a_member_whose_write_was_slow_takes_lines_again_once_it_is_through():
    release = asyncio.Event()
    written: list[bytes] = []

    async def send(frames: list[bytes]) -> None:
        await release.wait()
        written.extend(frames)

    async def close(error: bytes | None) -> None:
        pass

    member = Member(send, close)
    member.take(5, b'{"seq":5}')
    writing = asyncio.create_task(member.write())
    await asyncio.sleep(0.4)  # the write waits for its client past STALLED_WRITE
    assert not member.taking(time.monotonic())
    release.set()
    await asyncio.sleep(0.05)
    assert written == [b'{"seq":5}'] and member.taking(time.monotonic())
    assert member.acknowledged(5) == [5] and member.taking(time.monotonic())
    member.closed = True
    member.wake.set()
    await writing


async def test_an_acknowledgement_covers_what_was_written_before_it_in_the_order_given():
    async def send(frames: list[bytes]) -> None:
        pass

    async def close(error: bytes | None) -> None:
        pass

    member = Member(send, close)
    for pub in (10, 12, 11):  # 11 handed back by a member that left, after 12
        member.take(pub, b"{}")
    assert member.acknowledged(12) == []  # nothing written yet
    member.outbox.clear()  # (written)
    assert member.acknowledged(99) == []  # never given to it
    assert member.acknowledged(12) == [10, 12]
    assert member.acknowledged(11) == [11]
    for pub in range(MEMBER_WINDOW):
        member.take(100 + pub, b"{}")
    assert not member.taking(time.monotonic())  # its window is full
