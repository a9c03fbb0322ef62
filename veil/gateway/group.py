"""Shared subscriptions: several delivery connections of a subscription's owner, each joining with
`"group": true`, share its deliveries as a group, each delivery going to one member.

The group reads the subscription's queue once, as a connection of one would (it is the hub's
holder of the subscription, a `Bundle`), and hands each line to the member with the fewest lines
it has not yet acknowledged, up to MEMBER_WINDOW: a member that stops acknowledging stops being
given lines, and the others take its share. A member acknowledges as a multiplexed connection does
(`{"ack": seq}`: that line and every line written to it before). One that leaves (or is closed
for holding lines past --ack-wait without acknowledging any) hands what it took and did not
acknowledge back to the group, to be given, in publication order and ahead of
anything newer, to the others; so each member's lines come in publication order, but for those
handed back, which may come after newer ones.

The group's cursor is the end of the unbroken run of acknowledged deliveries; those acknowledged
past it are saved with it (`acked`), so that a group formed again later, or a connection of one,
is never sent them again. A slow member holds the cursor back, so the lines between the cursor and
the newest one given out are bounded (GROUP_SPAN): past it, the group waits for its oldest line's
acknowledgement before giving out more.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator

from veil.gateway.bundle import END_LINE_WAIT, SEND_BYTES, SEND_LINES, Admitted, Bundle, Hub, line_sizes
from veil.gateway.channel import FAILED, Close, Receive, Send, read_while
from veil.gateway.context import Gateway
from veil.gateway.delivering import attach, hand_back
from veil.gateway.quotas import STALLED_WRITE, Client, WriteWatch
from veil.gateway.subscriber import check, claim
from veil.protocol import Handshake, ProtocolError, parse_ack
from veil.protocol.envelope import wrap
from veil.security.identity import Principal

log = logging.getLogger("veil.gateway")
MEMBER_WINDOW = 1024  # lines a member holds unacknowledged before it is given no more
GROUP_SPAN = 1 << 16  # lines given out past the group's cursor (acknowledged or not)
GIVE_OUT = 2048  # lines given out before the group lets the event loop run others
CHECK_EVERY = 1.0  # seconds between looks for such members (and for quota freed by other connections)
_keys = itertools.count()


class Member:
    """One connection of a group: the lines given to it and not acknowledged (`unacked`, in the order
    it was given them), of which the last `outbox` are not yet written."""

    __slots__ = (
        "_close", "_send", "closed", "given", "key", "outbox", "progress", "serials", "unacked", "wake", "watch",
    )  # fmt: skip

    def __init__(self, send: Send, close: Close) -> None:
        self.key = next(_keys)
        self._send = send
        self._close = close
        self.unacked: deque[int] = deque()
        self.serials: dict[int, int] = {}  # each unacknowledged line's place among all it was given
        self.given = 0
        self.outbox: deque[bytes] = deque()
        self.progress = time.monotonic()  # when it last acknowledged, or was given a line holding none
        self.wake = asyncio.Event()
        self.watch = WriteWatch()
        self.closed = False

    def take(self, pub: int, frame: bytes) -> None:
        if not self.unacked:
            self.progress = time.monotonic()
        self.unacked.append(pub)
        self.serials[pub] = self.given
        self.given += 1
        self.outbox.append(frame)
        self.wake.set()

    def acknowledged(self, seq: int) -> list[int]:
        """The lines an acknowledgement of `seq` covers: the one of that seq and every line written
        to the member before it (none, for a seq it was not written)."""
        serial = self.serials.get(seq)
        if serial is None:
            return []
        place = serial - (self.given - len(self.unacked))
        if place >= len(self.unacked) - len(self.outbox):  # not written yet
            return []
        done = [self.unacked.popleft() for _ in range(place + 1)]
        for pub in done:
            del self.serials[pub]
        self.progress = time.monotonic()
        return done

    def drop(self) -> list[int]:
        """Everything it was given and did not acknowledge, which it no longer holds."""
        left = list(self.unacked)
        self.unacked.clear()
        self.serials.clear()
        self.outbox.clear()
        self.wake.set()
        return left

    def taking(self, now: float) -> bool:
        """Whether it takes lines: its window is not full, and no write has waited for it past
        STALLED_WRITE (judged by the write under way only: one that is given nothing writes nothing
        that could show it reads again)."""
        since = self.watch.since
        return len(self.unacked) < MEMBER_WINDOW and (since is None or now - since <= STALLED_WRITE)

    async def write(self) -> None:
        """Write the lines given to this member until it is closed."""
        while not self.closed:
            if not self.outbox:
                self.wake.clear()
                await self.wake.wait()
                continue
            frames: list[bytes] = []
            size = 0
            while self.outbox and len(frames) < SEND_LINES and size < SEND_BYTES:
                frames.append(self.outbox.popleft())
                size += len(frames[-1])
            with self.watch.writing():
                await self._send(frames)

    async def close(self, error: bytes | None) -> None:
        self.closed = True
        self.wake.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._close(error), END_LINE_WAIT)


class GroupWatch(WriteWatch):
    """A group reads what it is sent while it may give lines out (its span is not full) and one of
    its members takes them: otherwise its client counts as one that does not read (it holds up
    nobody's publishes), and nothing more is queued for it in memory."""

    __slots__ = ("group",)

    def __init__(self, group: Group) -> None:
        super().__init__()
        self.group = group

    def not_reading(self, now: float) -> bool:
        group = self.group
        return group.spanned() or not any(member.taking(now) for member in group.members.values())


class Group(Bundle):
    """A subscription delivered to the members of its group (a `Bundle` of one towards the hub)."""

    __slots__ = (
        "_ack_wait", "_checked", "_closing", "_done", "_frames", "_order", "_ready", "_returned", "claimed",
        "dissolved", "members", "task",
    )  # fmt: skip

    def __init__(self, hub: Hub, handshake: Handshake, admitted: Admitted, client: Client, ack_wait: float) -> None:
        super().__init__(hub, handshake, [admitted], self._refuse, self._close_members, client)
        self._ack_wait = ack_wait  # seconds a member holding lines may acknowledge none (--ack-wait)
        self.claimed = admitted.claimed
        self.members: dict[int, Member] = {}
        self.watch = GroupWatch(self)
        self._frames: dict[int, tuple[bytes, int]] = {}  # lines given out and not acknowledged: line, bytes
        self._order: deque[int] = deque()  # publications given out past the cursor, in order
        self._done: set[int] = set()  # those of them acknowledged
        self._returned: list[int] = []  # a heap: lines members left unacknowledged, to be given out again
        self._ready: deque[tuple[int, bytes, int]] = deque()  # queued lines made, not yet given out
        self._checked = time.monotonic()  # when members were last looked at for acknowledgements
        self._closing: set[asyncio.Future[None]] = set()  # members being closed
        self.task: asyncio.Task[None] | None = None
        self.dissolved = False

    @staticmethod
    async def _refuse(frames: list[bytes]) -> None:
        raise AssertionError("a group writes through its members")

    async def _close_members(self, error: bytes | None) -> None:
        await asyncio.gather(*(member.close(error) for member in list(self.members.values())))

    def join(self, send: Send, close: Close) -> Member:
        member = Member(send, close)
        self.members[member.key] = member
        self._wake.set()
        return member

    def leave(self, member: Member) -> bool:
        """The member's connection is gone: what it did not acknowledge goes back to the group. True
        when no member is left."""
        if self.members.pop(member.key, None) is not None:
            for pub in member.drop():
                heapq.heappush(self._returned, pub)
            self._wake.set()
        return not self.members

    def acknowledge_member(self, member: Member, seq: int) -> None:
        """The member consumed the line with this seq, and so every line written to it before (once
        the group has ended, nothing: what it held is another connection's to deliver)."""
        if self.closed:
            return
        fresh = member.acknowledged(seq)
        if not fresh:
            return
        released = 0
        for pub in fresh:
            released += self._frames.pop(pub)[1]
            self._done.add(pub)
        self.queued_bytes -= released
        self.hub.quotas.release(self.client, released)
        cursor = int(self.cursor[0])
        while self._order and self._order[0] in self._done:
            cursor = self._order.popleft()
            self._done.discard(cursor)
        if cursor > self.cursor[0]:
            self.cursor[0] = cursor
            self.hub.save_cursor(self._number, cursor)
        self.hub.save_acked(self._number, [pub for pub in fresh if pub > cursor])
        self._wake.set()

    async def run(self) -> None:
        """Give lines out while members have room; read the queue from the store when nothing is
        waiting to be given out, the subscription takes no offers and its client has quota left."""
        while not self.closed:
            self._close_stalled()
            waiting = bool(self._returned or self._ready or self.pending)
            if waiting and self._give_out():
                await asyncio.sleep(0)
                continue
            if not waiting and self._refilling() and self._room() > 0:
                async with self.hub.refilling():
                    await self._refill()
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), CHECK_EVERY)

    def _close_stalled(self) -> None:
        """Close the members that held lines and acknowledged none for --ack-wait: their lines go to
        the others (a worker that hung, or a client that takes and never acknowledges)."""
        now = time.monotonic()
        if now - self._checked < CHECK_EVERY:
            return
        self._checked = now
        error = ProtocolError(
            "ack",
            f"no acknowledgement for {self._ack_wait:g} s while holding deliveries: they go to other members",
            408,
        ).to_json()
        for member in self.members.values():
            if member.unacked and not member.closed and now - member.progress > self._ack_wait:
                closing = asyncio.ensure_future(member.close(error))
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)

    def spanned(self) -> bool:
        """Whether it has given out as many lines past its cursor as it may (those acknowledged
        before the group formed, still ahead of it, count too: each group formed again leaves at
        most GROUP_SPAN of them in the store)."""
        return len(self._order) + len(self._acked.get(0, ())) >= GROUP_SPAN

    def _give_out(self) -> bool:
        """Hand waiting lines (up to GIVE_OUT) to the members that take them, the one with the fewest
        unacknowledged first; whether any was."""
        now = time.monotonic()
        open_ = [(len(m.unacked), key, m) for key, m in self.members.items() if m.taking(now)]
        heapq.heapify(open_)
        given = 0
        while open_ and given < GIVE_OUT:
            if self._returned:
                pub = heapq.heappop(self._returned)
                frame = self._frames[pub][0]
            else:
                if not self._ready and not self._make_ready():
                    break
                if self.spanned():
                    break
                pub, frame, size = self._ready.popleft()
                self._frames[pub] = (frame, size)
                self._order.append(pub)
            held, key, member = heapq.heappop(open_)
            member.take(pub, frame)
            if held + 1 < MEMBER_WINDOW:
                heapq.heappush(open_, (held + 1, key, member))
            given += 1
        return given > 0

    def _make_ready(self) -> bool:
        """The next queued lines as they are written (enveloped), counted as sent; False: none."""
        if not self.pending:
            return False
        item = self.pending.popleft()
        count = len(item.pubs)
        self.queued -= count
        self._queued_lines -= count
        sizes = line_sizes(item.bodies, item.envelopes).tolist()
        pubs = item.pubs.tolist()
        # (each line's bytes, as it was queued with them, go back to the quota when it is acknowledged)
        self._ready.extend(zip(pubs, map(wrap, pubs, item.bodies, item.envelopes), sizes, strict=True))
        self.hub.forwarded += count
        if item.logged is not None:
            self.hub.sent([(item.logged, None)])
        return True


