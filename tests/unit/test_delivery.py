"""The delivery hub against a real store, without sockets: fan-out by subscription number."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import AsyncIterator

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.helpers import published
from veil.gateway import bundle as bundle_module
from veil.gateway.bundle import Admitted, Bundle
from veil.gateway.delivery import RUN_MATCHES, Asked, DeliveryHub, _consecutive, _merged, _objects
from veil.gateway.quotas import Client
from veil.gateway.store_threads import StoreThreads
from veil.protocol import Handshake
from veil.store import Round, open_store
from veil.store.base import FeedEntry

RUNNING: set[asyncio.Task] = set()


@contextlib.asynccontextmanager
async def running_hub(path) -> AsyncIterator[DeliveryHub]:
    """Built inside the test's own event loop, where its poller must run."""
    threads = StoreThreads(open_store(f"sqlite:///{path}/veil.db"))
    hub = DeliveryHub(threads, poll_interval=0.001)
    await hub.start()
    poller = asyncio.create_task(hub.poll())
    try:
        yield hub
    finally:
        await hub.stop()
        await poller
        threads.close()


class Connected:
    """A caught-up connection of one subscription (nothing queued for it in the store): what it was
    sent, and what it was closed with."""

    def __init__(
        self, hub: DeliveryHub, number: int, ack: bool = False, envelope: bool = True, live: bool = True
    ) -> None:
        self.sent: list[bytes] = []
        self.writes = 0
        self.closed: list[bytes | None] = []
        handshake = Handshake("a", f"s{number}", envelope, ack, None)
        admitted = [Admitted(f"s{number}", number, 0, 0.0)]
        self.bundle = Bundle(hub, handshake, admitted, self._send, self._close, Client(""))
        self.bundle.live[:] = live
        hub.attach(self.bundle)
        if live:
            self.run()

    def run(self) -> None:
        RUNNING.add(asyncio.create_task(self.bundle.run()))

    async def _send(self, frames: list[bytes]) -> None:
        self.sent.extend(frames)
        self.writes += 1

    async def _close(self, error: bytes | None) -> None:
        self.closed.append(error)

    def seqs(self) -> list[int]:
        return [orjson.loads(frame)["seq"] for frame in self.sent]


async def connect(hub: DeliveryHub, number: int) -> list[bytes]:
    """The bodies a new connection of one subscription is sent (no envelope asked for)."""
    return Connected(hub, number, envelope=False).sent


