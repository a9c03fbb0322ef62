import sqlite3
import tempfile
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.helpers import published
from veil.protocol.envelope import Origin
from veil.store import (
    KIND_PUBLICATION,
    KIND_SUBSCRIBE,
    KIND_UNSUBSCRIBE,
    BatchDurations,
    NotOwner,
    PipelineStatus,
    Publication,
    Quarantined,
    Round,
    StatefulBatch,
    TooMany,
    Totals,
    UnknownPublication,
    UnknownSubscription,
    Webhook,
    open_store,
)
from veil.store.queues import distinct, matches_of, pack, sorted_pairs, uniques, unpack


def backlog(store, number: int, after: int, limit: int) -> tuple[list[tuple[int, bytes, Origin]], int]:
    """A subscription's queue as its connection reads it: (publication, bytes delivered, origin) in
    publication order, its cropped copy where it has one; and the watermark of the read."""
    _, pubs, watermark, _ = store.backlogs(np.array([number]), np.array([after]), limit)
    bodies, copies = store.bodies(pubs), store.copies(np.full(len(pubs), number), pubs)
    rows = []
    for pub in pubs.tolist():
        body, origin, _ = bodies[pub]
        copy = copies.get((number, pub))
        rows.append((pub, body, origin) if copy is None else (pub, copy, origin._replace(cropped=True)))
    return rows, watermark


def test_log_orders_publications_and_subscription_changes(store):
    s1 = store.put_subscription("s", "alice", b"[]")
    no = store.subscription_number("s")
    pubs = store.append_publications(published(b'{"a":1}', b'{"a":2}'))
    s2 = store.put_subscription("s", "alice", b'[["a","eq",1]]')
    u = store.remove_subscription("s", "alice")
    assert pubs == [s1 + 1, s1 + 2] and s2 == pubs[-1] + 1 and u == s2 + 1
    kinds = [e.kind for e in store.log_range(0, u)]
    assert kinds == [KIND_SUBSCRIBE, KIND_PUBLICATION, KIND_PUBLICATION, KIND_SUBSCRIBE, KIND_UNSUBSCRIBE]
    assert store.subscriptions_at(s1) == [("s", no, "alice", b"[]")]
    assert store.subscriptions_at(s2) == [("s", no, "alice", b'[["a","eq",1]]')]
    assert store.subscriptions_at(u) == []
    dropped, added = store.subscription_changes(s1, s2)
    assert dropped == ["s"] and added == [("s", no, "alice", b'[["a","eq",1]]')]


def test_ownership(store):
    store.put_subscription("s", "alice", b"[]")
    with pytest.raises(NotOwner):
        store.put_subscription("s", "mallory", b"[]")
    with pytest.raises(UnknownSubscription):
        store.remove_subscription("s", "mallory")  # not told apart from an unknown id
    with pytest.raises(UnknownSubscription):
        store.remove_subscription("nope", "alice")
    assert store.subscription_owner("s") == "alice"


def test_owned_subscriptions_are_the_owners_live_ones_in_id_order(store):
    made = {sub_id: store.put_subscription(sub_id, "alice", sub_id.encode()) for sub_id in ("b", "a", "c", "d")}
    store.put_subscription("bb", "mallory", b"[]")
    store.remove_subscription("c", "alice")
    made["d"] = store.put_subscription("d", "alice", b"d2")  # replaced: the newer one
    assert store.owned_subscriptions("alice") == [
        ("a", made["a"], b"a"),
        ("b", made["b"], b"b"),
        ("d", made["d"], b"d2"),
    ]
    assert [row[0] for row in store.owned_subscriptions("alice", after="a", limit=1)] == ["b"]
    assert store.owned_subscriptions("alice", only="d") == [("d", made["d"], b"d2")]
    assert store.owned_subscriptions("alice", only="bb") == [] and store.owned_subscriptions("alice", only="c") == []
    assert store.owned_sizes("alice", after="a") == [("b", 1), ("d", 2)]


def test_replayed_batches_deliver_once(store):
    store.put_subscription("s", "alice", b"[]")
    (pub,) = store.append_publications(published(b'{"a":1}'))
    s = store.subscription_number("s")
    store.record_round(Round([s], [pub], pub))
    store.record_round(Round([s], [pub], pub))
    rows, watermark = backlog(store, store.subscription_number("s"), 0, 10)
    assert rows == [(pub, b'{"a":1}', Origin())]
    assert watermark == store.last_feed_seq() == 1 and store.processed_offset() == pub
    feed = store.feed_since(0, 10)
    assert [(e.sub_nos.tolist(), e.pubs.tolist()) for e in feed] == [([s], [pub])]
    ((body, origin, logged),) = store.bodies(feed[0].pubs).values()
    assert (body, origin) == (b'{"a":1}', Origin()) and abs(logged / 1000 - time.time()) < 60


def test_a_large_round_is_cut_into_bounded_feed_rows_read_a_few_at_a_time(store, monkeypatch):
    """Whatever reads the feed holds rows whole: a round's matches are cut into rows of at most
    FEED_ROW_PAIRS, one read takes rows up to FEED_READ_PAIRS matches, and every subscription's
    queue still reads in publication order."""
    monkeypatch.setattr("veil.store.queues.FEED_ROW_PAIRS", 4)
    monkeypatch.setattr("veil.store.relational.deliveries.FEED_READ_PAIRS", 6)
    for sub_id in "stu":
        store.put_subscription(sub_id, "alice", b"[]")
    pubs = store.append_publications(published(*[b"{}"] * 5))
    numbers = [store.subscription_number(sub_id) for sub_id in "stu"]
    pairs = [(n, p) for p in pubs for n in numbers if (n + p) % 4]  # not every publication for every one
    store.record_round(Round([n for n, _ in pairs], [p for _, p in pairs], pubs[-1]))
    rows, seq, reads = [], 0, 0
    while read := store.feed_since(seq, 64):
        assert sum(len(e.pubs) for e in read[:-1]) < 6  # a read stops at the row that reaches the budget
        rows, seq, reads = rows + read, read[-1].seq, reads + 1
    assert [len(e.pubs) for e in rows] == [min(4, len(pairs) - i) for i in range(0, len(pairs), 4)]
    assert len(rows) >= 3 and reads >= 2
    cut = [(n, p) for e in rows for n, p in zip(e.sub_nos.tolist(), e.pubs.tolist(), strict=True)]
    assert cut == sorted(pairs)
    for n in numbers:
        queued, _ = backlog(store, n, 0, 100)
        assert [pub for pub, _, _ in queued] == sorted(p for m, p in pairs if m == n)


