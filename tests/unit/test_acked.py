"""What a shared subscription's members acknowledged past its cursor, in the store, on each dialect:
kept with the cursors, dropped as the cursor passes them or with the subscription, never for a
subscription that is gone, and never made a dead letter (it was delivered)."""

from __future__ import annotations

import time

import numpy as np

from veil.store import Publication, QueueBounds, Round
from veil.store.base import DEAD_LETTER_REASONS

WIDE = QueueBounds(10**9, 10**12, 10**12)


def test_acknowledged_publications_are_kept_past_the_cursor_and_go_as_it_passes_them(store):
    store.put_subscription("s", "alice", b"[]")
    store.put_subscription("t", "alice", b"[]")
    s, t = store.subscription_number("s"), store.subscription_number("t")
    store.save_cursors({s: 3}, acked={s: [5, 7, 9], t: []})
    assert store.acked([s, t]) == {s: [5, 7, 9]}
    store.save_cursors({s: 7}, acked={s: [8]})
    assert store.acked([s]) == {s: [8, 9]}
    store.save_cursors({}, acked={s: [8, 12]})  # (kept once)
    assert store.acked([s]) == {s: [8, 9, 12]}
    store.remove_subscription("s", "alice")
    assert store.acked([s]) == {}
    store.save_cursors({}, acked={s: [20]})  # a subscription that is gone keeps nothing
    assert store.acked([s]) == {}


def test_an_acknowledged_publication_past_a_bound_leaves_its_queue_without_becoming_a_dead_letter(store):
    store.put_subscription("s", "alice", b"[]", bounds=QueueBounds(1, 10**9, 10**12))
    number = store.subscription_number("s")
    pubs = store.append_publications([Publication(b'{"n":%d}' % n, "bob") for n in range(4)])
    store.record_round(Round([number] * 4, pubs, store.head_offset()))
    while store.compact(1000, 1 << 40, time.time() + 10):
        pass
    store.save_cursors({}, acked={number: [pubs[1]]})
    assert store.bound_queues(WIDE, time.time_ns() // 1_000_000, time.time() - 10, 1000) == 3
    assert [d.pub for d in store.dead_letters(number)[0]] == [pubs[0], pubs[2]]
    assert store.backlogs(np.array([number]), np.array([0]), 1000)[1].tolist() == [pubs[3]]
    assert dict(zip(DEAD_LETTER_REASONS, store.totals().dead_lettered, strict=True))["deliveries"] == 2


def test_compaction_drops_what_a_cursor_moved_over_since(store):
    store.put_subscription("s", "alice", b"[]")
    number = store.subscription_number("s")
    store.save_cursors({number: 3}, acked={number: [5, 9]})
    store.save_cursors({number: 6})  # a connection of one, after the group
    store.compact(1000, 1 << 40, time.time() + 10)
    assert store.acked([number]) == {number: [9]}