async def until(condition, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


async def test_numbers_far_beyond_the_first_table_are_served(tmp_path):
    async with running_hub(tmp_path) as hub:
        store = hub.threads.store
        first, second = store.append_publications(published(b'{"n":1}', b'{"n":2}'))
        far_sent = await connect(hub, 5000)
        near_sent = await connect(hub, 3)
        store.record_round(Round([4998, 3], [first, first], first))  # the table grows, short of 5000
        store.record_round(Round([5000, 3], [second, second], second))
        await until(lambda: len(far_sent) == 1 and len(near_sent) == 2)
        assert far_sent == [b'{"n":2}'] and near_sent == [b'{"n":1}', b'{"n":2}']


async def test_rounds_recorded_while_the_hub_is_busy_reach_each_connection_in_one_read_and_one_write(
    tmp_path, monkeypatch
):
    """A hub that fell behind the pipeline's rounds catches up with all it missed at once: one read of
    the publications' bodies, one write per connection, each subscription's deliveries in order."""
    async with running_hub(tmp_path) as hub:
        store = hub.threads.store
        pubs = store.append_publications(published(*[b'{"n":%d}' % n for n in range(6)]))
        one, other = Connected(hub, 3), Connected(hub, 4)
        lookup, reads = hub.published, []
        busy, go_on = asyncio.Event(), asyncio.Event()

        async def held(sub_nos: np.ndarray, wanted: np.ndarray, cropped: bool):
            reads.append(sorted(set(wanted.tolist())))
            busy.set()
            await go_on.wait()
            return await lookup(sub_nos, wanted, cropped)

        monkeypatch.setattr(hub, "published", held)
        store.record_round(Round([3], [pubs[0]], pubs[0]))
        await busy.wait()
        for pub in pubs[1:]:
            store.record_round(Round([3, 4], [pub, pub], pub))
        go_on.set()
        await until(lambda: one.seqs() == pubs and other.seqs() == pubs[1:])
        assert reads == [[pubs[0]], pubs[1:]]
        assert (one.writes, other.writes) == (2, 1)


async def test_a_subscription_that_cannot_take_rounds_offered_as_one_reads_them_all_from_the_store(
    tmp_path, monkeypatch
):
    """Entries offered together are offered as the first of them: a connection without room for them
    reads the store from that entry on, and so misses none of them and gets none twice."""
    async with running_hub(tmp_path) as hub:
        store = hub.threads.store
        store.put_subscription("s", "a", b"[]")
        number = store.subscription_number("s")
        pubs = store.append_publications(published(*[b'{"n":%d}' % n for n in range(5)]))
        one = Connected(hub, number)
        store.record_round(Round([number], [pubs[0]], pubs[0]))
        await until(lambda: one.seqs() == pubs[:1])
        lookup = hub.published
        busy, go_on = asyncio.Event(), asyncio.Event()

        async def held(sub_nos: np.ndarray, wanted: np.ndarray, cropped: bool):
            busy.set()
            await go_on.wait()
            return await lookup(sub_nos, wanted, cropped)

        monkeypatch.setattr(hub, "published", held)
        store.record_round(Round([number], [pubs[1]], pubs[1]))
        await busy.wait()
        for pub in pubs[2:]:
            store.record_round(Round([number], [pub], pub))
        monkeypatch.setattr(bundle_module, "QUEUE_LIMIT", 2)  # room for two deliveries, three offered at once
        one.bundle._limit = 2
        go_on.set()
        await until(lambda: one.seqs() == pubs)
        await asyncio.sleep(0.1)
        assert one.seqs() == pubs


@given(st.lists(st.sets(st.tuples(st.integers(0, 4), st.integers(1, 20)), max_size=10), min_size=1, max_size=5))
def test_entries_offered_as_one_deliver_what_offering_them_one_by_one_would(rounds):
    entries = []
    for seq, pairs in enumerate(rounds, 7):
        ordered = sorted(pairs)
        entries.append(
            FeedEntry(seq, np.array([s for s, _ in ordered], np.int64), np.array([p for _, p in ordered], np.int64))
        )
    one_by_one: dict[int, list[int]] = {}
    for entry in entries:  # a connection takes only publications past the last it took
        for sub_no, pub in zip(entry.sub_nos.tolist(), entry.pubs.tolist(), strict=True):
            if pub > max(one_by_one.get(sub_no, [0])):
                one_by_one.setdefault(sub_no, []).append(pub)
    merged = _merged(entries)
    as_one: dict[int, list[int]] = {}
    for sub_no, pub in zip(merged.sub_nos.tolist(), merged.pubs.tolist(), strict=True):
        as_one.setdefault(sub_no, []).append(pub)
    assert merged.seq == 7 and list(as_one) == sorted(as_one)
    assert as_one == one_by_one


@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.integers(0, 1500), st.integers(0, 1500), st.integers(2, 40_000)),
        min_size=1, max_size=12,
    )
)  # fmt: skip
def test_entries_go_out_in_runs_of_consecutive_seqs_each_spanning_what_a_queue_takes(steps):
    """A run is offered as one: a gap in the seqs ends it (what lies between was spilled), and so
    does a span of publications an empty queue could not take (a connection would fall behind), and
    so do more matches than RUN_MATCHES (the connections' shares of it would not fit either)."""
    entries, seq = [], 0
    for step, low, width, matches in steps:
        seq += step
        pubs = np.linspace(low, low + width, matches).astype(np.int64)
        entries.append(FeedEntry(seq, np.zeros(matches, np.int64), pubs))
    runs = _consecutive(entries)
    assert [entry for run in runs for entry in run] == entries
    for run in runs:
        assert [entry.seq for entry in run] == list(range(run[0].seq, run[0].seq + len(run)))
        spans = [int(entry.pubs.max() - entry.pubs.min()) + 1 for entry in run]
        assert len(run) == 1 or sum(spans) <= bundle_module.QUEUE_LIMIT
        assert len(run) == 1 or sum(len(entry.pubs) for entry in run) <= RUN_MATCHES