INT64S = st.integers(0, 2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 10_000)) | st.tuples(INT64S, INT64S), max_size=60))
def test_pairs_sort_by_subscription_then_publication_and_distinct_counts_them(pairs):
    """A round's pairs sorted by one packed key where both fit (a round spans a few thousand
    offsets), by both columns where they do not (numbers or offsets near 2**63); `distinct` counts
    and `uniques` finds by a table over a narrow span and by `np.unique` over a wide one, alike."""
    sub_nos = np.array([n for n, _ in pairs], np.int64)
    pubs = np.array([p for _, p in pairs], np.int64)
    ordered_subs, ordered_pubs = sorted_pairs(sub_nos, pubs)
    assert list(zip(ordered_subs.tolist(), ordered_pubs.tolist(), strict=True)) == sorted(pairs)
    assert distinct(pubs) == len({p for _, p in pairs}) and distinct(sub_nos) == len({n for n, _ in pairs})
    for values in (pubs, sub_nos):  # `uniques` likewise, by a table or by `np.unique`
        found, index = uniques(values)
        assert found.tolist() == sorted(set(values.tolist())) and found[index].tolist() == values.tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 2**40), st.integers(0, 2**62)), min_size=1, max_size=40),
    st.sampled_from([1, 2**16, 2**32, 2**62]),
)
def test_a_packed_row_unpacks_to_its_sorted_pairs_whatever_its_publications_span(pairs, span):
    """Publications packed as offsets from the row's least, in 2, 4 or 8 bytes as their span needs."""
    sub_nos = np.array([n for n, _ in pairs], np.int64)
    pubs = np.array([p % span for _, p in pairs], np.int64)
    ordered = sorted_pairs(sub_nos, pubs)
    entry = unpack(7, pack(*ordered))
    assert entry.sub_nos.tolist() == ordered[0].tolist() and entry.pubs.tolist() == ordered[1].tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(0, 2**40)), max_size=60),
    st.lists(st.integers(0, 70), unique=True, max_size=20),
    st.booleans(),
)
def test_a_rows_matches_for_some_subscriptions_are_theirs_alone_in_order(pairs, wanted, packed):
    """`matches_of` reads a packed row's table of subscriptions, not the row: what it finds for
    the numbers asked for (in any order, some absent) is what unpacking the row finds; alike for
    a row from before rows were packed."""
    ordered = sorted_pairs(np.array([n for n, _ in pairs], np.int64), np.array([p for _, p in pairs], np.int64))
    row = pack(*ordered) if packed and pairs else np.concatenate(ordered).tobytes()
    whose, pubs = matches_of(row, np.array(wanted, np.int64))
    expected = [(i, p) for i, number in enumerate(wanted) for n, p in sorted(pairs) if n == number]
    assert list(zip(whose.tolist(), pubs.tolist(), strict=True)) == expected


def test_a_row_written_before_rows_were_packed_is_read_spilled_and_queued_as_before(store):
    """A store upgraded with feed rows not yet spilled: their two int64 columns are still read by
    the hub's feed read, by a backlog read, and by compaction's spill."""
    for sub_id in "st":
        store.put_subscription(sub_id, "alice", b"[]")
    s, t = store.subscription_number("s"), store.subscription_number("t")
    pubs = store.append_publications(published(b'{"n":1}', b'{"n":2}', b'{"n":3}'))
    old = np.array([s, s, t, pubs[0], pubs[2], pubs[1]], np.int64).tobytes()
    with store._tx() as db:
        db.execute("INSERT INTO feed(pairs, first, created, cropped) VALUES (?, ?, ?, ?)", (old, pubs[0], 0.0, False))
        db.execute(  # the watermark readers read up to, as a round that writes a row moves it
            "INSERT INTO status(name, value, updated) SELECT 'feed_seq', MAX(seq), 0 FROM feed WHERE true "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value"
        )
    store.record_round(Round([], [], pubs[2]))
    (entry,) = store.feed_since(0, 10)
    assert (entry.sub_nos.tolist(), entry.pubs.tolist()) == ([s, s, t], [pubs[0], pubs[2], pubs[1]])
    assert [pub for pub, *_ in backlog(store, s, 0, 10)[0]] == [pubs[0], pubs[2]]
    spill_everything(store)
    assert store.feed_since(0, 10) == []
    assert [pub for pub, *_ in backlog(store, s, pubs[0], 10)[0]] == [pubs[2]]
    assert [pub for pub, *_ in backlog(store, t, 0, 10)[0]] == [pubs[1]]


def test_a_compaction_step_of_small_rows_spills_its_share(store):
    """A packed row of one publication's matches is a few hundred bytes: a step reads rows by bytes
    enough for its share of matches, not by the fewest bytes a match may take (which made a step of
    rounds like these spill a few rows' matches, and the compaction loop rest between steps)."""
    for sub_id in "abcdefghij":
        store.put_subscription(sub_id, "alice", b"[]")
    numbers = [store.subscription_number(sub_id) for sub_id in "abcdefghij"]
    for pub in store.append_publications(published(*[b"{}"] * 300)):
        store.record_round(Round(numbers, [pub] * len(numbers), pub))
    assert store.compact(1000, 1 << 40, time.time() + 1) >= 1000


def test_feed_entries_are_sorted_by_subscription(store):
    for sub_id in "st":
        store.put_subscription(sub_id, "alice", b"[]")
    pubs = store.append_publications(published(b"{}", b"{}"))
    s, t = store.subscription_number("s"), store.subscription_number("t")
    store.record_round(Round([t, s, t, s], [pubs[0], pubs[0], pubs[1], pubs[1]], pubs[1]))
    (entry,) = store.feed_since(0, 10)
    assert entry.sub_nos.tolist() == [s, s, t, t] and entry.pubs.tolist() == [pubs[0], pubs[1]] * 2


def test_cursors_only_move_forward_and_die_with_the_subscription(store):
    store.put_subscription("s", "alice", b"[]")
    store.save_cursors({store.subscription_number("s"): 5})
    store.save_cursors({store.subscription_number("s"): 3})
    assert store.cursor("s") == 5
    store.remove_subscription("s", "alice")
    assert store.cursor("s") == 0


def spill_everything(store, fanned_out=1 << 40):
    return store.compact(1000, fanned_out, time.time() + 1)


def test_backlog_reads_spilled_rows_then_the_feed(store):
    store.put_subscription("s", "alice", b"[]")
    s = store.subscription_number("s")
    pubs = store.append_publications(published(b'{"n":1}', b'{"n":2}', b'{"n":3}'))
    store.record_round(Round([s], [pubs[0]], pubs[0]))
    spill_everything(store)
    store.record_round(Round([s, s], pubs[1:], pubs[2]))
    assert backlog(store, store.subscription_number("s"), 0, 10)[0] == [
        (pubs[0], b'{"n":1}', Origin()),
        (pubs[1], b'{"n":2}', Origin()),
        (pubs[2], b'{"n":3}', Origin()),
    ]
    assert [pub for pub, *_ in backlog(store, store.subscription_number("s"), pubs[0], 1)[0]] == [pubs[1]]
    assert [pub for pub, *_ in backlog(store, store.subscription_number("s"), pubs[1], 10)[0]] == [pubs[2]]


