"""Delivery sessions: per-subscription queues pushed to connected clients, in order, once.

The hub polls the store for new deliveries, or waits for its signal where it has one, and offers
them (in the order the pipeline queued them) to the sessions of connected subscriptions. A session
that falls behind, or has just connected, stops taking offers and reads its backlog from the store
instead, so memory per session stays bounded and a disconnected subscription loses nothing. Cursors
(the last publication delivered, or acknowledged when the client asked for acks) are saved in
batches; a reconnect resumes after the cursor.

Everything a session reads, is offered or saves goes by the subscription's number, not its id: an id
freed by an unsubscription and taken again is a new subscription with a new number, so nothing of
the old one (queued, in the feed, a cursor) reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from veil.gateway.bundle import END_LINE_WAIT, LINE_BYTES, REFILL_BYTES, SEND_BYTES, Bundle, Published
from veil.gateway.channel import Close, Send
from veil.gateway.quotas import UNLIMITED, Client, Quotas, WriteWatch, fitting
from veil.gateway.store_threads import StoreThreads
from veil.monitoring import trace
from veil.monitoring.histogram import LATENCY_BOUNDS, Histogram
from veil.protocol import Handshake, ProtocolError
from veil.protocol.envelope import fields, wrap
from veil.protocol.errors import unknown
from veil.store.base import FeedEntry

log = logging.getLogger("veil.gateway")

QUEUE_LIMIT = 2048
SEND_BATCH = 512
BUNDLE_CURSOR_TICKS = 10  # cursor flushes per save of multiplexed connections' cursors
FEED_WAIT = 0.5  # seconds the hub waits for a store's signal of new deliveries before it looks again
FEED_RETRY = 1.0  # seconds before the feed is read again after the store failed
JUDGE_INTERVAL = 0.1  # seconds a judgement of which clients are behind stands


class Clients(NamedTuple):
    """The hub's judgement of its clients (identities with a delivery connection)."""

    behind: int  # of those connected, the ones most of whose subscriptions read their backlog from the store
    connected: int  # the ones with a connection whose client reads what it is sent
    not_reading: int  # the others: every connection of theirs has a write waiting for its client


class Chunk(NamedTuple):
    """Deliveries for one session in publication order: offsets, the bytes delivered and their
    envelope fields (`envelope.fields`), and when each publication was logged (ms; for the latency
    histogram, so only for deliveries taken live from the feed: a backlog read after a reconnect says
    how long the subscriber was away, not how fast the broker is). A session queues chunks rather
    than single deliveries so that the work per delivery stays in numpy and in bytes.join, not in
    Python statements."""

    pubs: np.ndarray
    bodies: list[bytes]
    envelopes: list[bytes]
    size: int  # bytes of its lines
    logged: np.ndarray | None = None