@contextlib.asynccontextmanager
async def forming(gateway: Gateway, sub_id: str) -> AsyncIterator[None]:
    """One member at a time joins or dissolves a subscription's group on this gateway: two joining at
    once form one group, and one joining as the last leaves finds the group's acknowledgements saved.
    (The lock goes when nobody holds or waits for it, counted: a released lock is not yet taken by
    the waiter it woke.)"""
    locks = gateway.hub.forming
    lock, users = locks.setdefault(sub_id, (asyncio.Lock(), [0]))
    users[0] += 1
    try:
        async with lock:
            yield
    finally:
        users[0] -= 1
        if not users[0]:
            del locks[sub_id]


async def serve_member(
    gateway: Gateway, handshake: Handshake, principal: Principal, client: Client, send: Send, close: Close,
    receive: Receive,
) -> None:  # fmt: skip
    """Serve a member of the subscription's group until it leaves: it joins the group held here,
    or forms it (claiming the subscription, as a connection of one would)."""
    try:
        # checked before the lock: a client refused holds up nobody's group
        (live,) = await check(gateway, handshake, principal)
        async with forming(gateway, handshake.subscription_id):
            joined = await _join(gateway, handshake, principal, client, live.number, send, close)
    except ProtocolError as exc:
        await close(exc.to_json())
        return
    if joined is None:
        return
    group, member = joined
    writer = asyncio.create_task(member.write())
    try:

        def acknowledge(raw: bytes | str) -> None:
            """After the handshake a member may only acknowledge; anything else is ignored."""
            if raw.strip():
                with contextlib.suppress(ProtocolError):
                    group.acknowledge_member(member, parse_ack(raw))

        await read_while(writer, receive, acknowledge)
    finally:
        member.closed = True
        writer.cancel()
        try:
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, ssl.SSLError):
                await writer
        finally:
            if group.leave(member):
                async with forming(gateway, handshake.subscription_id):
                    if not group.members:  # (none joined meanwhile)
                        await _dissolve(gateway, group)