def test_backlogs_read_many_subscriptions_at_once_each_after_its_own_floor(store):
    for sub_id in ("s", "t", "u", "gone"):
        store.put_subscription(sub_id, "alice", b"[]")
    s, t, u, gone = (store.subscription_number(x) for x in ("s", "t", "u", "gone"))
    pubs = store.append_publications(published(*(b'{"n":%d}' % n for n in range(5))))
    store.record_round(Round([s, s, t, gone], [pubs[0], pubs[1], pubs[1], pubs[0]], pubs[1]))
    spill_everything(store)
    store.record_round(Round([s, s, s, t, u], [pubs[2], pubs[3], pubs[4], pubs[4], pubs[3]], pubs[4]))
    store.remove_subscription("gone", "alice")
    numbers = np.array([s, t, u, gone])
    sub_nos, found, watermark, _ = store.backlogs(numbers, np.array([pubs[0], 0, 0, 0]), 2)
    # s: after its floor, two at most (one spilled, one from the feed); t: spilled then feed; u: feed only
    assert sorted(zip(sub_nos.tolist(), found.tolist(), strict=True)) == sorted(
        [(s, pubs[1]), (s, pubs[2]), (t, pubs[1]), (t, pubs[4]), (u, pubs[3])]
    )
    assert watermark == store.last_feed_seq()
    assert store.backlogs(numbers, np.full(4, pubs[4]), 10)[0].tolist() == []


def test_backlogs_read_the_feed_from_a_seq_and_say_where_the_next_read_starts(store):
    store.put_subscription("s", "alice", b"[]")
    s = store.subscription_number("s")
    pubs = store.append_publications(published(b"{}", b"{}", b"{}"))
    seqs = []
    for pub in pubs:  # one feed entry each
        store.record_round(Round([s], [pub], pub))
        seqs.append(store.last_feed_seq())
    found, reached = store.backlogs(np.array([s]), np.array([0]), 10, from_seq=seqs[1])[1::2]
    assert found.tolist() == pubs[1:] and reached == seqs[2]  # the entries before seqs[1] are not read
    found, reached = store.backlogs(np.array([s]), np.array([0]), 1)[1::2]
    assert found.tolist() == pubs[:1] and reached == seqs[0]  # filled up in the first: more may be there


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 6), st.integers(0, 8), st.integers(1, 5))
def test_reads_of_a_queue_in_turns_deliver_it_whole_across_spilled_rows_and_the_feed(spilled, fed, limit):
    """A connection reads its queue `limit` at a time, each read after the last publication it got
    and from the feed seq the read before said: spilled rows and feed rows together, in order, none
    skipped (a read that took its cap from the feed as if no spilled row came first went past the
    publications it then dropped)."""
    with tempfile.TemporaryDirectory() as path:
        store = open_store(f"sqlite:///{path}/veil.db")
        store.put_subscription("s", "alice", b"[]")
        s = store.subscription_number("s")
        pubs = store.append_publications(published(*[b"{}"] * (spilled + fed)))
        for pub in pubs[:spilled]:
            store.record_round(Round([s], [pub], pub))
        spill_everything(store)
        for pub in pubs[spilled:]:  # one feed entry each
            store.record_round(Round([s], [pub], pub))
        got: list[int] = []
        after, since = 0, 0
        for _ in range(len(pubs) + 2):
            _, found, _, reached = store.backlogs(np.array([s]), np.array([after]), limit, from_seq=since)
            got += found.tolist()
            if len(found) < limit:
                break
            after, since = got[-1], reached
        store.close()
        assert got == pubs


def test_compaction_spills_only_what_was_not_consumed(store):
    store.put_subscription("s", "alice", b"[]")
    store.put_subscription("t", "bob", b"[]")
    s, t = store.subscription_number("s"), store.subscription_number("t")
    pubs = store.append_publications(published(b'{"n":1}', b'{"n":2}', b'{"n":3}', b'{"n":4}'))
    store.record_round(Round([s, s, t], [pubs[0], pubs[1], pubs[1]], pubs[2]))
    store.save_cursors({store.subscription_number("s"): pubs[1]})
    assert store.compact(1000, 1 << 40, time.time() - 60) == 0  # too young to spill, so nothing else goes
    spill_everything(store, fanned_out=0)
    assert store.last_feed_seq() == 1  # not fanned out yet: the feed entry stays
    spill_everything(store)
    assert store.feed_since(0, 10) == []
    assert backlog(store, store.subscription_number("s"), 0, 10)[0] == []
    assert [pub for pub, *_ in backlog(store, store.subscription_number("t"), 0, 10)[0]] == [pubs[1]]
    # publication 1 was consumed by everyone; 2 waits in t's queue; 4 is not processed yet
    assert [e.offset for e in store.log_range(0, pubs[-1]) if e.kind == 0] == pubs[1:]
    store.save_cursors({store.subscription_number("t"): pubs[1]})
    spill_everything(store)
    assert backlog(store, store.subscription_number("t"), 0, 10)[0] == []
    assert [e.offset for e in store.log_range(0, pubs[-1]) if e.kind == 0] == [pubs[3]]


def test_matches_for_removed_subscriptions_are_dropped(store):
    store.put_subscription("s", "alice", b"[]")
    old = store.subscription_number("s")
    (pub,) = store.append_publications(published(b"{}"))
    store.remove_subscription("s", "alice")
    # computed before the unsubscription, written after
    store.record_round(Round([old], [pub], pub))
    store.put_subscription("s", "alice", b"[]")
    for number in (old, store.subscription_number("s")):
        assert backlog(store, number, 0, 10)[0] == []
    spill_everything(store)
    for number in (old, store.subscription_number("s")):
        assert backlog(store, number, 0, 10)[0] == []