async def test_connections_that_fall_behind_together_read_their_backlogs_in_one_read(tmp_path, monkeypatch):
    """Hundreds of connections of one that fell behind together would each scan the same feed rows
    and read the same bodies: their reads are gathered into one, and each gets exactly its own."""
    async with running_hub(tmp_path) as hub:
        store = hub.threads.store
        numbers = []
        for n in range(20):
            store.put_subscription(f"s{n}", "alice", b"[]")
            numbers.append(store.subscription_number(f"s{n}"))
        pubs = store.append_publications(published(*[b'{"n":%d}' % n for n in range(12)]))
        owed: dict[int, list[int]] = {number: [] for number in numbers}
        for at, pub in enumerate(pubs):  # the n-th subscription matches every (n+1)-th publication
            mine = [number for n, number in enumerate(numbers) if at % (n + 1) == 0]
            store.record_round(Round(mine, [pub] * len(mine), pub))
            for number in mine:
                owed[number].append(pub)
        await until(lambda: hub.last_seq == store.last_feed_seq())
        reads, backlogs = [], store.backlogs

        def counted(*args):
            reads.append(len(args[0]))
            return backlogs(*args)

        monkeypatch.setattr(store, "backlogs", counted)
        late = [Connected(hub, number, live=False) for number in numbers]
        for connection in late:
            connection.run()
        await until(lambda: all(c.seqs() == owed[n] for c, n in zip(late, numbers, strict=True)))
        assert reads == [len(numbers)]
        store.record_round(Round(numbers, [pubs[-1] + 1] * len(numbers), pubs[-1] + 1))
        await until(lambda: all(c.bundle.live[0] for c in late))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.sets(st.integers(0, 7), max_size=8), min_size=1, max_size=8),
    st.integers(0, 8),
    st.lists(st.tuples(st.integers(0, 8), st.integers(1, 5)), min_size=8, max_size=8),
    st.lists(st.integers(0, 7), min_size=1, max_size=8),
)
def test_a_gathered_backlog_read_gives_each_connection_what_its_own_read_would(rounds, spilled, asks, cuts):
    """However the reads are gathered (each with its own floors and limit, over spilled rows and the
    feed), each connection's matches and what they deliver are those of a read of its own."""

    async def check(path: str) -> None:
        store = open_store(f"sqlite:///{path}/veil.db")
        threads = StoreThreads(store)
        hub = DeliveryHub(threads)
        numbers = []
        for n in range(8):
            store.put_subscription(f"s{n}", "alice", b"[]")
            numbers.append(store.subscription_number(f"s{n}"))
        pubs = store.append_publications(published(*[b'{"n":%d}' % n for n in range(len(rounds))]))
        for pub, chosen in zip(pubs, rounds, strict=True):
            mine = [numbers[n] for n in sorted(chosen)]
            store.record_round(Round(mine, [pub] * len(mine), pub, copies=[(mine[0], pub, b"cut")] if mine else ()))
        store.compact(1000, min(spilled, len(rounds)), time.time() + 1)  # the first rounds spilled
        groups = np.split(np.arange(8), sorted(set(cuts)))
        gathered = [
            Asked(
                np.array([numbers[n] for n in group], np.int64),
                np.array([pubs[min(asks[n][0], len(pubs)) - 1] if asks[n][0] else 0 for n in group], np.int64),
                asks[group[0]][1] if len(group) else 1,
                0,
                asyncio.get_running_loop().create_future(),
            )
            for group in groups
            if len(group)
        ]
        together = await hub._read_together(gathered)
        for asked, backlog in zip(gathered, together, strict=True):
            sub_nos, alone, watermark, _ = store.backlogs(asked.numbers, asked.afters, asked.limit)
            assert (backlog.sub_nos.tolist(), backlog.pubs.tolist(), backlog.watermark) == (
                sub_nos.tolist(), alone.tolist(), watermark,
            )  # fmt: skip
            own, variants = await hub.published(sub_nos, alone, cropped=True)
            assert backlog.published.bodies[backlog.variants].tolist() == own.bodies[variants].tolist()
            assert backlog.published.envelopes[backlog.variants].tolist() == own.envelopes[variants].tolist()
        threads.close()

    with tempfile.TemporaryDirectory() as path:
        asyncio.run(check(path))


def unsaved_cursor(hub, sub_id: str, number: int) -> int:
    """Where a connection of the subscription admitted now would resume, but for the store's cursor."""
    return max(hub.unsaved().cursors.get(number, 0), hub.held_cursor(sub_id, number))