async def _join(
    gateway: Gateway, handshake: Handshake, principal: Principal, client: Client, number: int, send: Send,
    close: Close,
) -> tuple[Group, Member] | None:  # fmt: skip
    """The group of subscription `number` this member joined (None: the subscription went before it
    could form)."""
    held = gateway.hub.holders.get(handshake.subscription_id)
    if isinstance(held, Group) and not held.closed and int(held.numbers[0]) == number:
        return held, held.join(send, close)
    # formed anew: the cursor read again, after whatever a group dissolved meanwhile saved
    unsaved = gateway.hub.unsaved()
    (admitted,) = await claim(gateway, handshake, await check(gateway, handshake, principal), unsaved)
    group = Group(gateway.hub, handshake, admitted, client, gateway.config.ack_wait)
    member = group.join(send, close)
    try:
        if not await attach(gateway, group, [admitted]):  # (its member was told why)
            await _dissolve(gateway, group)
            return None
    except BaseException:
        await _dissolve(gateway, group)
        raise
    group.task = asyncio.create_task(_run(gateway, group))
    return group, member


async def _run(gateway: Gateway, group: Group) -> None:
    """The group's reading and giving out; a failure ends every member's connection, saying why."""
    try:
        await group.run()
    except Exception as exc:
        if not isinstance(exc, gateway.threads.store.failures):
            log.exception("delivering to a subscription's group failed")
        else:
            log.warning("a group's delivery met a store failure (%s); its members are told to reconnect", exc)
        await group.close(FAILED.to_json())


async def _dissolve(gateway: Gateway, group: Group) -> None:
    """No member is left: the group's subscription is delivered here no more; what its members
    acknowledged is saved before its claim goes."""
    if group.dissolved:
        return
    group.dissolved = group.closed = True
    gateway.hub.detach(group)
    if group.task is not None:
        group.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await group.task
    group.forget()
    await hand_back(gateway, group.ids, group.claimed)