def test_a_freed_id_taken_again_is_a_new_subscription_with_a_new_number(store):
    """Nothing of alice's subscription reaches mallory's under the same id: not its queue (spilled or
    in the feed, matched before or after the unsubscription), not its cursor; yet mallory's own
    matches of publications logged before the unsubscription (validity's initial matches) are hers."""
    first = store.put_subscription("x", "alice", b"[]")
    alice = store.subscription_number("x")
    pubs = store.append_publications(published(*(b'{"n":%d}' % n for n in range(4))))
    store.record_round(Round([alice, alice], pubs[:2], pubs[1]))
    spill_everything(store)
    store.record_round(Round([alice], [pubs[2]], pubs[2]))  # still in the feed
    replaced = store.put_subscription("x", "alice", b'[["n","ge",0]]')
    assert store.subscription_number("x") == alice  # her replacement keeps its queue
    now = time.time()
    store.take_over_gateway("A", "a1", 0)
    assert store.claim_subscriptions(["x"], [alice], "A", now, now - 10) is None  # alice's connection, through A
    store.remove_subscription("x", "alice")
    store.record_round(Round([alice], [pubs[3]], pubs[3]))  # matched before the unsubscription was processed
    taken = store.put_subscription("x", "mallory", b"[]")
    mallory = store.subscription_number("x")
    assert mallory > alice
    assert (store.subscription_number("x", "mallory"), store.subscription_number("x", "alice")) == (mallory, None)
    assert backlog(store, mallory, 0, 10)[0] == [] and backlog(store, alice, 0, 10)[0] == []
    assert store.backlogs(np.array([alice, mallory]), np.zeros(2, np.int64), 10)[1].tolist() == []
    store.save_cursors({alice: pubs[3]})  # a late save of alice's session
    assert store.cursor("x") == 0
    assert store.claim_subscriptions(["x"], [mallory], "B", now, now - 10) is None  # alice's claim went with hers
    assert store.claim_subscriptions(["x"], [alice], "A", now, now - 10) == ("x", None)  # whose and where: not hers
    initial = StatefulBatch([], [(mallory, pubs[0], None)], [], None, None)  # of a still-valid publication
    store.record_round(Round([], [], taken, stateful=initial))
    spill_everything(store)
    assert [p for p, *_ in backlog(store, mallory, 0, 10)[0]] == [pubs[0]]
    assert store.subscriptions_at(replaced) == [("x", alice, "alice", b'[["n","ge",0]]')]
    assert store.subscriptions_at(taken) == [("x", mallory, "mallory", b"[]")]
    numbers = [e.number for e in store.log_range(first - 1, taken) if e.kind == KIND_SUBSCRIBE]
    assert numbers == [alice, alice, mallory]
    given = {alice, mallory}
    for owner in ("mallory", "alice", "alice"):  # freed and taken again, by anyone: never a number twice
        store.remove_subscription("x", store.subscription_owner("x"))
        store.put_subscription("x", owner, b"[]")
        given.add(store.subscription_number("x", owner))
    assert len(given) == 5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("xy"), st.sampled_from(["alice", "mallory"]), st.booleans()), max_size=30))
def test_numbers_follow_owners_and_creations(steps):
    """Against a model: an owner's replacement keeps the number, every other new subscription gets
    one never given before, someone else's live id is refused, and a lookup or an unsubscription by
    anyone but the owner is answered as for an id nobody holds."""
    with tempfile.TemporaryDirectory() as directory:
        store = open_store(f"sqlite:///{directory}/veil.db")
        live: dict[str, tuple[str, int]] = {}
        given_out: set[int] = set()
        try:
            for sub_id, owner, put in steps:
                held = live.get(sub_id)
                if put and held is not None and held[0] != owner:
                    with pytest.raises(NotOwner):
                        store.put_subscription(sub_id, owner, b"[]")
                elif put:
                    store.put_subscription(sub_id, owner, b"[]")
                    number = store.subscription_number(sub_id, owner)
                    if held is None:
                        assert number not in given_out
                        given_out.add(number)
                    else:
                        assert number == held[1]
                    live[sub_id] = (owner, number)
                elif held is None or held[0] != owner:
                    with pytest.raises(UnknownSubscription):
                        store.remove_subscription(sub_id, owner)
                else:
                    store.remove_subscription(sub_id, owner)
                    del live[sub_id]
                for each in "xy":
                    for who in ("alice", "mallory"):
                        expected = live[each][1] if each in live and live[each][0] == who else None
                        assert store.subscription_number(each, who) == expected
        finally:
            store.close()


def test_replacing_a_subscription_keeps_its_queue(store):
    store.put_subscription("s", "alice", b"[]")
    (pub,) = store.append_publications(published(b"{}"))
    store.record_round(Round([store.subscription_number("s")], [pub], pub))
    store.put_subscription("s", "alice", b'[["a","eq",1]]')
    assert [p for p, *_ in backlog(store, store.subscription_number("s"), 0, 10)[0]] == [pub]
    spill_everything(store)
    assert [p for p, *_ in backlog(store, store.subscription_number("s"), 0, 10)[0]] == [pub]


def test_a_replay_over_a_longer_range_adds_only_the_new_matches(store):
    store.put_subscription("s", "alice", b"[]")
    s = store.subscription_number("s")
    pubs = store.append_publications(published(b"{}", b"{}"))
    store.record_round(Round([s], pubs[:1], pubs[0]))
    store.record_round(Round([s, s], pubs, pubs[1]))
    assert [e.pubs.tolist() for e in store.feed_since(0, 10)] == [[pubs[0]], [pubs[1]]]


def test_the_feed_watermark_survives_compaction(store):
    store.put_subscription("s", "alice", b"[]")
    (pub,) = store.append_publications(published(b"{}"))
    store.record_round(Round([store.subscription_number("s")], [pub], pub))
    store.save_cursors({store.subscription_number("s"): pub})
    spill_everything(store)
    assert store.feed_since(0, 10) == []
    assert store.last_feed_seq() == 1 and backlog(store, store.subscription_number("s"), 0, 10) == ([], 1)


def test_a_large_feed_entry_is_spilled_in_steps_of_whole_subscriptions(store):
    for sub_id in "stu":
        store.put_subscription(sub_id, "alice", b"[]")
    s, t, u = (store.subscription_number(x) for x in "stu")
    pubs = store.append_publications(published(b"{}", b"{}"))
    store.record_round(Round([s, s, t, t, u, u], pubs * 3, pubs[1]))
    # a budget of 3 ends inside t: s and t go in the first step, u in the second
    assert store.compact(3, 1 << 40, time.time() + 1) >= 3
    assert store.feed_since(0, 10) != []
    assert [p for p, *_ in backlog(store, store.subscription_number("t"), 0, 10)[0]] == pubs
    store.compact(3, 1 << 40, time.time() + 1)
    assert store.feed_since(0, 10) == []
    assert all([p for p, *_ in backlog(store, store.subscription_number(x), 0, 10)[0]] == pubs for x in "stu")


def test_top_k_deliveries_are_logged_copies_recorded_once_with_their_skybands(store):
    store.put_subscription("s", "alice", b"[]")
    s = store.subscription_number("s")
    old, new = store.append_publications([Publication(b'{"v":1}', "bob", "k1", "c2ln"), Publication(b"{}")])
    batch = StatefulBatch([(s, old, None), (s, new, b'{"cut":1}')], [], [(s, b"band")], old, 123)
    store.record_round(Round([], [], new, stateful=batch))
    store.record_round(Round([], [], new, stateful=batch))  # the same batch replayed
    rows, _ = backlog(store, store.subscription_number("s"), 0, 10)
    assert [(body, origin) for _, body, origin in rows] == [
        (b'{"v":1}', Origin("bob", "k1", "c2ln", copy_of=old)),
        (b'{"cut":1}', Origin("", None, None, copy_of=new, cropped=True)),
    ]
    assert all(pub > new for pub, _, _ in rows)  # queued under their own offsets, in decision order
    assert store.subscription_states([s, 999]) == {s: b"band"}
    assert store.due() == 123
    store.save_cursors({store.subscription_number("s"): rows[-1][0]})
    store.compact(1000, store.last_feed_seq(), time.time() + 10)
    assert store.bodies(np.array([old]))  # a skyband still holds it
    store.record_round(Round([], [], rows[-1][0], stateful=StatefulBatch([], [], [(s, None)], None, None)))
    store.compact(1000, store.last_feed_seq(), time.time() + 10)
    assert not store.bodies(np.array([old])) and store.subscription_states([s]) == {}


