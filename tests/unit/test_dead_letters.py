"""Bounded queues in the store, on each dialect: spilled deliveries are counted with their sizes,
what a queue holds past its bounds (its subscriber's, within the operator's) leaves for its dead
letters with the reason, oldest first, never past what may be in flight, and the dead letters are
read whole, purged and replayed in their order."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest

from veil.matching.stored import encode_subscription
from veil.pipeline.match import match_round
from veil.pipeline.worker_state import State
from veil.store import KIND_REDELIVER, DeadLetter, LogEntry, Publication, QueueBounds, Round

WIDE = QueueBounds(10**9, 10**12, 10**12)


def queued(store, sub_id: str, bodies: list[bytes], publisher: str = "bob") -> tuple[int, list[int]]:
    """A subscription of `sub_id`'s with these publications matched and spilled into its queue."""
    number = store.subscription_number(sub_id)
    pubs = store.append_publications([Publication(body, publisher) for body in bodies])
    store.record_round(Round([number] * len(pubs), pubs, store.head_offset()))
    while store.compact(1000, 1 << 40, time.time() + 10):
        pass
    return number, pubs


def backlog(store, number: int, after: int = 0) -> list[int]:
    return store.backlogs(np.array([number]), np.array([after]), 1000)[1].tolist()


def test_past_its_count_and_bytes_the_oldest_deliveries_leave_whole_with_the_reason(store):
    store.put_subscription("s", "alice", b"[]", bounds=QueueBounds(3, 10**9, 10**12))
    store.put_subscription("t", "alice", b"[]")
    number, pubs = queued(store, "s", [b'{"n":%d}' % n for n in range(5)])
    other, others = queued(store, "t", [b'{"n":%d}' % n for n in range(5)])
    now = time.time_ns() // 1_000_000
    assert store.bound_queues(WIDE._replace(bytes=16), now, time.time() - 10, 1000) == 3 + 3
    assert backlog(store, number) == pubs[3:]  # its own bound, three, then the operator's 16 bytes (8 each)
    assert backlog(store, other) == others[3:]  # the operator's bytes only
    letters = store.dead_letters(number)[0]
    assert [(d.pub, d.reason, d.body) for d in letters] == [
        (pubs[0], "deliveries", b'{"n":0}'), (pubs[1], "deliveries", b'{"n":1}'), (pubs[2], "bytes", b'{"n":2}')
    ]  # fmt: skip
    assert letters[0].origin.publisher == "bob" and letters[0].at >= now - 1000
    assert [d.reason for d in store.dead_letters(other)[0]] == ["bytes"] * 3
    assert store.bound_queues(WIDE._replace(bytes=16), now, time.time() - 10, 1000) == 0  # within them now


def test_past_its_age_deliveries_leave_and_only_after_the_floor(store):
    store.put_subscription("s", "alice", b"[]", bounds=QueueBounds(10**6, 10**9, 60_000))
    number, pubs = queued(store, "s", [b"{}"] * 4)
    store.save_cursors({number: pubs[0]})  # delivered: not the queue's any more
    later = time.time_ns() // 1_000_000 + 61_000
    assert store.bound_held_queues({number: pubs[1]}, "g1", WIDE, later, 1000) == 0  # nobody holds it from g1
    assert store.bound_queues(WIDE, later, time.time() - 10, 1000) == 3
    assert backlog(store, number, pubs[0]) == [] and [d.reason for d in store.dead_letters(number)[0]] == ["age"] * 3


def test_a_held_queue_is_bounded_by_its_gateway_after_what_its_connection_read(store):
    store.put_subscription("s", "alice", b"[]", bounds=QueueBounds(1, 10**9, 10**12))
    number, pubs = queued(store, "s", [b"{}"] * 5)
    store.take_over_gateway("g1", "i1", 0)
    assert store.claim_subscriptions(["s"], [number], "g1", 1.0, time.time() - 10) is None
    now = time.time_ns() // 1_000_000
    assert store.bound_queues(WIDE, now, time.time() - 10, 1000) == 0  # held: its gateway's to bound
    assert store.bound_held_queues({number: pubs[1]}, "g2", WIDE, now, 1000) == 0  # not g2's
    assert store.bound_held_queues({number: pubs[1]}, "g1", WIDE, now, 1000) == 2  # what its connection read stays
    assert backlog(store, number) == pubs[:2] + pubs[4:]


