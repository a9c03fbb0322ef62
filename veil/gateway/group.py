"""Shared subscriptions: several delivery connections of a subscription's owner, each joining with
`"group": true`, share its deliveries as a group, each delivery going to one member.

The group reads the subscription's queue once, as a connection of one would (it is the hub's
holder of the subscription, a `Bundle`), and hands each line to the member with the fewest lines
it has not yet acknowledged, up to MEMBER_WINDOW: a member that stops acknowledging stops being
given lines, and the others take its share. A member acknowledges as a multiplexed connection does
(`{"ack": seq}`: that line and every line written to it before). One that leaves hands what it
took and did not acknowledge back to the group, to be given, in publication order and ahead of
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
from collections import deque
from collections.abc import AsyncIterator

from veil.gateway import membership
from veil.gateway.bundle import END_LINE_WAIT, SEND_LINES, Admitted, Bundle, Hub, line_sizes
from veil.gateway.channel import FAILED, Close, Receive, Send, read_while
from veil.gateway.context import Gateway
from veil.gateway.delivering import attach
from veil.gateway.quotas import Client, WriteWatch
from veil.gateway.subscriber import check, claim
from veil.protocol import Handshake, ProtocolError, parse_ack
from veil.protocol.envelope import wrap
from veil.security.identity import Principal

log = logging.getLogger("veil.gateway")
MEMBER_WINDOW = 1024  # lines a member holds unacknowledged before it is given no more
GROUP_SPAN = 1 << 16  # lines given out past the group's cursor (acknowledged or not)
_keys = itertools.count()


class Member:
    """One connection of a group: the lines given to it and not acknowledged (`unacked`, in the order
    it was given them), of which the last `outbox` are not yet written."""

    __slots__ = ("_close", "_send", "closed", "given", "key", "outbox", "serials", "unacked", "wake", "watch")

    def __init__(self, send: Send, close: Close) -> None:
        self.key = next(_keys)
        self._send = send
        self._close = close
        self.unacked: deque[int] = deque()
        self.serials: dict[int, int] = {}  # each unacknowledged line's place among all it was given
        self.given = 0
        self.outbox: deque[bytes] = deque()
        self.wake = asyncio.Event()
        self.watch = WriteWatch()
        self.closed = False

    def take(self, pub: int, frame: bytes) -> None:
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
        return done

    def drop(self) -> list[int]:
        """Everything it was given and did not acknowledge, which it no longer holds."""
        left = list(self.unacked)
        self.unacked.clear()
        self.serials.clear()
        self.outbox.clear()
        self.wake.set()
        return left

    async def write(self) -> None:
        """Write the lines given to this member until it is closed."""
        while not self.closed:
            if not self.outbox:
                self.wake.clear()
                await self.wake.wait()
                continue
            frames = [self.outbox.popleft() for _ in range(min(len(self.outbox), SEND_LINES))]
            with self.watch.writing():
                await self._send(frames)

    async def close(self, error: bytes | None) -> None:
        self.closed = True
        self.wake.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._close(error), END_LINE_WAIT)


class Group(Bundle):
    """A subscription delivered to the members of its group (a `Bundle` of one towards the hub)."""

    __slots__ = ("_done", "_frames", "_order", "_ready", "_returned", "claimed", "members", "task")

    def __init__(self, hub: Hub, handshake: Handshake, admitted: Admitted, client: Client) -> None:
        super().__init__(hub, handshake, [admitted], self._refuse, self._close_members, client)
        self.claimed = admitted.claimed
        self.members: dict[int, Member] = {}
        self._frames: dict[int, tuple[bytes, int]] = {}  # lines given out and not acknowledged: line, bytes
        self._order: deque[int] = deque()  # publications given out past the cursor, in order
        self._done: set[int] = set()  # those of them acknowledged
        self._returned: list[int] = []  # a heap: lines members left unacknowledged, to be given out again
        self._ready: deque[tuple[int, bytes, int]] = deque()  # queued lines made, not yet given out
        self.task: asyncio.Task[None] | None = None

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
        """The member consumed the line with this seq, and so every line written to it before."""
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
        waiting to be given out and the subscription takes no offers."""
        while not self.closed:
            waiting = bool(self._returned or self._ready or self.pending)
            if waiting and self._give_out():
                continue
            if not waiting and self._refilling():
                async with self.hub.refilling():
                    await self._refill()
                continue
            self._wake.clear()
            await self._wake.wait()

    def _give_out(self) -> bool:
        """Hand waiting lines to the members with room, the fewest unacknowledged first; whether any was."""
        open_ = [member for member in self.members.values() if len(member.unacked) < MEMBER_WINDOW]
        given = 0
        while open_:
            if self._returned:
                pub = heapq.heappop(self._returned)
                frame = self._frames[pub][0]
            else:
                if not self._ready and not self._make_ready():
                    break
                if len(self._order) >= GROUP_SPAN:
                    break
                pub, frame, size = self._ready.popleft()
                self._frames[pub] = (frame, size)
                self._order.append(pub)
            member = min(open_, key=lambda each: len(each.unacked))
            member.take(pub, frame)
            if len(member.unacked) >= MEMBER_WINDOW:
                open_.remove(member)
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
            self.hub.sent([item.logged])
        return True


@contextlib.asynccontextmanager
async def forming(gateway: Gateway, sub_id: str) -> AsyncIterator[None]:
    """One member at a time joins or dissolves a subscription's group on this gateway: two joining at
    once form one group, and one joining as the last leaves finds the group's acknowledgements saved."""
    locks = gateway.hub.forming
    lock = locks.setdefault(sub_id, asyncio.Lock())
    try:
        async with lock:
            yield
    finally:
        if not lock.locked() and locks.get(sub_id) is lock:
            del locks[sub_id]


async def serve_member(
    gateway: Gateway, handshake: Handshake, principal: Principal, client: Client, send: Send, close: Close,
    receive: Receive,
) -> None:  # fmt: skip
    """Serve a member of the subscription's group until it leaves: it joins the group held here,
    or forms it (claiming the subscription, as a connection of one would)."""
    try:
        async with forming(gateway, handshake.subscription_id):
            joined = await _join(gateway, handshake, principal, client, send, close)
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
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, ssl.SSLError):
            await writer
        if group.leave(member):
            async with forming(gateway, handshake.subscription_id):
                if not group.members:  # (none joined meanwhile)
                    await _dissolve(gateway, group)


async def _join(
    gateway: Gateway, handshake: Handshake, principal: Principal, client: Client, send: Send, close: Close
) -> tuple[Group, Member] | None:
    """The group this member joined (None: the subscription went before it could form)."""
    (live,) = await check(gateway, handshake, principal)
    held = gateway.hub.holders.get(handshake.subscription_id)
    if isinstance(held, Group) and not held.closed and int(held.numbers[0]) == live.number:
        return held, held.join(send, close)
    (admitted,) = await claim(gateway, handshake, [live])
    group = Group(gateway.hub, handshake, admitted, client)
    member = group.join(send, close)
    if not await attach(gateway, group, [admitted]):  # (its member was told why)
        await _dissolve(gateway, group)
        return None
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
    acknowledged is saved before its claim goes (the queues' bounds apply past the saved cursor)."""
    group.closed = True
    gateway.hub.detach(group)
    if group.task is not None:
        group.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await group.task
    group.forget()
    await gateway.hub.flush_cursors(bundles=False)
    await membership.release(gateway, group.ids, group.claimed)