class Session:
    def __init__(
        self,
        hub: DeliveryHub,
        handshake: Handshake,
        number: int,
        start_after: int,
        send: Send,
        close: Close,
        claimed: float = 0.0,
        client: Client | None = None,
    ) -> None:
        self.hub = hub
        self.client = client or Client("")  # whose quota the queued lines count against
        self.claimed = claimed  # when this gateway claimed the subscription for it (`membership`)
        self.sub_id = handshake.subscription_id
        self.number = number
        self.envelope = handshake.envelope
        self.acks = handshake.ack
        self._send = send
        self._close = close
        self.last_queued = start_after
        self.sent = start_after
        self.pending: deque[Chunk] = deque()
        self.queued = 0
        self.queued_bytes = 0  # of the lines queued, and of those being written
        self.caught_up = False
        self.closed = False
        self.watch = WriteWatch()
        self._wake = asyncio.Event()

    def offer(self, chunk: Chunk) -> None:
        if not self.caught_up or self.closed:
            return
        # a connection whose client does not read takes nothing more in memory (it waits in the store)
        free = 0 if self.watch.not_reading(time.monotonic()) else self.hub.quotas.room(self.client)
        if chunk.pubs[0] > self.last_queued and len(chunk.pubs) <= QUEUE_LIMIT - self.queued and chunk.size <= free:
            self._queue(chunk)  # the common case: all of it is new and fits
        else:
            self._offer_part(chunk, free)
        self._wake.set()

    def _offer_part(self, chunk: Chunk, free: int) -> None:
        """Queue what is new of the chunk and fits; the rest waits in the store."""
        skip = int(np.searchsorted(chunk.pubs, self.last_queued, side="right"))
        room = min(QUEUE_LIMIT - self.queued, len(chunk.pubs) - skip)
        sizes = _sizes(chunk.bodies[skip : skip + room], chunk.envelopes[skip : skip + room])
        fits = fitting(sizes, free, least=0)
        if len(chunk.pubs) - skip > fits:
            self.caught_up = False  # the rest waits in the store; the session refills from there
            self.hub.session_taking(self)
        take = slice(skip, skip + fits)
        if fits:
            logged = None if chunk.logged is None else chunk.logged[take]
            size = int(sizes[:fits].sum())
            self._queue(Chunk(chunk.pubs[take], chunk.bodies[take], chunk.envelopes[take], size, logged))

    def resync(self) -> None:
        """Take the next deliveries from the store rather than from offers."""
        self.caught_up = False
        self.hub.session_taking(self)
        self._wake.set()

    def _queue(self, chunk: Chunk) -> None:
        self.pending.append(chunk)
        self.queued += len(chunk.pubs)
        self.queued_bytes += chunk.size
        self.hub.quotas.take(self.client, chunk.size)
        self.last_queued = int(chunk.pubs[-1])

    def forget(self) -> None:
        """The connection is gone: what it had queued goes back to its client's quota (it is still in
        the store)."""
        self.pending.clear()
        self.hub.quotas.release(self.client, self.queued_bytes)
        self.queued = self.queued_bytes = 0

    def acknowledge(self, seq: int) -> None:
        if self.acks and seq <= self.sent:
            self.hub.save_cursor(self.number, seq)

    async def run(self) -> None:
        """Push until the connection fails or the session is closed."""
        try:
            while not self.closed:
                if self.pending:
                    await self._send_some()
                elif not self.caught_up:
                    await self._refill()
                else:
                    self._wake.clear()
                    await self._wake.wait()
        finally:
            self.closed = True
            self.hub.detach(self)

    async def _send_some(self) -> None:
        pubs: list[int] = []
        bodies: list[bytes] = []
        envelopes: list[bytes] = []
        logged: list[np.ndarray] = []
        size = 0
        while self.pending and len(pubs) < SEND_BATCH and size < SEND_BYTES:
            chunk = self.pending.popleft()
            self.queued -= len(chunk.pubs)
            size += chunk.size
            pubs.extend(chunk.pubs.tolist())
            bodies.extend(chunk.bodies)
            envelopes.extend(chunk.envelopes)
            if chunk.logged is not None:
                logged.append(chunk.logged)
        last = pubs[-1]
        with self.watch.writing():
            await self._send(list(map(wrap, pubs, bodies, envelopes)) if self.envelope else bodies)
        self.queued_bytes -= size
        self.hub.quotas.release(self.client, size)
        self.hub.forwarded += len(pubs)
        if logged:
            self.hub.sent(logged)
            trace.mark("written", self.sent, last)
        self.sent = last
        if not self.acks:
            self.hub.save_cursor(self.number, self.sent)

    async def _refill(self) -> None:
        threads = self.hub.threads
        rows, watermark = await threads.read(threads.store.backlog, self.number, self.last_queued, QUEUE_LIMIT)
        taken = 0
        if rows:
            pubs, bodies, origins = zip(*rows, strict=True)
            envelopes = list(map(fields, origins))
            sizes = _sizes(list(bodies), envelopes)
            taken = fitting(sizes, min(self.hub.quotas.room(self.client), REFILL_BYTES), least=1)
            size = int(sizes[:taken].sum())
            self._queue(Chunk(np.array(pubs[:taken], np.int64), list(bodies[:taken]), envelopes[:taken], size))
        # Rows the hub handled after our snapshot were not offered to us: read again before going live.
        if taken == len(rows) < QUEUE_LIMIT and self.hub.last_seq <= watermark:
            self.caught_up = True
            self.hub.session_taking(self)

    async def close(self, error: bytes | None = None) -> None:
        """(Waiting at most END_LINE_WAIT for a client that does not read: whoever ends the session,
        an unsubscription or a newer connection, is not held up by it.)"""
        self.closed = True
        self._wake.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._close(error), END_LINE_WAIT)

    def number_of(self, sub_id: str) -> int:
        return self.number

    def let_go(self, sub_id: str) -> None:
        """The subscription is delivered through this connection no more (at once: `end` says why;
        the pusher is not woken, so that the line saying so is what the connection ends with)."""
        self.closed = True
        self.hub.detach(self)

    async def end(self, ended: Sequence[tuple[str, bytes | None]]) -> None:
        """The subscription leaves this connection (the hub's call for a session or a bundle alike:
        a session has one, so `ended` names it once)."""
        ((sub_id, error),) = ended
        self.let_go(sub_id)
        await self.close(error)