def test_dead_letters_are_replayed_in_order_and_purged(store):
    store.put_subscription("s", "alice", b"[]", bounds=QueueBounds(1, 10**9, 10**12))
    number, pubs = queued(store, "s", [b'{"n":%d}' % n for n in range(4)])
    store.bound_queues(WIDE, time.time_ns() // 1_000_000, time.time() - 10, 1000)
    letters = store.dead_letters(number)[0]
    assert [d.pub for d in letters] == pubs[:3] and store.dead_letter_count(number) == 3
    assert store.dead_letters(number, letters[0].seq, 1) == ([letters[1]], letters[1].seq)
    assert store.replay_dead_letters("s", number + 1, letters[1].seq) == (0, 0)  # not its number
    head = store.head_offset()
    assert store.replay_dead_letters("s", number, letters[1].seq, most=1) == (1, 1)
    assert store.replay_dead_letters("s", number, letters[1].seq) == (1, 0)
    entries = store.log_range(head, store.head_offset())
    assert [(e.kind, e.number, e.body) for e in entries] == [
        (KIND_REDELIVER, number, b'{"n":0}'),
        (KIND_REDELIVER, number, b'{"n":1}'),
    ]
    assert store.bodies(np.array([entries[0].offset]))[entries[0].offset][1].copy_of == pubs[0]  # its id stays
    assert store.dead_letters(number)[0] == [letters[2]]
    assert store.purge_dead_letters(number) == 1 and store.dead_letters(number)[0] == []
    store.remove_subscription("s", "alice")
    assert store.replay_dead_letters("s", number) == (0, 0)


def test_a_dead_letter_holds_its_publication_until_it_goes_and_goes_past_the_age_bound(store):
    store.put_subscription("s", "alice", b"[]", bounds=QueueBounds(1, 10**9, 10**12))
    number, pubs = queued(store, "s", [b'{"n":0}', b'{"n":1}'])
    now = time.time_ns() // 1_000_000
    store.bound_queues(WIDE, now, time.time() - 10, 1000)
    store.save_cursors({number: pubs[1]})
    while store.compact(1000, 1 << 40, time.time() + 10):
        pass
    assert pubs[0] in store.bodies(np.array(pubs))  # held by the dead letter, as a queue holds it
    [letter] = store.dead_letters(number)[0]
    assert isinstance(letter, DeadLetter) and (letter.pub, letter.body) == (pubs[0], b'{"n":0}')
    assert store.bound_queues(WIDE._replace(age_ms=60_000), now + 59_000, time.time() - 10, 1000) == 0
    assert store.bound_queues(WIDE._replace(age_ms=60_000), now + 61_000, time.time() - 10, 1000) == 1
    assert store.dead_letters(number) == ([], None) and store.totals().dead_letters_expired == 1
    while store.compact(1000, 1 << 40, time.time() + 10):
        pass
    assert store.bodies(np.array(pubs)) == {}


def test_a_page_of_dead_letters_ends_before_its_byte_budget(store):
    store.put_subscription("s", "alice", b"[]", bounds=QueueBounds(1, 10**9, 10**12))
    number, pubs = queued(store, "s", [b'{"n":%d}' % n for n in range(5)])
    store.bound_queues(WIDE, time.time_ns() // 1_000_000, time.time() - 10, 1000)
    letters, following = store.dead_letters(number, 0, 10, 17)  # two of 8 bytes
    assert [d.pub for d in letters] == pubs[:2] and following == letters[-1].seq
    letters, following = store.dead_letters(number, following, 10, 1)  # one at least
    assert [d.pub for d in letters] == pubs[2:3]
    assert [d.pub for d in store.dead_letters(number, following)[0]] == pubs[3:4] and store.totals().dead_lettered[
        0
    ] == 4


@pytest.mark.parametrize("bounds", [QueueBounds(2, 10**9, 10**12), None])
def test_replacing_a_subscription_replaces_its_bounds(store, bounds):
    store.put_subscription("s", "alice", b"[]", bounds=QueueBounds(1, 10**9, 10**12))
    store.put_subscription("s", "alice", b"[]", bounds=bounds)
    number, pubs = queued(store, "s", [b"{}"] * 4)
    store.bound_queues(WIDE._replace(deliveries=3), time.time_ns() // 1_000_000, time.time() - 10, 1000)
    assert backlog(store, number) == pubs[2 if bounds else 1 :]


def test_a_replayed_dead_letter_is_queued_for_its_live_subscription_only():
    state = State(orjson.dumps({"users": {"alice": {}}, "rules": {"alice": [[]]}}), with_authorization=True)
    state.add("s", 7, "alice", encode_subscription([["n", "ge", 5]]))  # (what it matches now does not matter)
    entries = [
        LogEntry(10, KIND_REDELIVER, "s", b'{"n":1}', "bob", 0, 7),
        LogEntry(11, KIND_REDELIVER, "s", b'{"n":2}', "bob", 0, 6),  # an earlier subscription of the id's
        LogEntry(12, KIND_REDELIVER, "t", b'{"n":3}', "bob", 0, 8),  # none of this partition's
    ]
    done = match_round(state, entries, 12)
    assert list(zip(np.asarray(done.sub_nos).tolist(), np.asarray(done.pubs).tolist(), strict=True)) == [(7, 10)]
    state.set_registry(orjson.dumps({"users": {"alice": {}}, "rules": {}}))  # she may receive nothing now
    assert len(match_round(state, entries[:1], 13).pubs) == 0
