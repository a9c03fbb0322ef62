"""What a delivery connection holds: its subscriptions, delivered together as one `Bundle`.

A connection that named one subscription holds a bundle of one; a multiplexed connection, a bundle
of all it named. Their cursors, positions in the queue and states are numpy arrays indexed by the
subscription's place in the handshake, so that a feed entry matching a quarter of 20,000
subscriptions held by a few client processes costs each connection a few array operations and one
line per publication, written once with the ids of the subscriptions it goes to. Per subscription a
bundle behaves as it would alone: deliveries come in the order of its queue; one that has just
connected, or whose deliveries would overflow the connection's queue, reads its backlog from the
store (there a publication comes once per subscription) and takes live offers again once it has
caught up. What the client sees differs by kind: a connection of one gets its publications as they
are (or in an envelope, when it asked for one) and ends with its subscription; a multiplexed one gets
each line with the ids it goes to, and a subscription that ends (unsubscribed, quarantined, replaced
by a newer connection) ends alone, its error line naming it (`subscriptionId`), the connection going
on for the others until none is left.

An acknowledgement names the last line the client consumed. On a connection of one, lines come in
publication order, so it is the subscription's cursor. On a multiplexed one it covers every line
written before that one, whatever subscriptions they were for (lines of different subscriptions are
not written in one global order, since a backlog read after connecting brings older publications
after newer ones). The lines written and not yet acknowledged are remembered up to
`UNACKED_DELIVERIES`; older ones are folded into one cursor per subscription, which the next
acknowledgement applies, so a client that never acknowledges costs a bounded amount of memory and a
hostile ack a dictionary lookup. A connection of one writes at most `UNACKED_DELIVERIES` past what
its client acknowledged (its lines are in publication order, so an acknowledgement says how many it
consumed); then it waits for an acknowledgement, and what its subscription is owed waits in the
store, within its queue's bounds: a client that reads and never acknowledges holds no more of the
store than one that does not read.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np
import orjson

from veil.gateway.channel import Close, Send
from veil.gateway.quotas import Client, Quotas, WriteWatch, fitting
from veil.gateway.store_threads import StoreThreads
from veil.monitoring import trace
from veil.protocol import Handshake
from veil.protocol.envelope import wrap
from veil.protocol.limits import dumps_kept

LINE_LIMIT = 8192  # lines a connection queues before its subscriptions read from the store instead
QUEUE_LIMIT = 2048  # deliveries per subscription it queues (on average), for the same reason
REFILL_DELIVERIES = 65536  # read from the store at once, over the subscriptions that refill
REFILL_EACH = 64  # at least, per subscription
SEND_LINES = 512  # lines per write
SEND_BYTES = 64 * 1024  # bytes per write, about: what waits in the transport for a client that reads slowly
END_LINE_WAIT = 1.0  # seconds an ending subscription's error line may wait for the client
REFILL_BYTES = 1 << 20  # bytes of lines queued from one read of the store, about
LINE_BYTES = 48  # of a line besides its publication, envelope fields and subscription ids: seq, id, quotes
UNACKED_DELIVERIES = 1 << 16  # written and remembered line by line for acknowledgements
_keys = itertools.count()
ONE_EACH = np.empty(0, np.int64)


class Admitted(NamedTuple):
    """A subscription a connection may deliver: its number, where delivery starts, when this gateway
    claimed it (`membership`) and what past the start its group's members acknowledged (`group`),
    which nobody is sent again."""

    sub_id: str
    number: int
    start_after: int
    claimed: float
    acked: np.ndarray = np.empty(0, np.int64)


# when publications were logged (ms), and how many deliveries of each were sent (None: one each)
Sent = tuple[np.ndarray, np.ndarray | None]


class Published(NamedTuple):
    """What a feed entry delivers, once per distinct copy ("variant": a publication, or a cropped copy
    of it for one subscription): its offset, bytes, envelope fields, when it was logged (ms), the
    bytes of its line but the subscription ids (`sizes`), and its rank in publication order, then
    variant (`ranks`, from `variant_ranks`: made once for all the connections it is offered to)."""

    pubs: np.ndarray
    bodies: np.ndarray  # of bytes
    envelopes: np.ndarray  # of bytes
    logged: np.ndarray
    sizes: np.ndarray
    ranks: np.ndarray


def variant_ranks(pubs: np.ndarray) -> np.ndarray:
    """Each variant's rank in publication order, then variant (`Published.ranks`). Without cropped
    copies the variants are the distinct publications in order already, and need no sort."""
    ranks = np.arange(len(pubs))
    if len(pubs) > 1 and not (pubs[1:] > pubs[:-1]).all():
        ranks[np.lexsort((ranks, pubs))] = np.arange(len(pubs))
    return ranks


class Backlog(NamedTuple):
    """What a read of subscriptions' backlogs found (`Hub.backlog`): their matches (sorted by
    subscription, then publication), the highest feed seq visible to the read, the seq a next read
    of the feed may start from, and what the matches deliver (`Published`, each match's variant)."""

    sub_nos: np.ndarray
    pubs: np.ndarray
    watermark: int
    reached: int
    published: Published
    variants: np.ndarray


class Hub(Protocol):
    """What a bundle asks of the delivery hub that fans the feed out to it."""

    threads: StoreThreads
    quotas: Quotas
    offering: int  # the newest feed entry the hub has begun to offer (what a subscription's read must reach)
    forwarded: int  # deliveries sent and not yet counted in the store

    def taking(self, numbers: np.ndarray, key: int, on: bool) -> None: ...

    def refilling(self) -> contextlib.AbstractAsyncContextManager[None]: ...

    def leave(self, bundle: Bundle, place: int) -> None: ...

    def save_cursor(self, number: int, pub: int) -> None: ...

    def save_acked(self, number: int, pubs: list[int]) -> None: ...

    def sent(self, logged: list[Sent]) -> None: ...

    async def backlog(self, numbers: np.ndarray, afters: np.ndarray, limit: int, since: int) -> Backlog: ...


class Lines(NamedTuple):
    """Queued lines: per line its publication, bytes and envelope fields; per line how many
    deliveries it carries and per delivery, in line order, the subscription's place (`ONE_EACH` for
    both where the feed offers a connection of one its lines: one delivery each, to its only
    subscription); `logged` only for lines taken live from the feed (the latency histogram's
    samples); the bytes they hold of their client's quota."""

    pubs: np.ndarray
    bodies: list[bytes]
    envelopes: list[bytes]
    counts: np.ndarray
    places: np.ndarray
    logged: np.ndarray | None
    size: int


class Bundle:
    """A delivery connection's subscriptions, as arrays indexed by their place in the handshake."""

    # (slots: the hub touches every connection per feed entry, and a compact instance keeps that cheap)
    __slots__ = (
        "_acked", "_by_number", "_close", "_folded", "_id_bytes", "_limit", "_number", "_numbers_sorted", "_places",
        "_queued_lines", "_quoted", "_remembered", "_send", "_serials", "_unacked", "_unacked_through", "_wake",
        "_write_next", "_write_of", "_written", "acks", "client", "closed", "cursor", "envelope", "hub", "ids", "key",
        "last_queued", "live", "multiplexed", "numbers", "open", "pending", "queued", "queued_bytes", "saved", "sent",
        "unread", "watch",
    )  # fmt: skip

    def __init__(
        self, hub: Hub, handshake: Handshake, admitted: list[Admitted], send: Send, close: Close, client: Client
    ) -> None:
        self.key = next(_keys)
        self.hub = hub
        self.client = client  # whose quota the queued lines count against
        self.multiplexed = bool(handshake.subscription_ids)
        self.envelope = self.multiplexed or handshake.envelope
        self.ids = [a.sub_id for a in admitted]
        self.numbers = np.array([a.number for a in admitted], np.int64)
        self._number = admitted[0].number  # a connection of one's, as a plain int for its every write
        self._places = {sub_id: place for place, sub_id in enumerate(self.ids)}
        self._quoted = np.array([dumps_kept(sub_id) for sub_id in self.ids], object)
        # each id's bytes in a line, with its comma (none where the lines name no subscription)
        self._id_bytes = np.array([(len(quoted) + 1) * self.multiplexed for quoted in self._quoted], np.int64)
        self.acks = handshake.ack
        self.last_queued = np.array([a.start_after for a in admitted], np.int64)
        self.cursor = self.last_queued.copy()  # delivered (or acknowledged, with acks): what to save
        self.saved = self.cursor.copy()
        self.sent = admitted[0].start_after  # the last publication written to a connection of one
        self._numbers_sorted = np.sort(self.numbers)
        self._by_number = np.argsort(self.numbers)  # places in the order of _numbers_sorted
        self._limit = QUEUE_LIMIT * len(admitted)  # deliveries queued: what its subscriptions would queue alone
        self.live = np.zeros(len(admitted), bool)  # caught up: takes offers from the feed
        # where a subscription that takes no offers must read the unspilled feed from (entries before
        # it were offered to it): its reads then cost the entries it missed, not all the store keeps
        self.unread = np.zeros(len(admitted), np.int64)
        self.open = np.ones(len(admitted), bool)
        self._acked = {place: a.acked for place, a in enumerate(admitted) if len(a.acked)}
        self.pending: deque[Lines] = deque()
        self.queued = 0  # deliveries
        self.queued_bytes = 0  # of the lines queued, and of those being written
        self._queued_lines = 0
        # written lines not yet acknowledged, per write: (its serial, seqs, where each line's deliveries
        # end, places, pubs); the first remembered write holding each seq; what older writes delivered
        self._written: deque[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._write_of: dict[int, int] = {}
        self._serials = itertools.count()
        self._folded = np.zeros(len(admitted), np.int64)
        self._remembered = 0
        # a connection of one with acks: deliveries written in all and acknowledged, and its writes not
        # yet acknowledged: the last seq of each, and deliveries written through it
        self._unacked_through = [0, 0]
        self._unacked: deque[tuple[int, int]] = deque()
        self._send = send
        self._close = close
        self.closed = False
        self._write_next = self._write if self.multiplexed else self._write_one
        self.watch = WriteWatch()
        self._wake = asyncio.Event()

    def place(self, sub_id: str) -> int:
        return self._places[sub_id]

    def offer(self, seq: int, places: np.ndarray, pubs: np.ndarray, variants: np.ndarray, published: Published) -> None:
        """Feed entry `seq`'s deliveries to this multiplexed connection's subscriptions (grouped by
        subscription, each in publication order): queued as one line per variant, naming the
        subscriptions it goes to."""
        if self.closed:
            return
        take = self.live[places] & (pubs > self.last_queued[places])
        if not take.all():
            places, pubs, variants = places[take], pubs[take], variants[take]
        if not len(places):
            return
        room = self._room()
        # what cannot fit is not even made into lines: an entry may hold millions of deliveries
        lines = None
        if self.queued + len(places) <= self._limit and int(self._id_bytes[places].sum()) <= room:
            lines = _lines(places, variants, published, self._id_bytes, live=True)[0]
        if lines is None or self._queued_lines + len(lines.pubs) > LINE_LIMIT or lines.size > room:
            self._fall_behind(seq, places)
            return
        self._queue(lines, len(places))
        np.maximum.at(self.last_queued, places, pubs)

    def offer_one(
        self, seq: int, first: int, last: int, pubs: np.ndarray, bodies: list[bytes], envelopes: list[bytes],
        size: int, logged: np.ndarray,
    ) -> None:  # fmt: skip
        """Feed entry `seq`'s deliveries to a connection of one (in publication order, the `first` to
        the `last`, `size` bytes of lines): the feed's common case, so it costs a few comparisons of
        plain ints and one append. The hub offers only to subscriptions that take offers (its
        `taking`, read after its last await)."""
        if self.closed:
            return
        room = self._room()
        count = len(pubs)
        if first > self.last_queued[0] and count <= self._limit - self.queued and size <= room:
            self._queue(Lines(pubs, bodies, envelopes, ONE_EACH, ONE_EACH, logged, size), count)
            self.last_queued[0] = last
            return
        # what is new of them and fits is queued; the rest waits in the store
        skip = int(np.searchsorted(pubs, self.last_queued[0], side="right"))
        room_left = max(0, min(self._limit - self.queued, len(pubs) - skip))
        sizes = line_sizes(bodies[skip : skip + room_left], envelopes[skip : skip + room_left])
        fits = fitting(sizes, room, least=0)
        if fits:
            take = slice(skip, skip + fits)
            size = int(sizes[:fits].sum())
            self._queue(Lines(pubs[take], bodies[take], envelopes[take], ONE_EACH, ONE_EACH, logged[take], size), fits)
            self.last_queued[0] = pubs[skip + fits - 1]
        if len(pubs) - skip > fits:
            self._fall_behind(seq, np.zeros(1, np.int64))

    def _room(self) -> int:
        """Bytes this connection may queue: none while its client does not read (what it is owed
        waits in the store, so that clients reading nothing hold no more than what they took before)."""
        return 0 if self.watch.not_reading(time.monotonic()) else self.hub.quotas.room(self.client)

    def _fall_behind(self, seq: int, places: np.ndarray) -> None:
        """These subscriptions take no more offers: they refill from the store, from entry `seq` on."""
        self.live[places] = False
        self.hub.taking(self.numbers[places], self.key, False)
        self.unread[places] = seq
        self._wake.set()

    def _queue(self, lines: Lines, deliveries: int) -> None:
        self.pending.append(lines)
        self.queued += deliveries
        self._queued_lines += len(lines.pubs)
        self.queued_bytes += lines.size
        self.hub.quotas.take(self.client, lines.size)
        self._wake.set()

    def resync(self) -> None:
        """Take the next deliveries from the store rather than from offers."""
        self.live[:] = False
        self.hub.taking(self.numbers, self.key, False)
        self.unread[:] = 0
        self._wake.set()

    def standing(self) -> tuple[int, int]:
        """Of its subscriptions still delivered here, how many read their backlog from the store
        rather than take offers, and how many there are."""
        if not self.multiplexed:  # (without numpy reductions: the hub asks every connection of one)
            connected = bool(self.open[0])
            return int(connected and not self.live[0]), int(connected)
        return int(np.count_nonzero(self.open & ~self.live)), int(np.count_nonzero(self.open))

    def number_of(self, sub_id: str) -> int:
        return int(self.numbers[self.place(sub_id)])

    def let_go(self, sub_id: str) -> None:
        """The subscription is delivered through this connection no more (at once: `end` says why; a
        connection of one stops writing, so that the line saying so is what it ends with)."""
        place = self.place(sub_id)
        self.open[place] = self.live[place] = False
        if not self.multiplexed:
            self.closed = True
        self.hub.leave(self, place)

    async def end(self, ended: Sequence[tuple[str, bytes | None]]) -> None:
        """Subscriptions leave the connection, each with its error line (naming it, on a multiplexed
        connection), in one write."""
        for sub_id, _ in ended:
            self.let_go(sub_id)
        if not self.multiplexed:
            ((_, error),) = ended
            await self.close(error)
            return
        lines = [error[:-1] + b',"subscriptionId":' + orjson.dumps(sub_id) + b"}" for sub_id, error in ended if error]
        if lines:
            # the lines are handed to the transport; waiting for a client that does not read would hold
            # up whoever ends the subscriptions (an unsubscription, the quarantine, another connection)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._send(lines), END_LINE_WAIT)
        if not self.open.any():  # closed now: a push waiting for a client that does not read is cut off
            await self.close()

    def acknowledge(self, seq: int) -> None:
        """The client consumed the line with this seq, and so every line written before it."""
        if not self.multiplexed:
            if self.acks and self.cursor[0] < seq <= self.sent:
                self.cursor[0] = seq
                self.hub.save_cursor(self._number, seq)
                while self._unacked and self._unacked[0][0] <= seq:
                    self._unacked_through[1] = self._unacked.popleft()[1]
                self._wake.set()
            return
        serial = self._write_of.get(seq)
        if serial is None:
            return  # not written here, or forgotten
        while self._written[0][0] < serial:
            self._drop(self.cursor)
        np.maximum(self.cursor, self._folded, out=self.cursor)
        self._folded[:] = 0
        _, seqs, ends, places, pubs = self._written[0]
        done = int(ends[np.flatnonzero(seqs == seq)[0]])
        np.maximum.at(self.cursor, places[:done], pubs[:done])

    def forget(self) -> None:
        """The connection is gone: what it had queued goes back to its client's quota (it is still in
        the store)."""
        self.pending.clear()
        self.hub.quotas.release(self.client, self.queued_bytes)
        self.queued = self._queued_lines = self.queued_bytes = 0

    def cursor_changes(self) -> dict[int, int]:
        """The cursors that moved since the last call, by subscription number (a connection of one
        hands its cursor to the hub as it moves)."""
        moved = np.flatnonzero(self.cursor > self.saved)
        self.saved[moved] = self.cursor[moved]
        return dict(zip(self.numbers[moved].tolist(), self.cursor[moved].tolist(), strict=True))

    async def run(self) -> None:
        """Push until the connection fails or no subscription is left."""
        while not self.closed:
            if self._unacked_through[0] - self._unacked_through[1] >= UNACKED_DELIVERIES:
                self._await_acknowledgement()
                await self._wake.wait()
            elif self.pending:
                await self._write_next()
            elif self._refilling():
                async with self.hub.refilling():
                    await self._refill()
            else:
                self._wake.clear()
                await self._wake.wait()

    def _await_acknowledgement(self) -> None:
        """Written as much unacknowledged as a connection may: until an acknowledgement comes, the
        client counts as one that does not read (it holds up nobody's publishes) and nothing more is
        queued for it in memory."""
        self.watch.slow = True
        self._wake.clear()

    def _refilling(self) -> bool:
        """Whether a subscription still delivered here takes no offers (and so reads from the store)."""
        if not self.multiplexed:  # (without numpy reductions: the common case, once per write)
            return not self.live[0] and bool(self.open[0])
        return bool((self.open & ~self.live).any())

    async def _write_one(self) -> None:
        """Write the next lines of a connection of one: its publications, as they are or in envelopes
        (gathered in one loop, without arrays: the common case, once per write)."""
        pubs: list[int] = []
        bodies: list[bytes] = []
        envelopes: list[bytes] = []
        logged: list[Sent] = []
        size = 0
        while self.pending and len(pubs) < SEND_LINES and size < SEND_BYTES:
            item = self.pending.popleft()
            size += item.size
            pubs.extend(item.pubs.tolist())
            bodies.extend(item.bodies)
            envelopes.extend(item.envelopes)
            if item.logged is not None:
                logged.append((item.logged, None))
        self.queued -= len(pubs)
        self._queued_lines -= len(pubs)
        with self.watch.writing():
            await self._send(list(map(wrap, pubs, bodies, envelopes)) if self.envelope else bodies)
        self._written_out(size, len(pubs), logged)
        last = pubs[-1]
        if trace.DIRECTORY and logged:
            trace.mark("written", self.sent, last)
        self.sent = last
        if not self.acks:
            self.cursor[0] = last
            self.hub.save_cursor(self._number, last)
        else:
            self._unacked_through[0] += len(pubs)
            self._unacked.append((last, self._unacked_through[0]))

    async def _write(self) -> None:
        """Write the next lines of a multiplexed connection, each naming the subscriptions it goes to."""
        batch: list[Lines] = []
        lines = size = 0
        while self.pending and lines < SEND_LINES and size < SEND_BYTES:
            batch.append(self.pending.popleft())
            lines += len(batch[-1].pubs)
            size += batch[-1].size
        frames: list[bytes] = []
        for at, item in enumerate(batch):
            self.queued -= len(item.places)
            self._queued_lines -= len(item.pubs)
            kept = self.open[item.places]
            if not kept.all():  # some subscriptions ended since these lines were queued
                item = batch[at] = _without(item, kept)
            bounds = np.cumsum(item.counts).tolist()
            quoted = self._quoted[item.places].tolist()
            low = 0
            for pub, body, members, high in zip(item.pubs.tolist(), item.bodies, item.envelopes, bounds, strict=True):
                ids = b'"subscriptionIds":[' + b",".join(quoted[low:high]) + b"]"
                frames.append(wrap(pub, body, members + b"," + ids if members else ids))
                low = high
        if frames:  # (none, when every subscription its lines were for has ended)
            with self.watch.writing():
                await self._send(frames)
        places = np.concatenate([item.places for item in batch])
        counts = np.concatenate([item.counts for item in batch])
        pubs = np.repeat(np.concatenate([item.pubs for item in batch]), counts)
        if self.acks:
            self._remember(np.concatenate([item.pubs for item in batch]), np.cumsum(counts), places, pubs)
        else:
            np.maximum.at(self.cursor, places, pubs)
        logged: list[Sent] = [(item.logged, item.counts) for item in batch if item.logged is not None]
        self._written_out(size, len(places), logged)
        if trace.DIRECTORY and logged and len(pubs):
            trace.mark("written", int(pubs.min()) - 1, int(pubs.max()))

    def _written_out(self, size: int, deliveries: int, logged: list[Sent]) -> None:
        """A write went through: its bytes go back to the quota; its deliveries count, and the
        latencies of those taken live (`logged`: when their publications were logged, and how many
        deliveries each line made)."""
        self.queued_bytes -= size
        self.hub.quotas.release(self.client, size)
        self.hub.forwarded += deliveries
        if logged:
            self.hub.sent(logged)

    def _remember(self, seqs: np.ndarray, ends: np.ndarray, places: np.ndarray, pubs: np.ndarray) -> None:
        serial = next(self._serials)
        self._written.append((serial, seqs, ends, places, pubs))
        for seq in seqs.tolist():
            self._write_of.setdefault(seq, serial)
        self._remembered += len(places)
        while self._remembered > UNACKED_DELIVERIES:
            self._drop(self._folded)  # applied by the next acknowledgement, which comes after it

    def _drop(self, into: np.ndarray) -> None:
        """Forget the oldest remembered write, what it delivered kept in `into`."""
        serial, seqs, _, places, pubs = self._written.popleft()
        np.maximum.at(into, places, pubs)
        self._remembered -= len(places)
        for seq in seqs.tolist():
            if self._write_of.get(seq) == serial:
                del self._write_of[seq]

    async def _refill(self) -> None:
        """Read the queues of the subscriptions that take no offers, all at once, from the store."""
        places = np.flatnonzero(self.open & ~self.live)
        limit = min(QUEUE_LIMIT, max(REFILL_EACH, REFILL_DELIVERIES // len(places)))
        since = int(self.unread[places].min())
        backlog = await self.hub.backlog(self.numbers[places], self.last_queued[places], limit, since)
        if self.closed:
            return
        sub_nos, pubs = backlog.sub_nos, backlog.pubs
        rows = self._by_number[np.searchsorted(self._numbers_sorted, sub_nos)]
        size = len(self.ids)
        full = np.bincount(rows, minlength=size)[places] >= limit
        cut = np.zeros(len(places), bool)  # read, but not all queued: the rest is read again
        if len(pubs):
            published, variants = backlog.published, backlog.variants
            known = variants >= 0  # compacted away meanwhile: nobody is owed them
            if self._acked:
                known &= ~self._acked_among(rows, pubs)
            lines, sizes = _lines(rows[known], variants[known], published, self._id_bytes, live=False)
            taken = fitting(sizes, min(self.hub.quotas.room(self.client), REFILL_BYTES), least=1)
            if taken < len(lines.pubs):  # a line's subscriptions have all lines before it queued
                lines = _head(lines, sizes, taken)
                queued = np.bincount(lines.places, minlength=size)[places]
                cut = np.bincount(rows[known], minlength=size)[places] > queued
                rows, pubs = lines.places, np.repeat(lines.pubs, lines.counts)
            if len(lines.pubs):
                self._queue(lines, len(lines.places))
            np.maximum.at(self.last_queued, rows, pubs)
        read = full & ~cut
        self.unread[places[read]] = np.maximum(self.unread[places[read]], backlog.reached)
        # Rows the hub handled after our snapshot were not offered to us, nor those of an entry it is
        # offering now (it chose whom to offer before our read ended): read again before going live.
        if self.hub.offering <= backlog.watermark:
            caught_up = places[~full & ~cut]
            self.live[caught_up] = self.open[caught_up]
            self.hub.taking(self.numbers[caught_up], self.key, True)

    def _acked_among(self, places: np.ndarray, pubs: np.ndarray) -> np.ndarray:
        """Which of these deliveries a group's members acknowledged before this connection (a group's
        saved cursor stops at its oldest unacknowledged delivery; those acknowledged past it are not
        sent again). Once read past, they are forgotten."""
        for place in [place for place, acked in self._acked.items() if self.last_queued[place] >= acked[-1]]:
            del self._acked[place]
        found = np.zeros(len(pubs), bool)
        for place, acked in self._acked.items():
            mine = places == place
            found[mine] = np.isin(pubs[mine], acked)
        return found

    async def close(self, error: bytes | None = None) -> None:
        """(Waiting at most END_LINE_WAIT for a client that does not read: whoever ends the connection,
        the gateway stopping, an unsubscription or a newer connection, is not held up by it.)"""
        self.closed = True
        self._wake.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._close(error), END_LINE_WAIT)


def _lines(
    places: np.ndarray, variants: np.ndarray, published: Published, id_bytes: np.ndarray, live: bool
) -> tuple[Lines, np.ndarray]:
    """Deliveries (grouped by subscription, each in publication order) as lines: one per variant, in
    publication order, naming the subscriptions it goes to (`id_bytes`: each place's id as written);
    and each line's size."""
    if not len(places):
        empty = np.empty(0, np.int64)
        return Lines(empty, [], [], empty, empty, empty if live else None, 0), empty
    # in publication order, then variant: one stable sort of the variants' ranks (a radix sort when
    # they fit 16 bits), a quarter of the time of `np.lexsort` over publications and variants
    keys = published.ranks[variants]
    order = np.argsort(keys.astype(np.uint16) if len(published.ranks) <= 1 << 16 else keys, kind="stable")
    variants, places = variants[order], places[order]
    starts = np.flatnonzero(np.r_[True, variants[1:] != variants[:-1]])
    chosen = variants[starts]
    sizes = published.sizes[chosen] + np.add.reduceat(id_bytes[places], starts)
    lines = Lines(
        published.pubs[chosen], published.bodies[chosen].tolist(), published.envelopes[chosen].tolist(),
        np.diff(np.r_[starts, len(places)]), places, published.logged[chosen] if live else None, int(sizes.sum()),
    )  # fmt: skip
    return lines, sizes


def _head(lines: Lines, sizes: np.ndarray, n: int) -> Lines:
    """The first n lines (of these sizes)."""
    deliveries = int(lines.counts[:n].sum())
    return Lines(
        lines.pubs[:n], lines.bodies[:n], lines.envelopes[:n], lines.counts[:n], lines.places[:deliveries],
        None if lines.logged is None else lines.logged[:n], int(sizes[:n].sum()),
    )  # fmt: skip


def _without(lines: Lines, kept: np.ndarray) -> Lines:
    """The lines with only the deliveries `kept` (per delivery), and no line left without one; they
    still hold the bytes they were queued with."""
    line_of = np.repeat(np.arange(len(lines.pubs)), lines.counts)
    counts = np.bincount(line_of[kept], minlength=len(lines.pubs))
    left = counts > 0
    return Lines(
        lines.pubs[left], [b for b, k in zip(lines.bodies, left.tolist(), strict=True) if k],
        [e for e, k in zip(lines.envelopes, left.tolist(), strict=True) if k], counts[left], lines.places[kept],
        None if lines.logged is None else lines.logged[left], lines.size,
    )  # fmt: skip


def line_sizes(bodies: list[bytes], envelopes: list[bytes]) -> np.ndarray:
    """The bytes of each delivery line but its subscription ids."""
    count = len(bodies)
    body_sizes = np.fromiter(map(len, bodies), np.int64, count)
    return body_sizes + np.fromiter(map(len, envelopes), np.int64, count) + LINE_BYTES