class DeliveryHub:
    def __init__(self, threads: StoreThreads, poll_interval: float = 0.005, quotas: Quotas | None = None) -> None:
        self.threads = threads
        self.poll_interval = poll_interval
        self.quotas = quotas or Quotas(UNLIMITED, UNLIMITED, UNLIMITED)
        self.holders: dict[str, Session | Bundle] = {}  # connected subscriptions, by id
        self._ending: set[asyncio.Future[None]] = set()  # connections being told that they end
        self._by_number: dict[int, Session] = {}
        self._bundles: dict[int, Bundle] = {}
        self._judged: tuple[float, Clients] = (-JUDGE_INTERVAL, Clients(0, 0, 0))  # when, what
        # indexed by subscription number: connected here; the key of its bundle (-1: a session of its
        # own); its place in the bundle
        self._connected = np.zeros(1024, bool)
        # connected and taking offers (caught up): only their matches are fanned out, so that a
        # client that reads nothing costs the hub nothing per feed entry
        self._taking = np.zeros(1024, bool)
        self._bundle_of = np.full(1024, -1, np.int64)
        self._place = np.zeros(1024, np.int64)
        self.last_seq = 0
        self._cursors: dict[int, int] = {}  # by subscription number
        self.forwarded = 0  # deliveries sent and not yet counted in the store
        self.latency = Histogram(LATENCY_BOUNDS)  # publish (logged) -> delivery (written to the connection), s
        self._sent: list[tuple[int, list[np.ndarray]]] = []  # (when, logged times) of sends not yet observed
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self.last_seq = await self.threads.read(self.threads.store.last_feed_seq)

    async def attach(self, session: Session) -> None:
        """Deliver the session's subscription through it from now on (not if a newer subscription of
        its id is connected here: the caller's check of the number finds it gone)."""
        if not self._replace([session.sub_id], [session.number])[0]:
            return
        self.holders[session.sub_id] = session
        self._by_number[session.number] = session
        self._grow(session.number + 1)
        self._connected[session.number] = True
        self._taking[session.number] = session.caught_up
        self._bundle_of[session.number] = -1

    async def attach_bundle(self, bundle: Bundle) -> None:
        """Deliver the bundle's subscriptions through it from now on (but those of which a newer
        subscription of the id is connected here: the caller's check of the numbers finds them gone).
        Nothing is awaited: no other connection attaches or ends in the middle."""
        kept = self._replace(bundle.ids, bundle.numbers.tolist())
        for sub_id, keep in zip(bundle.ids, kept, strict=True):
            if keep:
                self.holders[sub_id] = bundle
        self._bundles[bundle.key] = bundle
        places = np.flatnonzero(kept)
        attached = bundle.numbers[places]
        self._grow(int(bundle.numbers.max()) + 1)
        self._connected[attached] = True
        self._taking[attached] = bundle.live[places]
        self._bundle_of[attached] = bundle.key
        self._place[attached] = places

    def _replace(self, sub_ids: Sequence[str], numbers: Sequence[int]) -> list[bool]:
        """Make room for a new connection of these subscriptions: their previous connections here let
        go of them at once, and are told why in the background, one task and one write each (a client
        that does not read could hold up the attach; nothing may attach meanwhile). False for an id
        whose connection here is of a newer subscription."""
        kept: list[bool] = []
        endings: dict[int, tuple[Session | Bundle, list[tuple[str, bytes | None]]]] = {}
        for sub_id, number in zip(sub_ids, numbers, strict=True):
            previous = self.holders.get(sub_id)
            held = -1 if previous is None else previous.number_of(sub_id)
            kept.append(held <= number)
            if previous is None or held > number:
                continue
            previous.let_go(sub_id)
            # a holder of an earlier subscription of the id learns only that its own is gone, not that
            # the id was taken again and connected
            replaced = ProtocolError("subscriptionId", "replaced by a newer connection", 409)
            reason = (unknown("subscription") if held < number else replaced).to_json()
            endings.setdefault(id(previous), (previous, []))[1].append((sub_id, reason))
        for previous, ended in endings.values():
            self._end_in_background(previous, ended)
        return kept

    def _end_in_background(self, holder: Session | Bundle, ended: list[tuple[str, bytes | None]]) -> None:
        ending = asyncio.ensure_future(holder.end(ended))
        self._ending.add(ending)
        ending.add_done_callback(self._ending.discard)

    def detach(self, session: Session) -> None:
        if self.holders.get(session.sub_id) is session:
            del self.holders[session.sub_id]
            del self._by_number[session.number]
            self._connected[session.number] = False
            self._taking[session.number] = False

    def leave(self, bundle: Bundle, place: int) -> None:
        """One subscription of a bundle is no longer delivered through it; its cursor is kept."""
        sub_id = bundle.ids[place]
        if self.holders.get(sub_id) is bundle:
            del self.holders[sub_id]
            self._connected[bundle.numbers[place]] = False
            self._taking[bundle.numbers[place]] = False
            self._bundle_of[bundle.numbers[place]] = -1
        if bundle.cursor[place] > bundle.saved[place]:
            self.save_cursor(int(bundle.numbers[place]), int(bundle.cursor[place]))

    def detach_bundle(self, bundle: Bundle) -> None:
        for place in np.flatnonzero(bundle.open).tolist():
            self.leave(bundle, place)
        self._bundles.pop(bundle.key, None)

    def behind(self) -> int:
        """Connected subscriptions that are reading their backlog from the store instead of taking offers."""
        return sum(not session.caught_up for session in self._by_number.values()) + sum(
            bundle.behind() for bundle in self._bundles.values()
        )

    def judged_clients_behind(self) -> Clients:
        """`clients_behind` as judged at most JUDGE_INTERVAL ago: what publishes are refused by and the
        metrics show, the same view for both, without a walk over every connection per publish."""
        now = time.monotonic()
        if now - self._judged[0] >= JUDGE_INTERVAL:
            self._judged = (now, self.clients_behind())
        return self._judged[1]

    def clients_behind(self) -> Clients:
        """Clients behind, of the clients connected: a client is behind when most of its connected
        subscriptions read their backlog from the store instead of taking offers. Each client counts
        once, however many subscriptions and connections it has; connections whose client does not
        read what it is sent (a write waiting for it) do not count at all, so that clients that read
        nothing, however many identities they use, cannot make the broker refuse publishes: they are
        behind because of themselves, not because delivery cannot keep up."""
        now = time.monotonic()
        votes: dict[str, list[int]] = {}
        silent: set[str] = set()
        for holder, watch, behind, connected in (
            *((session.client, session.watch, int(not session.caught_up), 1) for session in self._by_number.values()),
            *(
                (bundle.client, bundle.watch, bundle.behind(), int(bundle.open.sum()))
                for bundle in self._bundles.values()
            ),
        ):
            if watch.not_reading(now):
                silent.add(holder.identity)
                continue
            vote = votes.setdefault(holder.identity, [0, 0])
            vote[0] += behind
            vote[1] += connected
        return Clients(
            sum(2 * behind > connected for behind, connected in votes.values()), len(votes), len(silent - votes.keys())
        )

    def queued(self) -> int:
        """Deliveries queued in memory for connected subscriptions."""
        return sum(session.queued for session in self._by_number.values()) + sum(
            bundle.queued for bundle in self._bundles.values()
        )

    def taking(self, numbers: np.ndarray, key: int, on: bool) -> None:
        """Whether these subscriptions of bundle `key` take offers (those it no longer holds are not its say)."""
        self._taking[numbers[self._bundle_of[numbers] == key]] = on

    def session_taking(self, session: Session) -> None:
        if self._by_number.get(session.number) is session:
            self._taking[session.number] = session.caught_up

    def _grow(self, size: int) -> None:
        if size > len(self._connected):
            size = max(size, 2 * len(self._connected))
            self._connected = np.concatenate([self._connected, np.zeros(size - len(self._connected), bool)])
            self._taking = np.concatenate([self._taking, np.zeros(size - len(self._taking), bool)])
            self._bundle_of = np.concatenate([self._bundle_of, np.full(size - len(self._bundle_of), -1, np.int64)])
            self._place = np.concatenate([self._place, np.zeros(size - len(self._place), np.int64)])

    def kick(self, sub_id: str, reason: bytes) -> None:
        """The subscription is delivered here no more, at once; its connection is told `reason` in the
        background (an unsubscription or the quarantine is not held up by a client that does not read)."""
        holder = self.holders.get(sub_id)
        if holder is not None:
            holder.let_go(sub_id)
            self._end_in_background(holder, [(sub_id, reason)])

    def save_cursor(self, number: int, pub: int) -> None:
        """(Saved unless the subscription has gone meanwhile: the store keeps only live numbers' cursors.)"""
        if pub > self._cursors.get(number, 0):
            self._cursors[number] = pub

    def unsaved_cursor(self, sub_id: str, number: int) -> int:
        holder = self.holders.get(sub_id)
        held = 0
        if isinstance(holder, Bundle) and holder.numbers[holder.place(sub_id)] == number:
            held = int(holder.cursor[holder.place(sub_id)])
        return max(self._cursors.get(number, 0), held)

    def _resync(self) -> None:
        for session in self._by_number.values():
            session.resync()
        for bundle in self._bundles.values():
            bundle.resync()

    async def poll(self) -> None:
        """Fan the pipeline's feed out to the connected subscriptions, entry by entry."""
        store = self.threads.store
        while not self._stopping.is_set():
            try:
                entries = await self.threads.read(store.feed_since, self.last_seq, 64)
                signalled = not entries and store.feed_signal
                signalled = signalled and await self.threads.wait(store.wait_for_feed, self.last_seq, FEED_WAIT)
            except Exception:  # the store unreachable for a moment: live delivery resumes with it
                log.exception("reading the feed failed; read again in %g s", FEED_RETRY)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), FEED_RETRY)
                continue
            if not entries:
                if not signalled:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), self.poll_interval)
                continue
            for entry in entries:
                if trace.DIRECTORY and len(entry.pubs):
                    trace.mark("notified", int(entry.pubs.min()) - 1, int(entry.pubs.max()))
                if entry.seq > self.last_seq + 1:
                    # rows this hub never offered went (another gateway's compaction spilled them while
                    # this one counted as gone): its subscriptions read their queues from the store again
                    self._resync()
                if self.holders:
                    try:
                        await self._fan_out(entry)
                    except Exception:
                        log.exception("fanning out feed entry %d failed; sessions re-read the store", entry.seq)
                        self._resync()
                self.last_seq = entry.seq

    async def _fan_out(self, entry: FeedEntry) -> None:
        self._grow(int(entry.sub_nos.max(initial=0)) + 1)
        mine = self._taking[entry.sub_nos]
        if not mine.any():
            return
        sub_nos, pubs = entry.sub_nos[mine], entry.pubs[mine]  # grouped by subscription already
        published, variants = await self.published(sub_nos, pubs, entry.cropped)
        known = variants >= 0  # publications compacted away meanwhile: nobody is owed them
        if not known.all():
            sub_nos, pubs, variants = sub_nos[known], pubs[known], variants[known]
        bundles = self._bundle_of[sub_nos]
        alone = bundles < 0
        if not alone.all():
            rows = np.flatnonzero(~alone)
            rows = rows[np.argsort(bundles[rows], kind="stable")]  # by bundle, each still by subscription
            keys = bundles[rows]
            cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
            for part in np.split(rows, cuts):
                bundle = self._bundles[int(bundles[part[0]])]
                bundle.offer(entry.seq, self._place[sub_nos[part]], pubs[part], variants[part], published)
            sub_nos, pubs, variants = sub_nos[alone], pubs[alone], variants[alone]
        if not len(sub_nos):
            return
        lows = np.flatnonzero(np.diff(sub_nos, prepend=-1))
        highs = [*lows[1:].tolist(), len(sub_nos)]
        totals = np.add.reduceat(published.sizes[variants], lows).tolist()  # bytes per session, at once
        sessions = self._by_number
        for number, low, high, size in zip(sub_nos[lows].tolist(), lows.tolist(), highs, totals, strict=True):
            session = sessions.get(number)
            if session is not None:
                chosen = variants[low:high]
                session.offer(
                    Chunk(
                        pubs[low:high], published.bodies[chosen].tolist(), published.envelopes[chosen].tolist(),
                        size, published.logged[chosen],
                    )
                )  # fmt: skip

    async def published(self, sub_nos: np.ndarray, pubs: np.ndarray, cropped: bool) -> tuple[Published, np.ndarray]:
        """What the matches (sorted by subscription, then publication) deliver, once per variant, and
        each match's variant (-1: compacted away): the publication's bytes, or where the pipeline
        cropped it for the subscription (`cropped`: it may have), its copy."""
        store = self.threads.store
        wanted = np.unique(pubs)
        found = await self.threads.read(store.bodies, wanted)
        looked_up = [found.get(pub, (b"", None, 0)) for pub in wanted.tolist()]  # no origin: compacted
        bodies = [body for body, _, _ in looked_up]
        envelopes = [b"" if origin is None else fields(origin) for _, origin, _ in looked_up]
        logged = [at for _, _, at in looked_up]
        variants = np.searchsorted(wanted, pubs)
        if len(found) < len(wanted):
            missing = np.array([origin is None for _, origin, _ in looked_up])
            variants[missing[variants]] = -1
        variant_pubs = wanted.tolist()
        if cropped:
            copies = await self.threads.read(store.copies, sub_nos, pubs)
            for (sub_no, pub), copy in copies.items():  # pairs are sorted by (subscription, publication)
                low, high = np.searchsorted(sub_nos, [sub_no, sub_no + 1])
                at = low + int(np.searchsorted(pubs[low:high], pub))
                variants[at] = len(bodies)
                bodies.append(copy)
                envelopes.append(fields(found[pub][1]._replace(cropped=True)))
                logged.append(found[pub][2])
                variant_pubs.append(pub)
        published = Published(
            np.array(variant_pubs, np.int64), _objects(bodies), _objects(envelopes), np.array(logged, np.int64),
            _sizes(bodies, envelopes),
        )  # fmt: skip
        return published, variants

    def sent(self, logged: list[np.ndarray]) -> None:
        """Deliveries of publications logged at these times (ms) were sent now. Observed later, in
        bulk (`observe_latency`): a send to one subscriber costs an append, not a histogram update."""
        self._sent.append((time.time_ns() // 1_000_000, logged))

    def observe_latency(self) -> None:
        if not self._sent:
            return
        sent, self._sent = self._sent, []
        at = np.concatenate([times for _, arrays in sent for times in arrays])
        when = np.repeat([moment for moment, _ in sent], [sum(map(len, arrays)) for _, arrays in sent])
        known = at > 0  # 0: a store too old to have logged the time
        since = np.maximum(when[known] - at[known], 0)  # clocks of other gateways may be ahead
        self.latency.observe(since / 1000)

    async def save_cursors_periodically(self, interval: float = 0.1) -> None:
        for tick in itertools.count(1):
            if self._stopping.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
            await self.flush_cursors(bundles=tick % BUNDLE_CURSOR_TICKS == 0)

    async def flush_cursors(self, bundles: bool = True) -> None:
        """Save the cursors that moved, and count the deliveries sent since the last flush (and
        observe their latencies). A bundle's cursors are saved less often (`BUNDLE_CURSOR_TICKS`):
        thousands of them move with every write, and its client resumes by the position it gives."""
        self.observe_latency()
        if bundles:
            for bundle in self._bundles.values():
                self._cursors.update(bundle.cursor_changes())
        if self._cursors or self.forwarded:
            cursors, self._cursors = self._cursors, {}
            forwarded, self.forwarded = self.forwarded, 0
            try:
                await self.threads.write(self.threads.store.save_cursors, cursors, forwarded)
            except Exception:
                log.exception("saving cursors failed; they are retried")
                self.forwarded += forwarded
                for number, pub in cursors.items():
                    self.save_cursor(number, pub)

    async def stop(self) -> None:
        """(Every connection is closed at once: each waits up to a second for a client that does not read.)"""
        self._stopping.set()
        bundles = list(self._bundles.values())
        await asyncio.gather(*(s.close(None) for s in list(self._by_number.values())), *(b.close() for b in bundles))
        for bundle in bundles:
            self.detach_bundle(bundle)
        await self.flush_cursors()


def _sizes(bodies: list[bytes], envelopes: list[bytes]) -> np.ndarray:
    """The bytes of each delivery line but its subscription ids."""
    count = len(bodies)
    body_sizes = np.fromiter(map(len, bodies), np.int64, count)
    return body_sizes + np.fromiter(map(len, envelopes), np.int64, count) + LINE_BYTES


def _objects(items: list[bytes]) -> np.ndarray:
    """An object array of bytes (np.array would make fixed-width bytes of them)."""
    array = np.empty(len(items), object)
    array[:] = items
    return array