def test_each_partition_records_its_own_progress_and_the_pipeline_is_at_the_least(store):
    store.put_subscription("s", "alice", b"[]")
    s = store.subscription_number("s")
    pubs = store.append_publications(published(*[b"{}"] * 4))
    assert store.set_partitions(2) == [0, 0]
    store.record_round(Round([s], [pubs[0]], pubs[2], part=0))
    assert store.partition_offset(0) == pubs[2] and store.partition_offset(1) == 0
    assert store.processed_offset() == 0  # partition 1 has recorded nothing yet
    store.record_round(Round([s], [pubs[0]], pubs[2], part=0))  # the same round again: nothing twice
    store.record_round(Round([], [], pubs[1], part=1))
    assert store.processed_offset() == pubs[1]
    assert [p for p, *_ in backlog(store, store.subscription_number("s"), 0, 10)[0]] == [pubs[0]]
    held = StatefulBatch([], [], [], pubs[0], 500)
    store.record_round(Round([], [], pubs[3], stateful=held, part=1))
    store.record_round(Round([], [], pubs[3], stateful=StatefulBatch([], [], [], None, 900), part=0))
    assert store.due() == 500 and store.processed_offset() == pubs[3]
    store.record_round(Round([], [], pubs[3] + 1, stateful=StatefulBatch([], [], [], None, None), part=1))
    assert store.due() == 900
    assert set(store.partition_beats()) == {0, 1}
    assert store.set_partitions(2) == [pubs[3], pubs[3] + 1]  # a restart keeps each one's progress
    assert store.set_partitions(3) == [pubs[3]] * 3  # a new count: all from the least


def test_a_silent_partition_is_adopted_and_its_own_task_takes_it_back(store):
    """Adoption compares the beat the adopter saw unchanged, never clocks: a beat since then wins."""
    store.set_partitions(2)
    store.own_partition(0, 11)
    seen = store.partition_beats()[0]
    time.sleep(0.002)
    store.partition_beat([0])  # heard from again after the adopter looked
    assert not store.adopt_partition(0, 22, seen)
    assert store.adopt_partition(1, 22, None)  # never heard from
    assert store.partition_owners() == {0: 11, 1: 22}
    assert store.adopt_partition(0, 22, store.partition_beats()[0])  # its last beat, seen unchanged
    store.own_partition(0, 11)  # its own task started (again)
    assert store.partition_owners() == {0: 11, 1: 22}
    store.cut_epoch(lost=True)
    owners, beats, cuts = store.partition_ownership()
    assert owners == {0: 11, 1: 22} and beats == store.partition_beats() and set(beats) == {0, 1}
    assert cuts == store.epoch_cuts() == (1, 1)
    store.partition_beat([])  # a task that holds nothing says nothing


def test_a_task_waiting_for_the_log_wakes_when_it_moves(store):
    """The matcher tasks' wait: at once when the head is already past, at the timeout when nothing
    comes, and soon after an append (a signal on PostgreSQL, a poll on SQLite), whichever store
    connection appended it."""
    store.append_publications(published(b"{}"))
    head = store.head_offset()
    assert store.wait_for_log(head - 1, 10) == head  # already past: no wait
    began = time.monotonic()
    assert store.wait_for_log(head, 0.3) == head
    assert 0.25 <= time.monotonic() - began < 5
    woke: list[tuple[int, float]] = []
    waiter = threading.Thread(target=lambda: woke.append((store.wait_for_log(head, 10), time.monotonic())))
    waiter.start()
    time.sleep(0.3)
    appending = time.monotonic()  # the waiter may wake before append_publications returns
    (pub,) = store.append_publications(published(b"{}"))
    waiter.join()
    assert woke and woke[0][0] == pub and appending <= woke[0][1] < appending + 5
    for _ in range(50):  # signals taken in while nobody waited cost the next wait nothing
        store.append_publications(published(b"{}"))
    began = time.monotonic()
    assert store.wait_for_log(store.head_offset(), 0.3) == store.head_offset()
    assert 0.25 <= time.monotonic() - began < 5


def test_a_round_that_began_behind_the_recorded_progress_is_dropped_whole(store):
    store.put_subscription("s", "alice", b"[]")
    s = store.subscription_number("s")
    pubs = store.append_publications(published(*[b"{}"] * 3))
    store.set_partitions(1)
    store.record_round(Round([s], [pubs[0]], pubs[0], part=0, start=0))
    # another task matched from 0 as well and got further: its round is not recorded at all
    late = StatefulBatch([(s, pubs[1], None)], [], [(s, b"band")], None, None)
    store.record_round(Round([s, s], pubs[:2], pubs[1], stateful=late, part=0, start=0))
    assert store.partition_offset(0) == pubs[0] and store.subscription_states([s]) == {}
    store.record_round(Round([s], [pubs[1]], pubs[1], part=0, start=pubs[0]))
    assert [p for p, *_ in backlog(store, store.subscription_number("s"), 0, 10)[0]] == pubs[:2]


def test_a_round_is_recorded_only_while_its_task_owns_the_partition(store):
    """A task paused while another adopted its partition comes back with a round in hand: the store
    drops it whole, whatever it carries, and the owner's round is recorded."""
    store.put_subscription("s", "alice", b"[]")
    s = store.subscription_number("s")
    pubs = store.append_publications(published(*[b"{}"] * 2))
    store.set_partitions(2)
    store.own_partition(1, 11)
    assert store.adopt_partition(1, 22, store.partition_beats()[1])
    stale = StatefulBatch([(s, pubs[0], None)], [], [(s, b"band")], None, None)
    assert not store.record_round(Round([s], [pubs[0]], pubs[1], stateful=stale, part=1, start=0, owner=(1, 11)))
    assert store.partition_offset(1) == 0 and store.subscription_states([s]) == {}
    assert store.pipeline_status().quarantined == 0
    assert store.record_round(Round([s], [pubs[0]], pubs[1], part=1, start=0, owner=(1, 22)))
    assert [p for p, *_ in backlog(store, s, 0, 10)[0]] == pubs[:1]


