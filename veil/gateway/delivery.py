"""The delivery hub: the pipeline's feed fanned out to the connected subscriptions, in order, once.

The hub polls the store for new deliveries, or waits for its signal where it has one, and offers
them (in the order the pipeline queued them) to the bundles (`bundle`) of the delivery connections
that hold the subscriptions. A subscription that falls behind, or has just connected, stops taking
offers and reads its backlog from the store instead, so memory per connection stays bounded and a
disconnected subscription loses nothing. Cursors (the last publication delivered, or acknowledged
when the client asked for acks) are saved in batches; a reconnect resumes after the cursor.

Everything a connection reads, is offered or saves goes by the subscription's number, not its id: an
id freed by an unsubscription and taken again is a new subscription with a new number, so nothing of
the old one (queued, in the feed, a cursor) reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import NamedTuple

import numpy as np

from veil.gateway.bundle import QUEUE_LIMIT, Backlog, Bundle, Published, Sent, line_sizes, variant_ranks
from veil.gateway.quotas import UNLIMITED, Quotas
from veil.gateway.store_threads import StoreThreads
from veil.monitoring import trace
from veil.monitoring.histogram import LATENCY_BOUNDS, Histogram
from veil.protocol import ProtocolError
from veil.protocol.envelope import fields
from veil.protocol.errors import unknown
from veil.store.base import FeedEntry
from veil.store.queues import uniques

log = logging.getLogger("veil.gateway")

BUNDLE_CURSOR_TICKS = 10  # cursor flushes per save of multiplexed connections' cursors
FEED_WAIT = 0.5  # seconds the hub waits for a store's signal of new deliveries before it looks again
FEED_RETRY = 1.0  # seconds before the feed is read again after the store failed
JUDGE_INTERVAL = 0.1  # seconds a judgement of which clients are behind stands
BACKLOG_READ = 1 << 18  # deliveries the connections' backlog reads gathered into one may ask for, at most
# matches a run of feed entries offered as one holds, at most (an entry alone may hold more): each
# multiplexed connection takes its share of a run at once, and one whose queue or quota has no room for
# it reads the store instead (at 20,000 subscriptions on 18 connections, runs of up to 64 entries of
# over 100,000 matches each sent most connections to the store: 2-8 times the gateway's CPU per delivery)
RUN_MATCHES = 1 << 16


class Clients(NamedTuple):
    """The hub's judgement of its clients (identities with a delivery connection)."""

    behind: int  # of those connected, the ones most of whose subscriptions read their backlog from the store
    connected: int  # the ones with a connection whose client reads what it is sent
    not_reading: int  # the others: every connection of theirs has a write waiting for its client


class Unsaved(NamedTuple):
    """What the hub has not saved yet, by subscription number: cursors, and publications groups'
    members acknowledged past them."""

    cursors: dict[int, int]
    acked: dict[int, list[int]]


class Asked(NamedTuple):
    """A connection's read of its subscriptions' backlogs, waiting to be gathered (`DeliveryHub.backlog`)."""

    numbers: np.ndarray
    afters: np.ndarray
    limit: int
    since: int
    found: asyncio.Future[Backlog]


