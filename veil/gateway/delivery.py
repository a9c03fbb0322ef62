"""Delivery sessions: per-subscription queues pushed to connected clients, in order, once.

The hub polls the store for new deliveries, or waits for its signal where it has one, and offers
them (in the order the pipeline queued them) to the sessions of connected subscriptions. A session
that falls behind, or has just connected, stops taking offers and reads its backlog from the store
instead, so memory per session stays bounded and a disconnected subscription loses nothing. Cursors
(the last publication delivered, or acknowledged when the client asked for acks) are saved in
batches; a reconnect resumes after the cursor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from veil.gateway.channel import Close, Send
from veil.gateway.store_threads import StoreThreads
from veil.monitoring import trace
from veil.monitoring.histogram import LATENCY_BOUNDS, Histogram
from veil.protocol import Handshake, ProtocolError
from veil.protocol.envelope import fields, wrap
from veil.store.base import FeedEntry

if TYPE_CHECKING:
    from veil.gateway.multiplex import Mux

log = logging.getLogger("veil.gateway")

QUEUE_LIMIT = 2048
SEND_BATCH = 512
FEED_WAIT = 0.5  # seconds the hub waits for a store's signal of new deliveries before it looks again


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
        mux: Mux | None = None,
    ) -> None:
        self.hub = hub
        self.mux = mux  # the connection's writer when it carries many subscriptions
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
        self.caught_up = False
        self.closed = False
        self._wake = asyncio.Event()

    def offer(self, chunk: Chunk) -> None:
        if not self.caught_up or self.closed:
            return
        skip = int(np.searchsorted(chunk.pubs, self.last_queued, side="right"))
        room = QUEUE_LIMIT - self.queued
        if len(chunk.pubs) - skip > room:
            self.caught_up = False  # the rest waits in the store; the session refills from there
        take = slice(skip, skip + min(room, len(chunk.pubs) - skip))
        if take.stop > take.start:
            logged = None if chunk.logged is None else chunk.logged[take]
            self._queue(Chunk(chunk.pubs[take], chunk.bodies[take], chunk.envelopes[take], logged))
        self._wake.set()

    def resync(self) -> None:
        """Take the next deliveries from the store rather than from offers."""
        self.caught_up = False
        self._wake.set()

    def _queue(self, chunk: Chunk) -> None:
        self.pending.append(chunk)
        self.queued += len(chunk.pubs)
        self.last_queued = int(chunk.pubs[-1])

    def acknowledge(self, seq: int) -> None:
        if self.mux is not None:  # on a multiplexed connection an ack covers all that was sent before it
            seq = min(seq, self.sent)
        if self.acks and seq <= self.sent:
            self.hub.save_cursor(self.sub_id, seq)

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
        while self.pending and len(pubs) < SEND_BATCH:
            chunk = self.pending.popleft()
            self.queued -= len(chunk.pubs)
            pubs.extend(chunk.pubs.tolist())
            bodies.extend(chunk.bodies)
            envelopes.extend(chunk.envelopes)
            if chunk.logged is not None:
                logged.append(chunk.logged)
        last = pubs[-1]
        if self.mux is not None:
            await self.mux.send(self.sub_id, pubs, bodies, envelopes)
        elif self.envelope:
            await self._send(list(map(wrap, pubs, bodies, envelopes)))
        else:
            await self._send(bodies)
        self.hub.forwarded += len(pubs)
        if logged:
            self.hub.sent(logged)
            trace.mark("written", self.sent, last)
        self.sent = last
        if not self.acks:
            self.hub.save_cursor(self.sub_id, self.sent)

    async def _refill(self) -> None:
        threads = self.hub.threads
        rows, watermark = await threads.read(threads.store.backlog, self.sub_id, self.last_queued, QUEUE_LIMIT)
        if rows:
            pubs, bodies, origins = zip(*rows, strict=True)
            self._queue(Chunk(np.array(pubs, np.int64), list(bodies), list(map(fields, origins))))
        # Rows the hub handled after our snapshot were not offered to us: read again before going live.
        if len(rows) < QUEUE_LIMIT and self.hub.last_seq <= watermark:
            self.caught_up = True

    async def close(self, error: bytes | None = None) -> None:
        self.closed = True
        self._wake.set()
        with contextlib.suppress(Exception):
            await self._close(error)


class DeliveryHub:
    def __init__(self, threads: StoreThreads, poll_interval: float = 0.005) -> None:
        self.threads = threads
        self.poll_interval = poll_interval
        self.sessions: dict[str, Session] = {}
        self._by_number: dict[int, Session] = {}
        self._connected = np.zeros(1024, bool)  # indexed by subscription number
        self.last_seq = 0
        self._cursors: dict[str, int] = {}
        self.forwarded = 0  # deliveries sent and not yet counted in the store
        self.latency = Histogram(LATENCY_BOUNDS)  # publish (logged) -> delivery (written to the connection), s
        self._sent: list[tuple[int, list[np.ndarray]]] = []  # (when, logged times) of sends not yet observed
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self.last_seq = await self.threads.read(self.threads.store.last_feed_seq)

    async def attach(self, session: Session) -> None:
        previous = self.sessions.get(session.sub_id)
        self.sessions[session.sub_id] = session
        self._by_number[session.number] = session
        self._grow(session.number + 1)
        self._connected[session.number] = True
        if previous is not None:
            await previous.close(ProtocolError("subscriptionId", "replaced by a newer connection", 409).to_json())

    def detach(self, session: Session) -> None:
        if self.sessions.get(session.sub_id) is session:
            del self.sessions[session.sub_id]
            del self._by_number[session.number]
            self._connected[session.number] = False

    def behind(self) -> int:
        """Connected sessions that are reading their backlog from the store instead of taking offers."""
        return sum(not session.caught_up for session in self.sessions.values())

    def _grow(self, size: int) -> None:
        if size > len(self._connected):
            grown = np.zeros(max(size, 2 * len(self._connected)), bool)
            grown[: len(self._connected)] = self._connected
            self._connected = grown

    async def kick(self, sub_id: str, reason: bytes) -> None:
        session = self.sessions.get(sub_id)
        self._cursors.pop(sub_id, None)
        if session is not None:
            self.detach(session)
            await session.close(reason)

    def save_cursor(self, sub_id: str, pub: int) -> None:
        if pub > self._cursors.get(sub_id, 0):
            self._cursors[sub_id] = pub

    def unsaved_cursor(self, sub_id: str) -> int:
        return self._cursors.get(sub_id, 0)

    async def poll(self) -> None:
        """Fan the pipeline's feed out to the connected sessions, batch by batch."""
        store = self.threads.store
        while not self._stopping.is_set():
            entries = await self.threads.read(store.feed_since, self.last_seq, 64)
            if not entries:
                if not (store.feed_signal and await self.threads.wait(store.wait_for_feed, self.last_seq, FEED_WAIT)):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), self.poll_interval)
                continue
            for entry in entries:
                if trace.DIRECTORY and len(entry.pubs):
                    trace.mark("notified", int(entry.pubs.min()) - 1, int(entry.pubs.max()))
                if entry.seq > self.last_seq + 1:
                    # rows this hub never offered went (another gateway's compaction spilled them while
                    # this one counted as gone): its sessions read their queues from the store again
                    for session in self.sessions.values():
                        session.resync()
                if self._by_number:
                    try:
                        await self._fan_out(entry)
                    except Exception:
                        log.exception("fanning out feed entry %d failed; sessions re-read the store", entry.seq)
                        for session in self.sessions.values():
                            session.resync()
                self.last_seq = entry.seq

    async def _fan_out(self, entry: FeedEntry) -> None:
        self._grow(int(entry.sub_nos.max(initial=0)) + 1)
        mine = self._connected[entry.sub_nos]
        if not mine.any():
            return
        sub_nos, pubs = entry.sub_nos[mine], entry.pubs[mine]  # grouped by subscription already
        wanted = np.unique(pubs)
        store = self.threads.store
        found = await self.threads.read(store.bodies, wanted)
        rows = np.searchsorted(wanted, pubs)
        looked_up = [found.get(pub, (None, None, 0)) for pub in wanted.tolist()]
        bodies = np.array([body for body, _, _ in looked_up], object)[rows]
        envelopes = np.array([b"" if origin is None else fields(origin) for _, origin, _ in looked_up], object)[rows]
        logged = np.array([at for _, _, at in looked_up], np.int64)[rows]
        if len(found) < len(wanted):  # publications compacted away meanwhile: nobody is owed them
            kept = bodies != None  # noqa: E711 (elementwise on an object array)
            sub_nos, pubs, bodies, envelopes, logged = (
                sub_nos[kept], pubs[kept], bodies[kept], envelopes[kept], logged[kept]
            )  # fmt: skip
            if not len(pubs):
                return
        if entry.cropped:
            copies = await self.threads.read(store.copies, sub_nos, pubs)
            for (sub_no, pub), copy in copies.items():  # pairs are sorted by (subscription, publication)
                low, high = np.searchsorted(sub_nos, [sub_no, sub_no + 1])
                at = low + int(np.searchsorted(pubs[low:high], pub))
                bodies[at], envelopes[at] = copy, fields(found[pub][1]._replace(cropped=True))
        cuts = np.flatnonzero(np.diff(sub_nos)) + 1
        for low, high in zip([0, *cuts.tolist()], [*cuts.tolist(), len(sub_nos)], strict=True):
            session = self._by_number.get(int(sub_nos[low]))
            if session is not None:
                session.offer(
                    Chunk(pubs[low:high], bodies[low:high].tolist(), envelopes[low:high].tolist(), logged[low:high])
                )

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
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
            await self.flush_cursors()

    async def flush_cursors(self) -> None:
        """Save the cursors that moved, and count the deliveries sent since the last flush (and
        observe their latencies)."""
        self.observe_latency()
        if self._cursors or self.forwarded:
            cursors, self._cursors = self._cursors, {}
            forwarded, self.forwarded = self.forwarded, 0
            try:
                await self.threads.write(self.threads.store.save_cursors, cursors, forwarded)
            except Exception:
                log.exception("saving cursors failed; they are retried")
                self.forwarded += forwarded
                for sub_id, pub in cursors.items():
                    self.save_cursor(sub_id, pub)

    async def stop(self) -> None:
        self._stopping.set()
        for session in list(self.sessions.values()):
            await session.close(None)
        await self.flush_cursors()