def test_an_epoch_knows_which_partitions_were_claimed_and_which_reached_its_deadline(store):
    store.set_partitions(3)
    assert store.claim_partitions(1000, 0, 2, 3, [0, 2]) == [0, 2]
    assert store.claim_partitions(1000, 1, 2, 3, [0, 1, 2]) == [1]  # what another task claimed is not taken
    store.end_leases([0, 2], 1000)
    assert store.leases(1000) == ({0, 1, 2}, {0, 2})
    store.end_leases([1], 1000)
    assert store.leases(1000) == ({0, 1, 2}, {0, 1, 2})
    store.claim_partitions(2000, 0, 2, 3, [1])
    assert store.leases(2000) == ({1}, set())  # the next epoch's: only its own marks count
    assert store.leases(500) == (set(), set())  # nor a later epoch's for an earlier one


def test_a_task_claims_its_own_partitions_again_and_no_more_than_its_share(store):
    """A retried task (a new attempt of the same task number) gets back what its first attempt
    claimed; shares are as even as they go, whichever task comes first; each claim counts the task
    as arrived, once."""
    store.set_partitions(5)
    assert store.claim_partitions(7, 0, 4, 5, [3]) == [3]
    assert store.claim_partitions(7, 1, 4, 5, [4, 0, 1, 2]) == [0, 4]  # 5 on 4 tasks: one runs two
    assert store.claim_partitions(7, 2, 4, 5, range(5)) == [1]  # the others one each
    assert store.arrivals(7) == 3
    assert store.claim_partitions(7, 0, 4, 5, []) == [3]  # a retried attempt: its own again
    assert store.claim_partitions(7, 3, 4, 5, range(5)) == [2]
    assert store.claim_partitions(7, 4, 4, 5, range(5)) == []  # an extra task: nothing is left
    assert (store.arrivals(7), store.arrivals(8)) == (5, 0)
    assert store.claim_partitions(8, 1, 4, 5, [0]) == [0]  # a new epoch: nothing claimed yet


def test_a_claimed_range_never_recorded_is_claimed_again_by_its_partition(store):
    pubs = store.append_publications(published(*[b"{}"] * 6))
    store.set_partitions(1)
    assert store.claim_range(2, 0) == (0, pubs[1])
    assert store.claim_range(2, 1) == (pubs[1], pubs[3])
    assert store.claim_range(2, 1) == (pubs[1], pubs[3])  # not recorded: the same range again
    store.record_round(Round([], [], pubs[1], part=0))
    assert store.claim_range(2, 0) == (pubs[3], pubs[5])  # partition 0's range is recorded: the next
    store.set_partitions(1)  # a restart: claims are void, ranges start again from the progress
    assert store.claim_range(9, 1) == (pubs[1], pubs[5])


def test_valid_publications_are_kept_for_the_subscriptions_to_come(store):
    kept, plain, withdrawn = store.append_publications(
        [Publication(b'{"n":1}', "bob", valid_for=60_000), Publication(b'{"n":2}', "bob"),
         Publication(b'{"n":3}', "bob", valid_for=60_000)]
    )  # fmt: skip
    now = time.time_ns() // 1_000_000
    with pytest.raises(NotOwner):
        store.cancel_publication(withdrawn, "mallory")
    with pytest.raises(UnknownPublication):
        store.cancel_publication(plain, "bob")
    before = store.put_subscription("s", "alice", b"[]")
    cancel = store.cancel_publication(withdrawn, "bob")
    with pytest.raises(UnknownPublication):
        store.cancel_publication(withdrawn, "bob")
    assert [pub for pub, _, _ in store.valid_at(before, now)] == [kept, withdrawn]  # withdrawn after it
    assert store.valid_at(cancel + 1, now) == [(kept, b'{"n":1}', "bob")]
    assert store.valid_at(cancel + 1, now + 60_000) == []  # expired by then
    store.record_round(Round([], [], cancel))
    store.compact(1000, store.last_feed_seq(), time.time() + 10)
    assert set(store.bodies(np.array([kept, plain, withdrawn]))) == {kept}


def test_subscribe_entries_carry_the_number_their_matches_use(store):
    store.put_subscription("s", "alice", b"[]")
    store.put_subscription("t", "alice", b"[]")
    store.put_subscription("s", "alice", b"[1]")
    entries = store.log_range(0, store.head_offset())
    assert [e.number for e in entries] == [store.subscription_number(x) for x in "sts"]


def test_the_pipeline_status_is_what_it_registered_and_beat(store):
    assert store.pipeline_status() == PipelineStatus(0, 0.0, 0, None)
    store.register_pipeline(4242)
    store.heartbeat(1234, [2, 0])
    status = store.pipeline_status()
    assert (status.pid, status.quiet_since) == (4242, 1234) and abs(status.heartbeat - time.time()) < 5
    assert status.dark == (0, 2)
    store.heartbeat(1235)
    assert store.pipeline_status().dark == ()
    assert store.batch_durations() == BatchDurations()
    for took in (40, 50, 51, 70_000, 100):  # a bucket holds durations up to its bound, inclusive
        store.record_round(Round([], [], 0, took_ms=took))
    assert store.batch_durations() == BatchDurations((2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1), 70_241)
    store.expect_pipeline()
    assert store.pipeline_status().pid == 0
    assert store.registry_file_digest() is None
    store.put_registry(b"{}", file_digest=77)
    assert store.registry_file_digest() == 77 and store.registry_at() == b"{}"


def test_a_store_that_named_its_state_for_top_k_is_migrated(tmp_path):
    """An earlier release kept the one stateful kind's state in `topk_bands` and `topk_*` status rows;
    a row of the new name (written while both releases ran) gives way to the older one's."""
    path = tmp_path / "old.db"
    open_store(f"sqlite:///{path}").close()
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE topk_bands (number INTEGER PRIMARY KEY, blob BLOB NOT NULL);
        INSERT INTO topk_bands VALUES (3, x'01'), (4, x'02');
        INSERT INTO subscription_state VALUES (3, x'ff');
        INSERT INTO status(name, value, updated) VALUES ('topk_held', 10, 0), ('topk_held.0', 10, 0),
            ('topk_due.0', 900, 0), ('topk_due', 900, 0), ('held.0', 99, 0);
        """
    )
    db.commit()
    db.close()
    store = open_store(f"sqlite:///{path}")
    try:
        assert store.subscription_states([3, 4]) == {3: b"\x01", 4: b"\x02"} and store.due() == 900
        names = dict(sqlite3.connect(path).execute("SELECT name, value FROM status WHERE name LIKE '%held%'"))
        assert names == {"held": 10, "held.0": 10}
    finally:
        store.close()


def test_a_store_that_kept_envelope_fragments_is_migrated(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE log (offset INTEGER PRIMARY KEY AUTOINCREMENT, kind INTEGER NOT NULL, sub_id TEXT,
            body BLOB, client TEXT, meta BLOB, time INTEGER);
        CREATE TABLE subscription_numbers (no INTEGER PRIMARY KEY, sub_id TEXT NOT NULL UNIQUE,
            reset INTEGER NOT NULL DEFAULT 0);
        INSERT INTO subscription_numbers(no, sub_id, reset) VALUES (7, 's', 2);
        CREATE TABLE subscriptions (sub_id TEXT NOT NULL, created INTEGER NOT NULL, deleted INTEGER,
            owner TEXT NOT NULL, body BLOB NOT NULL, PRIMARY KEY (sub_id, created));
        INSERT INTO subscriptions VALUES ('s', 3, NULL, 'alice', '[]');
        """
    )
    db.executemany(
        "INSERT INTO log(kind, sub_id, body, client, meta) VALUES (?, ?, ?, ?, ?)",
        [(0, None, b"{}", "bob", b'"publisher":"bob","keyId":"k","signature":"x"'),
         (5, None, b'{"a":1}', "bob", b'"id":"1","publisher":"bob","cropped":true'),
         (1, "s", b"[]", "alice", None)],
    )  # fmt: skip
    db.commit()
    db.close()
    store = open_store(f"sqlite:///{path}")
    try:
        bodies = store.bodies(np.array([1, 2]))
        assert bodies[1] == (b"{}", Origin("bob", "k", "x"), 0)  # 0: the old store kept no time
        assert bodies[2] == (b'{"a":1}', Origin("bob", None, None, copy_of=1, cropped=True), 0)
        assert store.log_range(2, 3)[0].number == 7
        # the id's one number had a floor, its last unsubscription: now the live subscription's cursor
        assert store.cursor("s") == 2 and store.subscription_number("s", "alice") == 7
        store.remove_subscription("s", "alice")
        store.put_subscription("s", "alice", b"[]")
        assert store.subscription_number("s") == 8
    finally:
        store.close()