async def test_a_connection_of_one_takes_acknowledgements_only_of_what_it_was_written(tmp_path):
    """A hostile client acknowledging publications it was never sent would have them skipped on its
    next connection: only what was written moves its cursor."""
    async with running_hub(tmp_path) as hub:
        store = hub.threads.store
        first, second = store.append_publications(published(b'{"n":1}', b'{"n":2}'))
        one = Connected(hub, 7, ack=True)
        store.record_round(Round([7], [first], first))
        await until(lambda: one.seqs() == [first])
        one.bundle.acknowledge(second)  # not written yet
        one.bundle.acknowledge(first + 1_000_000)
        assert unsaved_cursor(hub, "s7", 7) == 0
        one.bundle.acknowledge(first)
        assert unsaved_cursor(hub, "s7", 7) == first


async def test_a_kicked_connection_of_one_ends_with_the_reason_and_is_written_nothing_after_it(tmp_path):
    async with running_hub(tmp_path) as hub:
        store = hub.threads.store
        first, second = store.append_publications(published(b'{"n":1}', b'{"n":2}'))
        one, other = Connected(hub, 3), Connected(hub, 4)
        store.record_round(Round([3, 4], [first, first], first))
        await until(lambda: one.seqs() == [first] and other.seqs() == [first])
        hub.kick("s3", b'{"error":"gone"}\n')
        store.record_round(Round([3, 4], [second, second], second))
        await until(lambda: other.seqs() == [first, second])
        await until(lambda: one.closed == [b'{"error":"gone"}\n'])
        assert one.seqs() == [first] and "s3" not in hub.holders and hub.behind() == 0


async def test_a_connection_that_leaves_while_the_hub_reads_bodies_is_offered_nothing(tmp_path, caplog, monkeypatch):
    """The hub looks up what a feed entry delivers before it offers it: a connection that ended in
    the meantime is skipped, and the others are served live, not sent back to the store."""
    async with running_hub(tmp_path) as hub:
        store = hub.threads.store
        (pub,) = store.append_publications(published(b'{"n":1}'))
        leaving, staying, together = Connected(hub, 5), Connected(hub, 6), Connected(hub, 8)
        lookup = hub.published

        async def published_after_a_leave(sub_nos: np.ndarray, pubs: np.ndarray, cropped: bool):
            found = await lookup(sub_nos, pubs, cropped)
            hub.detach(leaving.bundle)
            leaving.bundle.open[:] = False
            return found

        monkeypatch.setattr(hub, "published", published_after_a_leave)  # the race, made certain
        with caplog.at_level(logging.ERROR, "veil.gateway"):
            store.record_round(Round([5, 6, 8], [pub, pub, pub], pub))
            await until(lambda: staying.seqs() == [pub] and together.seqs() == [pub])
        assert leaving.sent == [] and not caplog.records and hub.behind() == 0


async def test_a_subscription_that_catches_up_while_an_entry_is_being_offered_reads_that_entry_too(
    tmp_path, monkeypatch
):
    """The hub chose whom to offer feed entry E2 before a subscription's backlog read (which saw only
    E1) ended: going live then would skip E2 for good, the next entries moving its cursor past it."""
    async with running_hub(tmp_path) as hub:
        store = hub.threads.store
        for sub_id in ("s1", "s2"):
            store.put_subscription(sub_id, "alice", b"[]")
        one, two = store.live_numbers(["s1", "s2"])
        p1, p2, p3 = store.append_publications(published(b'{"n":1}', b'{"n":2}', b'{"n":3}'))
        store.record_round(Round([one, two], [p1, p1], p1))
        await until(lambda: hub.last_seq == store.last_feed_seq())
        reading = Connected(hub, one)
        late = Connected(hub, two, live=False)  # connected, its backlog not read yet
        before_e2 = store.backlogs(np.array([two]), np.array([0]), 2048)
        offering, go_on = asyncio.Event(), asyncio.Event()
        lookup = hub.published

        async def held(sub_nos: np.ndarray, pubs: np.ndarray, cropped: bool):
            offering.set()
            await go_on.wait()
            return await lookup(sub_nos, pubs, cropped)

        monkeypatch.setattr(hub, "published", held)
        store.record_round(Round([one, two], [p2, p2], p2))
        await offering.wait()  # the hub offers E2 to the first subscription only
        monkeypatch.setattr(hub, "published", lookup)
        backlogs = store.backlogs
        monkeypatch.setattr(store, "backlogs", lambda *args: before_e2)
        await late.bundle._refill()  # its read ends now, having seen E1 only
        monkeypatch.setattr(store, "backlogs", backlogs)
        go_on.set()
        late.run()
        store.record_round(Round([two], [p3], p3))
        await until(lambda: late.seqs() == [p1, p2, p3] and reading.seqs() == [p2])