class DeliveryHub:
    def __init__(self, threads: StoreThreads, poll_interval: float = 0.005, quotas: Quotas | None = None) -> None:
        self.threads = threads
        self.poll_interval = poll_interval
        self.quotas = quotas or Quotas(UNLIMITED, UNLIMITED, UNLIMITED)
        self.holders: dict[str, Bundle] = {}  # connected subscriptions' connections, by id
        self._ending: set[asyncio.Future[None]] = set()  # connections being told that they end
        self._bundles: dict[int, Bundle] = {}  # by key
        self._judged: tuple[float, Clients] = (-JUDGE_INTERVAL, Clients(0, 0, 0))  # when, what
        # indexed by subscription number: connected and taking offers (caught up): only their matches
        # are fanned out, so that a client that reads nothing costs the hub nothing per feed entry;
        # the key of the bundle holding it here (-1: none); whether that is a connection of one (its
        # offers go one connection at a time, without arrays); its place in the bundle
        self._taking = np.zeros(1024, bool)
        self._bundle_of = np.full(1024, -1, np.int64)
        self._alone = np.zeros(1024, bool)
        self._place = np.zeros(1024, np.int64)
        self.last_seq = 0  # the feed entry fanned out last
        self.offering = 0  # the entry being fanned out (its subscriptions chosen, its bodies read), or the last
        self._cursors: dict[int, int] = {}  # by subscription number
        # groups' publications acknowledged past their cursors, by subscription number, to be saved;
        # and the saves under way (cursors, acknowledged): a connection admitted meanwhile must not
        # miss what they hold
        self._acked: dict[int, list[int]] = {}
        self._saving: list[tuple[dict[int, int], dict[int, list[int]]]] = []
        self._flushing = asyncio.Lock()  # one save at a time: a flush that succeeds saved all before it
        # subscriptions whose group a member joins or dissolves: the lock, and how many hold or wait for it
        self.forming: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self.forwarded = 0  # deliveries sent and not yet counted in the store
        self.latency = Histogram(LATENCY_BOUNDS)  # publish (logged) -> delivery (written to the connection), s
        self._sent: list[tuple[int, list[Sent]]] = []  # (when, logged times) of sends not yet observed
        self._stopping = asyncio.Event()
        # connections' reads of their backlogs, and whether one may start: the queues' bounds are
        # applied after what each has read, which must not move meanwhile (`bound_backlogs`)
        self._refills = 0
        self._no_refills = asyncio.Event()
        self._may_refill = asyncio.Event()
        self._may_refill.set()
        self._asked: list[Asked] = []  # backlog reads waiting to be gathered, and the task reading them
        self._reading: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.last_seq = self.offering = await self.threads.read(self.threads.store.last_feed_seq)

    def attach(self, bundle: Bundle) -> None:
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
        self._taking[attached] = bundle.live[places]
        self._bundle_of[attached] = bundle.key
        self._alone[attached] = not bundle.multiplexed
        self._place[attached] = places

    def _replace(self, sub_ids: Sequence[str], numbers: Sequence[int]) -> list[bool]:
        """Make room for a new connection of these subscriptions: their previous connections here let
        go of them at once, and are told why in the background, one task and one write each (a client
        that does not read could hold up the attach; nothing may attach meanwhile). False for an id
        whose connection here is of a newer subscription."""
        kept: list[bool] = []
        endings: dict[int, tuple[Bundle, list[tuple[str, bytes | None]]]] = {}
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
            endings.setdefault(previous.key, (previous, []))[1].append((sub_id, reason))
        for previous, ended in endings.values():
            self._end_in_background(previous, ended)
        return kept

    def _end_in_background(self, holder: Bundle, ended: list[tuple[str, bytes | None]]) -> None:
        ending = asyncio.ensure_future(holder.end(ended))
        self._ending.add(ending)
        ending.add_done_callback(self._ending.discard)

    def leave(self, bundle: Bundle, place: int) -> None:
        """One subscription of a bundle is no longer delivered through it; its cursor is kept."""
        sub_id = bundle.ids[place]
        number = int(bundle.numbers[place])
        if self.holders.get(sub_id) is bundle:
            del self.holders[sub_id]
            self._taking[number] = False
            self._bundle_of[number] = -1
            self._alone[number] = False
        # (a connection of one handed its cursor over as it moved)
        if bundle.multiplexed and bundle.cursor[place] > bundle.saved[place]:
            self.save_cursor(number, int(bundle.cursor[place]))

    def detach(self, bundle: Bundle) -> None:
        """The bundle's connection is gone."""
        for place in np.flatnonzero(bundle.open).tolist():
            self.leave(bundle, place)
        self._bundles.pop(bundle.key, None)

    def behind(self) -> int:
        """Connected subscriptions that are reading their backlog from the store instead of taking offers."""
        return sum(bundle.standing()[0] for bundle in self._bundles.values())

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
        for bundle in self._bundles.values():
            behind, connected = bundle.standing()
            if not connected:  # (let go of all its subscriptions, not yet gone)
                continue
            identity = bundle.client.identity
            if bundle.watch.not_reading(now):
                silent.add(identity)
                continue
            vote = votes.setdefault(identity, [0, 0])
            vote[0] += behind
            vote[1] += connected
        return Clients(
            sum(2 * behind > connected for behind, connected in votes.values()), len(votes), len(silent - votes.keys())
        )

    @contextlib.asynccontextmanager
    async def refilling(self) -> AsyncIterator[None]:
        """A connection reads its backlog from the store (not while the queues' bounds are applied)."""
        await self._may_refill.wait()
        self._refills += 1
        try:
            yield
        finally:
            self._refills -= 1
            if not self._refills:
                self._no_refills.set()

    async def bound_backlogs(self, bound: Callable[[dict[int, int]], Awaitable[object]]) -> None:
        """Apply the queues' bounds (`bound`) to the subscriptions connected here that read their
        backlog from the store, each after what its connection has read of it, while none reads more."""
        self._may_refill.clear()
        try:
            while self._refills:
                self._no_refills.clear()
                await self._no_refills.wait()
            floors: dict[int, int] = {}
            for bundle in self._bundles.values():
                places = np.flatnonzero(bundle.open & ~bundle.live)
                floors.update(zip(bundle.numbers[places].tolist(), bundle.last_queued[places].tolist(), strict=True))
            if floors:
                await bound(floors)
        finally:
            self._may_refill.set()

    async def backlog(self, numbers: np.ndarray, afters: np.ndarray, limit: int, since: int) -> Backlog:
        """These subscriptions' backlogs (`GatewayStore.backlogs`: each after its own publication, at
        most `limit` each, the unspilled feed from seq `since` on) and what they deliver. The reads
        connections ask for while one is under way are made together: one statement per table and one
        pass over the feed's rows for all of them, where hundreds of connections that fell behind
        together would each scan the same rows and read the same bodies."""
        found: asyncio.Future[Backlog] = asyncio.get_running_loop().create_future()
        self._asked.append(Asked(numbers, afters, limit, since, found))
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._read_backlogs())
        return await found

    async def _read_backlogs(self) -> None:
        while self._asked:
            gathered: list[Asked] = []
            later: list[Asked] = []
            numbers: set[int] = set()
            size = 0
            for asked in self._asked:
                if asked.found.done():  # (its connection went meanwhile)
                    continue
                mine = asked.numbers.tolist()
                # a subscription asked for twice (its old connection still reading as a new one
                # attached) is read again after; and a read holds about BACKLOG_READ deliveries
                if gathered and (size + len(mine) * asked.limit > BACKLOG_READ or not numbers.isdisjoint(mine)):
                    later.append(asked)
                    continue
                gathered.append(asked)
                numbers.update(mine)
                size += len(mine) * asked.limit
            self._asked = later
            if not gathered:
                continue
            try:
                backlogs = await self._read_together(gathered)
            except Exception as error:  # each connection fails as its own read would have
                for asked in gathered:
                    if not asked.found.done():
                        asked.found.set_exception(error)
                continue
            for asked, backlog in zip(gathered, backlogs, strict=True):
                if not asked.found.done():
                    asked.found.set_result(backlog)

    async def _read_together(self, gathered: list[Asked]) -> list[Backlog]:
        """One read of the gathered backlogs, split by who asked."""
        store = self.threads.store
        numbers = np.concatenate([asked.numbers for asked in gathered])
        afters = np.concatenate([asked.afters for asked in gathered])
        limits = np.repeat([asked.limit for asked in gathered], [len(asked.numbers) for asked in gathered])
        since = min(asked.since for asked in gathered)
        sub_nos, pubs, watermark, reached = await self.threads.read(store.backlogs, numbers, afters, limits, since)
        published, variants = await self.published(sub_nos, pubs, cropped=True) if len(pubs) else (_NONE, pubs)
        if len(gathered) == 1:
            return [Backlog(sub_nos, pubs, watermark, reached, published, variants)]
        # whose each match is (the matches are sorted by subscription; a stable sort keeps each
        # connection's so)
        askers = np.repeat(np.arange(len(gathered)), [len(asked.numbers) for asked in gathered])
        order = np.argsort(numbers)
        whose = askers[order][np.searchsorted(numbers[order], sub_nos)]
        by_asker = np.argsort(whose, kind="stable")
        cuts = np.searchsorted(whose[by_asker], np.arange(1, len(gathered)))
        return [
            Backlog(sub_nos[rows], pubs[rows], watermark, reached, published, variants[rows])
            for rows in np.split(by_asker, cuts)
        ]

    def queued(self) -> int:
        """Deliveries queued in memory for connected subscriptions."""
        return sum(bundle.queued for bundle in self._bundles.values())

    def taking(self, numbers: np.ndarray, key: int, on: bool) -> None:
        """Whether these subscriptions of bundle `key` take offers (those it no longer holds are not its say)."""
        self._taking[numbers[self._bundle_of[numbers] == key]] = on

    def _grow(self, size: int) -> None:
        if size > len(self._taking):
            size = max(size, 2 * len(self._taking))
            grown = size - len(self._taking)
            self._taking = np.concatenate([self._taking, np.zeros(grown, bool)])
            self._bundle_of = np.concatenate([self._bundle_of, np.full(grown, -1, np.int64)])
            self._alone = np.concatenate([self._alone, np.zeros(grown, bool)])
            self._place = np.concatenate([self._place, np.zeros(grown, np.int64)])

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

    def save_acked(self, number: int, pubs: list[int]) -> None:
        """A group's members acknowledged these past its cursor (saved with the cursors; none: its
        cursor moved, over some saved before)."""
        self._acked.setdefault(number, []).extend(pubs)

    def unsaved(self) -> Unsaved:
        """Cursors and groups' acknowledgements not in the store yet (to be saved, or being saved).
        Taken before the store is read, what is saved meanwhile is in one or the other."""
        cursors = dict(self._cursors)
        acked = {number: list(pubs) for number, pubs in self._acked.items()}
        for saving, saving_acked in self._saving:
            for number, pub in saving.items():
                cursors[number] = max(cursors.get(number, 0), pub)
            for number, pubs in saving_acked.items():
                acked.setdefault(number, []).extend(pubs)
        return Unsaved(cursors, acked)

    def held_cursor(self, sub_id: str, number: int) -> int:
        """The cursor of the subscription's connection here, if one holds it (0: none)."""
        holder = self.holders.get(sub_id)
        if holder is not None and holder.number_of(sub_id) == number:
            return int(holder.cursor[holder.place(sub_id)])
        return 0

    def _resync(self) -> None:
        for bundle in self._bundles.values():
            bundle.resync()

    async def poll(self) -> None:
        """Fan the pipeline's feed out to the connected subscriptions, the entries read together in
        runs offered as one (`_consecutive`, `_merged`): a hub that fell behind the pipeline's rounds
        catches up with one read of bodies and one write per connection a run, not one per round."""
        store = self.threads.store
        look = True  # whether the feed may hold rows after last_seq: a signalling store says when
        known = self.last_seq  # the feed's last row as last heard, before the read below
        while not self._stopping.is_set():
            try:
                entries = await self.threads.read(store.feed_since, self.last_seq, 64) if look else []
                if not entries and store.feed_signal:
                    if look and known > self.last_seq:
                        # rows it knew of were read as none: another gateway's compaction spilled them
                        # while this one counted as gone, and its subscriptions read their queues again
                        self._resync()
                        self.last_seq = self.offering = known
                    known = await self.threads.wait(store.wait_for_feed, self.last_seq, FEED_WAIT)
                    look = known > self.last_seq
            except Exception:  # the store unreachable for a moment: live delivery resumes with it
                log.exception("reading the feed failed; read again in %g s", FEED_RETRY)
                look = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), FEED_RETRY)
                continue
            if not entries:
                if not store.feed_signal:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), self.poll_interval)
                continue
            for run in _consecutive(entries):
                if trace.DIRECTORY:
                    for entry in run:
                        if len(entry.pubs):
                            trace.mark("notified", int(entry.pubs.min()) - 1, int(entry.pubs.max()))
                if run[0].seq > self.last_seq + 1:
                    # rows this hub never offered went (another gateway's compaction spilled them while
                    # this one counted as gone): its subscriptions read their queues from the store again
                    self._resync()
                self.offering = run[-1].seq
                if self.holders:
                    try:
                        await self._fan_out(_merged(run))
                    except Exception:
                        log.exception("fanning out feed entries up to %d failed; they re-read the store", run[-1].seq)
                        self._resync()
                self.last_seq = run[-1].seq

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
        # (looked up after the await: connections that left or stopped taking offers meanwhile are
        # offered nothing)
        keys = np.where(self._taking[sub_nos], self._bundle_of[sub_nos], -1)
        alone = self._alone[sub_nos]
        together = ~alone & (keys >= 0)
        if together.any():
            rows = np.flatnonzero(together)
            rows = rows[np.argsort(keys[rows], kind="stable")]  # by bundle, each still by subscription
            cuts = np.flatnonzero(keys[rows[1:]] != keys[rows[:-1]]) + 1
            for part in np.split(rows, cuts):
                bundle = self._bundles[int(keys[part[0]])]
                bundle.offer(entry.seq, self._place[sub_nos[part]], pubs[part], variants[part], published)
        alone &= keys >= 0
        if not alone.any():
            return
        if not alone.all():
            sub_nos, pubs, variants, keys = sub_nos[alone], pubs[alone], variants[alone], keys[alone]
        # a connection of one at a time, as it is the common case: a slice and an append each
        # (what a connection of one compares, per connection at once and as plain ints)
        lows = np.flatnonzero(np.diff(sub_nos, prepend=-1))
        ends = np.r_[lows[1:], len(sub_nos)]
        totals = np.add.reduceat(published.sizes[variants], lows).tolist()  # bytes per connection
        bundles, seq = self._bundles, entry.seq
        bodies, envelopes, logged = published.bodies, published.envelopes, published.logged
        for key, low, high, first, last, size in zip(
            keys[lows].tolist(), lows.tolist(), ends.tolist(), pubs[lows].tolist(), pubs[ends - 1].tolist(), totals,
            strict=True,
        ):  # fmt: skip
            chosen = variants[low:high]
            bundles[key].offer_one(
                seq, first, last, pubs[low:high], bodies[chosen].tolist(), envelopes[chosen].tolist(), size,
                logged[chosen],
            )  # fmt: skip

    async def published(self, sub_nos: np.ndarray, pubs: np.ndarray, cropped: bool) -> tuple[Published, np.ndarray]:
        """What the matches (sorted by subscription, then publication) deliver, once per variant, and
        each match's variant (-1: compacted away): the publication's bytes, or where the pipeline
        cropped it for the subscription (`cropped`: it may have), its copy."""
        store = self.threads.store
        wanted, variants = uniques(pubs)
        found = await self.threads.read(store.bodies, wanted)
        looked_up = [found.get(pub, (b"", None, 0)) for pub in wanted.tolist()]  # no origin: compacted
        bodies = [body for body, _, _ in looked_up]
        envelopes = [b"" if origin is None else fields(origin) for _, origin, _ in looked_up]
        logged = [at for _, _, at in looked_up]
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
        offsets = np.array(variant_pubs, np.int64)
        published = Published(
            offsets, _objects(bodies), _objects(envelopes), np.array(logged, np.int64), line_sizes(bodies, envelopes),
            variant_ranks(offsets),
        )  # fmt: skip
        return published, variants

    def sent(self, logged: list[Sent]) -> None:
        """Deliveries of publications logged at these times (ms) were sent now, as many of each as
        its count says (None: one each). Observed later, in bulk (`observe_latency`): a send to one
        subscriber costs an append, not a histogram update, and a line to a thousand subscriptions
        one latency weighed a thousand, not a thousand latencies."""
        self._sent.append((time.time_ns() // 1_000_000, logged))

    def observe_latency(self) -> None:
        if not self._sent:
            return
        sent, self._sent = self._sent, []
        lines = [line for _, group in sent for line in group]
        at = np.concatenate([times for times, _ in lines])
        when = np.repeat([moment for moment, _ in sent], [sum(len(times) for times, _ in group) for _, group in sent])
        known = at > 0  # 0: a store too old to have logged the time
        since = np.maximum(when[known] - at[known], 0)  # clocks of other gateways may be ahead
        if all(count is None for _, count in lines):  # connections of one alone: no counts to make
            self.latency.observe(since / 1000)
        else:
            ones = (np.ones(len(times), np.int64) if count is None else count for times, count in lines)
            self.latency.observe(since / 1000, np.concatenate(list(ones))[known])

    async def save_cursors_periodically(self, interval: float = 0.1) -> None:
        for tick in itertools.count(1):
            if self._stopping.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
            await self.flush_cursors(bundles=tick % BUNDLE_CURSOR_TICKS == 0)

    async def flush_cursors(self, bundles: bool = True) -> bool:
        """Save the cursors that moved, and count the deliveries sent since the last flush (and
        observe their latencies). A multiplexed connection's cursors are saved less often
        (`BUNDLE_CURSOR_TICKS`): thousands of them move with every write, and its client resumes by the
        position it gives. (A connection of one hands its cursor over as it moves.) One flush at a
        time: True says that every cursor handed over before the call is saved, those of a save
        under way then included (a failed one hands them back to this one)."""
        async with self._flushing:
            return await self._flush_cursors(bundles)

    async def _flush_cursors(self, bundles: bool) -> bool:
        self.observe_latency()
        if bundles:
            for bundle in self._bundles.values():
                if bundle.multiplexed:
                    self._cursors.update(bundle.cursor_changes())
        if not (self._cursors or self.forwarded or self._acked):
            return True
        cursors, self._cursors = self._cursors, {}
        forwarded, self.forwarded = self.forwarded, 0
        acked, self._acked = self._acked, {}
        saving = (cursors, acked)
        self._saving.append(saving)
        try:
            await self.threads.write(self.threads.store.save_cursors, cursors, forwarded, acked)
            return True
        except Exception:
            log.exception("saving cursors failed; they are retried")
            self.forwarded += forwarded
            for number, pub in cursors.items():
                self.save_cursor(number, pub)
            for number, pubs in acked.items():
                self.save_acked(number, pubs)
            return False
        finally:
            self._saving = [other for other in self._saving if other is not saving]

    async def stop(self) -> None:
        """(Every connection is closed at once: each waits up to a second for a client that does not read.)"""
        self._stopping.set()
        bundles = list(self._bundles.values())
        await asyncio.gather(*(bundle.close() for bundle in bundles))
        for bundle in bundles:
            self.detach(bundle)
        await self.flush_cursors()


def _consecutive(entries: list[FeedEntry]) -> list[list[FeedEntry]]:
    """The entries (in seq order) in runs of consecutive seqs, each run spanning at most QUEUE_LIMIT
    publications (so that a connection whose queue is empty takes a run whole, as it took each of
    its entries: it falls behind no sooner than when they were offered one by one) and holding at
    most RUN_MATCHES matches. Rows missing between two were spilled, and what follows them is
    offered only after the subscriptions resync."""
    runs: list[list[FeedEntry]] = []
    spanned = held = 0
    for entry in entries:
        span = int(entry.pubs.max()) - int(entry.pubs.min()) + 1 if len(entry.pubs) else 0
        matches = len(entry.pubs)
        if (
            runs
            and entry.seq == runs[-1][-1].seq + 1
            and spanned + span <= QUEUE_LIMIT
            and held + matches <= RUN_MATCHES
        ):
            runs[-1].append(entry)
            spanned += span
            held += matches
        else:
            runs.append([entry])
            spanned, held = span, matches
    return runs


def _merged(run: list[FeedEntry]) -> FeedEntry:
    """A run of entries as one (sorted by subscription, each in publication order), offered as the
    run's first entry, from which a subscription that cannot take it reads the store again. A
    subscription's match with a publication not past one an earlier entry gave it is dropped, as
    offering the entries one by one does (a connection takes only publications past its last)."""
    if len(run) == 1:
        return run[0]
    sub_nos = np.concatenate([entry.sub_nos for entry in run])
    pubs = np.concatenate([entry.pubs for entry in run])
    order = np.argsort(sub_nos, kind="stable")
    sub_nos, pubs = sub_nos[order], pubs[order]
    later = sub_nos[1:] == sub_nos[:-1]  # each pair after the first of its subscription
    if (later & (pubs[1:] <= pubs[:-1])).any():
        # (rare: a replaced subscription's initial matches again) kept: the pairs past every pair
        # before them, by a key that orders subscriptions first (dense ranks keep it within int64)
        ranks = np.cumsum(np.r_[True, ~later]) - 1
        _, dense = np.unique(pubs, return_inverse=True)
        key = ranks * (len(pubs) + 1) + dense
        kept = key > np.r_[-1, np.maximum.accumulate(key)[:-1]]
        sub_nos, pubs = sub_nos[kept], pubs[kept]
    return FeedEntry(run[0].seq, sub_nos, pubs, any(entry.cropped for entry in run))


def _objects(items: list[bytes]) -> np.ndarray:
    """An object array of bytes (np.array would make fixed-width bytes of them)."""
    array = np.empty(len(items), object)
    array[:] = items
    return array


_EMPTY = np.empty(0, np.int64)
_NONE = Published(_EMPTY, _objects([]), _objects([]), _EMPTY, _EMPTY, _EMPTY)  # what a read that found nothing delivers