def test_admissions_read_only_the_owners_live_subscriptions_with_refusal_and_cursor(store):
    store.put_subscription("a", "alice", b'[["n","ge",1]]')
    created = store.put_subscription("q", "alice", b"[]")
    store.put_subscription("b", "bob", b"[]")
    store.record_round(Round([], [], created, quarantined=[Quarantined(0, KIND_SUBSCRIBE, "q", None, "ValueError: x")]))
    (pub,) = store.append_publications(published(b'{"n":1}'))
    store.save_cursors({store.subscription_number("a"): pub})
    a, q, b, nobody = store.live_subscriptions(["a", "q", "b", "nobody"], "alice")
    assert a == (store.subscription_number("a"), b'[["n","ge",1]]', None, pub, False)
    assert q is not None and (q.refusal, q.cursor) == ("ValueError: x", 0)
    assert b is None and nobody is None  # someone else's, and nobody's, alike
    store.remove_subscription("a", "alice")
    assert store.live_subscriptions(["a"], "alice") == [None]
    assert store.live_numbers(["a", "b"]) == [None, store.subscription_number("b")]


def test_a_subscription_is_claimed_by_one_live_gateway_at_a_time(store):
    store.take_over_gateway("A", "a1", 7)
    store.take_over_gateway("B", "b1", 5)
    store.put_subscription("s", "o", b"[]")
    store.put_subscription("t", "o", b"[]")
    s, t = store.subscription_number("s"), store.subscription_number("t")
    now = time.time()
    assert store.fanned_out(now - 10) == 5
    assert store.claim_subscriptions(["s"], [s], "A", now, now - 10) is None
    assert store.claim_subscriptions(["s"], [s], "B", now + 1, now - 10) == ("s", "A")
    assert store.claim_subscriptions(["s"], [s], "A", now + 2, now - 10) is None  # a new connection through A
    store.release_subscriptions(["s"], "A", now)  # the older connection ends: the newer one's claim stays
    assert store.claim_subscriptions(["t", "s"], [t, s], "B", now + 3, now - 10) == ("s", "A")
    assert store.claim_subscriptions(["t"], [t], "A", now + 3, now - 10) is None  # all or none: B took no "t"
    # an earlier subscription of an id (or nobody's) is never claimed, nor told where the id is connected
    assert store.claim_subscriptions(["t", "s"], [t, 10**9], "B", now + 3, now - 10) == ("s", None)
    assert store.claim_subscriptions(["t", "u"], [t, 0], "B", now + 3, now - 10) == ("u", None)
    store.release_subscriptions(["t"], "A", now + 3)
    # A counts as gone: its claim lapsed
    assert store.claim_subscriptions(["t", "s"], [t, s], "B", now + 4, now + 60) is None
    assert store.fanned_out(now + 60) == 0
    store.leave("B", "b1")
    assert store.claim_subscriptions(["s", "t"], [s, t], "A", now + 5, now - 10) is None
    store.remove_subscription("s", "o")
    store.put_subscription("s", "o", b"[]")  # its owner's new subscription of the id
    assert store.claim_subscriptions(["s"], [s], "B", now + 6, now - 10) == ("s", None)  # the old one's claim
    assert store.fanned_out(now - 10) == 7


def test_a_gateways_name_is_held_by_one_process_at_a_time(store):
    """A process that took a crashed one's name over drops its claims; the crashed one, back, can
    neither renew the name nor, leaving, drop the new one's claims."""
    store.put_subscription("s", "o", b"[]")
    s, now = store.subscription_number("s"), time.time()
    assert not store.renew_gateway("A", "first", 3)  # a renewal makes no row: only a start does
    store.take_over_gateway("A", "first", 0)
    assert store.renew_gateway("A", "first", 3) and store.gateway_row("A")[1] == "first"
    assert store.claim_subscriptions(["s"], [s], "A", now, now - 10) is None
    store.take_over_gateway("A", "second", 4)
    assert store.gateway_row("A")[1] == "second"
    assert store.claim_subscriptions(["s"], [s], "B", now + 1, now - 10) is None  # the first one's claim went
    store.release_subscriptions(["s"], "B", now + 1)
    assert store.claim_subscriptions(["s"], [s], "A", now + 2, now - 10) is None  # the second one's
    assert not store.renew_gateway("A", "first", 9)
    store.leave("A", "first")
    assert store.gateway_row("A")[1] == "second" and store.fanned_out(now - 10) == 4
    assert store.claim_subscriptions(["s"], [s], "B", now + 3, now - 10) == ("s", "A")
    assert store.renew_gateway("A", "second", 5)
    store.leave("A", "second")
    assert store.gateway_row("A") is None
    assert not store.renew_gateway("A", "first", 6) and store.gateway_row("A") is None  # back, it stays out
    assert store.claim_subscriptions(["s"], [s], "B", now + 4, now - 10) is None


def test_one_pipeline_per_store_and_a_standby_takes_over(request, store):
    url = request.getfixturevalue("postgres_url") if "postgresql" in request.node.name else f"sqlite:///{store.path}"
    standby = open_store(url, create=False)
    try:
        assert store.claim_pipeline()
        assert store.claim_pipeline()  # still the one
        assert not standby.claim_pipeline()
        store.close()  # the first pipeline ends
        assert standby.claim_pipeline()
    finally:
        standby.close()