async def test_past_its_unacknowledged_bound_a_connection_waits_for_an_acknowledgement(tmp_path, monkeypatch):
    """A client that reads and never acknowledges is written no more than one that does not read:
    what its subscriptions are owed waits in the store, within their queues' bounds."""
    monkeypatch.setattr(bundle_module, "UNACKED_DELIVERIES", 2)
    async with running_hub(tmp_path) as hub:
        store = hub.threads.store
        store.put_subscription("s", "a", b"[]")  # (live: what it is owed is read from the store)
        number = store.subscription_number("s")
        pubs = store.append_publications(published(*[b'{"n":%d}' % n for n in range(4)]))
        one = Connected(hub, number, ack=True)
        for written, pub in enumerate(pubs[:3], 1):
            store.record_round(Round([number], [pub], pub))
            await until(lambda written=written: len(one.sent) >= min(written, 2))
        await asyncio.sleep(0.3)
        assert one.seqs() == pubs[:2]
        assert one.bundle.watch.not_reading(time.monotonic())  # (it holds up nobody's publishes)
        one.bundle.acknowledge(pubs[0])
        await until(lambda: len(one.sent) == 3)
        store.record_round(Round([number], [pubs[3]], pubs[3]))
        await asyncio.sleep(0.3)
        assert one.seqs() == pubs[:3]
        one.bundle.acknowledge(pubs[2])
        await until(lambda: one.seqs() == pubs)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 30), min_size=1, max_size=12, unique=True),
    st.lists(st.integers(0, 11), max_size=8),
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 19)), max_size=60),
)
def test_a_connections_lines_go_in_publication_order_then_variant_naming_their_subscriptions(pubs, crops, taken):
    """`_lines` orders a connection's deliveries by one stable sort of the variants' ranks
    (`variant_ranks`, once per `Published`): by publication, a cropped copy after the publication it
    copies, each line naming its subscriptions in the order they were given."""
    pubs = sorted(pubs)
    variant_pubs = np.array(pubs + [pubs[c % len(pubs)] for c in crops], np.int64)
    count = len(variant_pubs)
    empty = _objects([b""] * count)
    published = bundle_module.Published(
        variant_pubs, empty, empty, np.zeros(count, np.int64), np.ones(count, np.int64),
        bundle_module.variant_ranks(variant_pubs),
    )  # fmt: skip
    places = np.array([place for place, _ in taken], np.int64)
    variants = np.array([variant % count for _, variant in taken], np.int64)
    lines, sizes = bundle_module._lines(places, variants, published, np.full(41, 3, np.int64), live=True)
    expected = sorted(range(len(taken)), key=lambda at: (variant_pubs[variants[at]], variants[at], at))
    assert lines.places.tolist() == places[expected].tolist()
    firsts = [at for n, at in enumerate(expected) if n == 0 or variants[at] != variants[expected[n - 1]]]
    assert lines.pubs.tolist() == variant_pubs[variants[firsts]].tolist()
    assert lines.counts.sum() == len(taken) and sizes.tolist() == [1 + 3 * c for c in lines.counts.tolist()]


def test_lines_of_more_variants_than_16_bits_rank_are_ordered_alike():
    """Past 65,536 variants (a publisher's cropping rules can make one a match) the ranks are
    sorted as int64, not cut to 16 bits: the lines keep publication order, then variant."""
    rng = np.random.default_rng(7)
    count = (1 << 16) + 5
    variant_pubs = rng.integers(0, 1000, count).astype(np.int64)
    empty = _objects([b""] * count)
    published = bundle_module.Published(
        variant_pubs, empty, empty, np.zeros(count, np.int64), np.ones(count, np.int64),
        bundle_module.variant_ranks(variant_pubs),
    )  # fmt: skip
    variants = rng.integers(0, count, 5000).astype(np.int64)
    places = np.arange(5000, dtype=np.int64)
    lines, _ = bundle_module._lines(places, variants, published, np.full(5000, 3, np.int64), live=True)
    assert lines.places.tolist() == np.lexsort((places, variants, variant_pubs[variants])).tolist()