def test_totals_count_the_work_in_the_transactions_that_do_it(store):
    """Received, matched, queued and forwarded deliveries, kept in the store (they survive restarts);
    a replayed batch counts nothing twice."""
    for sub_id, owner in (("s", "alice"), ("t", "bob"), ("u", "bob")):
        store.put_subscription(sub_id, owner, b"[]")
    s, t = store.subscription_number("s"), store.subscription_number("t")
    pubs = store.append_publications(published(b"{}", b"{}", b"{}"))
    store.record_round(Round([s, t, s], [pubs[0], pubs[0], pubs[1]], pubs[2]))
    store.record_round(Round([s, t, s], [pubs[0], pubs[0], pubs[1]], pubs[2]))  # replayed
    store.save_cursors({store.subscription_number("s"): pubs[1]}, forwarded=3)
    assert store.totals() == Totals(received=3, matched=2, matches=3, forwarded=3, subscriptions=3, subscribers=2)


def test_a_dropped_subscription_quarantine_does_not_come_back(store):
    """The operator drops a quarantined subscription (removed first, then released) while a matcher
    that reloaded its state before reaching the removal fails on it again: it stays dropped."""
    created = store.put_subscription("poison", "alice", b"[]")
    (pub,) = store.append_publications(published(b'{"a":1}'))
    failure = Quarantined(0, KIND_SUBSCRIBE, "poison", None, "ValueError: boom")
    store.record_round(Round([], [], created, quarantined=[failure]))
    (record,) = store.quarantine()
    assert store.pipeline_status()[-2:] == (1, record.seq)
    assert store.subscription_refusal("poison") == "ValueError: boom"
    removed = store.remove_subscription("poison", "alice")
    assert store.release_quarantined(record.offset) and store.pipeline_status().quarantined == 0
    assert removed > pub
    store.record_round(Round([], [], pub, quarantined=[failure]))  # a round still before the removal
    assert store.pipeline_status().quarantined == 0


def test_a_dropped_publication_quarantine_does_not_come_back(store):
    """A publication the operator dropped from the quarantine is failed on again by a partition that
    was behind the others (or a round replayed): it stays dropped, listed nowhere, counted nowhere."""
    before = store.put_subscription("s", "alice", b"[]")
    store.record_round(Round([], [], before, part=1))  # partition 1 is behind
    (pub,) = store.append_publications(published(b'{"a":1}'))
    failure = Quarantined(pub, KIND_PUBLICATION, None, "bob", "RuntimeError: boom")
    store.record_round(Round([], [], pub, quarantined=[failure], part=0))
    (record,) = store.quarantine()
    assert store.release_quarantined(record.offset) and not store.release_quarantined(record.offset)
    store.record_round(Round([], [], pub, quarantined=[failure], part=1))
    assert store.pipeline_status().quarantined == 0 and store.quarantine() == [] and store.quarantined_at(pub) is None


def test_a_set_aside_subscription_gets_nothing_from_partitions_that_still_held_it(store):
    """Publication partitioning: partition 0 sets a subscription aside while another partition,
    matching a later slice at the same time, still held it and matched it. The later round's
    matches for it are dropped; another subscription's, and a later version's of the id, are not."""
    store.put_subscription("poison", "alice", b"[]")
    store.put_subscription("other", "bob", b"[]")
    bad, good = store.subscription_number("poison"), store.subscription_number("other")
    first, second = store.append_publications(published(b'{"a":1}', b'{"a":2}'))
    failure = Quarantined(0, KIND_SUBSCRIBE, "poison", None, "TimeoutError: took too long")
    assert store.record_round(Round([bad, good], [first, first], first, quarantined=[failure], start=0))
    copies = [(bad, second, b'{"a":2}')]
    assert store.record_round(Round([bad, good, bad], [second, second, second], second, copies, start=first))
    assert store.subscription_refusal("poison") == "TimeoutError: took too long"
    assert [pub for pub, *_ in backlog(store, good, 0, 10)[0]] == [first, second]
    assert backlog(store, bad, 0, 10)[0] == []
    again = store.put_subscription("poison", "alice", b"[]")  # a new version, same number: not set aside
    (third,) = store.append_publications(published(b'{"a":3}'))
    initials = StatefulBatch([], [(bad, first, None)], [], None, None)  # older than it, and its own
    assert store.record_round(Round([bad], [third], third, stateful=initials, start=second))
    assert store.subscription_number("poison") == bad and again > second
    assert [pub for pub, *_ in backlog(store, bad, 0, 10)[0]] == [first, third]


def test_webhook_subscriptions_are_found_unclaimed_followed_by_version_and_holder_and_dead_lettered(store):
    hook = Webhook("https://hooks.example/a", "whsec_1", 3)
    first = store.put_subscription("w", "alice", b"[]", webhook=hook, most_webhooks=2)
    store.put_subscription("plain", "alice", b"[]")
    store.put_subscription("v", "alice", b"[]", webhook=hook, most_webhooks=2)
    with pytest.raises(TooMany):  # alice's third
        store.put_subscription("x", "alice", b"[]", webhook=hook, most_webhooks=2)
    store.put_subscription("w", "alice", b"[]", webhook=hook, most_webhooks=2)  # (a replacement is no new one)
    w, v = store.subscription_number("w"), store.subscription_number("v")
    found = store.unclaimed_webhooks(time.time() - 10, 0, 10)
    assert [(f.sub_id, f.owner, f.webhook) for f in found] == [("w", "alice", hook), ("v", "alice", hook)]
    assert found[0].version > first and store.unclaimed_webhooks(time.time() - 10, w, 10)[0].sub_id == "v"
    store.take_over_gateway("g1", "i", 0)
    assert store.claim_subscriptions(["w"], [w], "g1", time.time(), time.time() - 10) is None
    assert [f.sub_id for f in store.unclaimed_webhooks(time.time() - 10, 0, 10)] == ["v"]
    versions = store.webhook_versions([w, v, store.subscription_number("plain")], time.time() - 10)
    assert versions == {w: (found[0].version, "g1"), v: (found[1].version, None)}
    live = store.live_subscriptions(["w", "plain"], "alice")
    assert [one.webhook for one in live] == [True, False]
    pubs = store.append_publications(published(b'{"n":1}', b'{"n":2}', b'{"n":3}'))
    assert store.dead_letter_unsent(w, pubs[:2], pubs[2], 1000) == 2
    letters, _ = store.dead_letters(w)
    assert [(d.pub, d.reason) for d in letters] == [(pubs[0], "attempts"), (pubs[1], "attempts")]
    assert store.cursor("w") == pubs[2] and store.totals().dead_lettered[-1] == 2
    store.put_subscription("w", "alice", b"[]")  # without one now
    store.remove_subscription("v", "alice")
    assert store.unclaimed_webhooks(0, 0, 10) == [] and store.webhook_versions([w, v], 0) == {}
    assert store.dead_letter_unsent(v, pubs, pubs[-1], 1000) == 0  # removed: nothing to dead-letter for
