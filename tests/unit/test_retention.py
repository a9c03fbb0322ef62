"""Retention and replay below the gateway: the store's page of the retained log a subscription asks
for (on each dialect), compaction keeping what the retention holds, the round core replaying it
under the registry in force at each publication, and the `since` the protocol takes."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest

from veil.matching.stored import decode_subscription, encode_subscription
from veil.pipeline.match import Initial, match_round
from veil.pipeline.worker_state import State
from veil.protocol import ProtocolError, parse_subscribe
from veil.store import KIND_PUBLICATION, KIND_SUBSCRIBE, LogEntry, Publication, Quarantined, Round, StatefulBatch
from veil.store.relational.log import CLOCKS_DIFFER


def _tick() -> int:
    """A moment strictly after everything logged so far (the log's clock is in ms)."""
    time.sleep(0.003)
    moment = time.time_ns() // 1_000_000
    time.sleep(0.003)
    return moment


def _all(store, offset: int, since: int, page: int = 1000) -> list[tuple[int, bytes, str, int]]:
    rows, after = [], 0
    while chunk := store.retained_since(offset, since, after, page):
        rows += chunk
        after = chunk[-1][0]
    return rows


def test_a_replay_reads_what_was_logged_since_in_order_without_the_quarantined_or_withdrawn(store):
    [early] = store.append_publications([Publication(b'{"n":0}', "bob")])
    since = _tick()
    version = store.put_registry(b'{"admins":["a"]}')
    pubs = store.append_publications(
        [Publication(f'{{"n":{n}}}'.encode(), "bob", valid_for=60_000 if n == 3 else None) for n in range(1, 8)]
    )
    store.record_round(Round([], [], pubs[0], quarantined=[Quarantined(pubs[1], KIND_PUBLICATION, None, "bob", "x")]))
    store.cancel_publication(pubs[2], "bob")  # withdrawn before the subscription
    sub = store.put_subscription("s", "alice", encode_subscription([], since=since))
    [later] = store.append_publications([Publication(b'{"n":9}', "bob")])
    rows = _all(store, sub, since, page=2)
    assert [row[0] for row in rows] == [pubs[0], *pubs[3:]]  # not early, not later, not quarantined or withdrawn
    assert rows[0] == (pubs[0], b'{"n":1}', "bob", version)  # with the registry version in force when logged
    assert early not in [row[0] for row in _all(store, later + 1, since)] and later in [
        row[0] for row in _all(store, later + 1, since)
    ]
    assert store.valid_at(sub, since, since) == []  # the valid one is the replay's, not also valid_at's
    assert [pub for pub, _, _ in store.valid_at(sub, since)] == [] and store.retained_since(sub, _tick()) == []


def test_compaction_keeps_what_the_retention_holds_and_the_registry_versions_in_force(store):
    versions = [store.put_registry(orjson.dumps({"admins": [f"v{i}"]})) for i in range(3)]
    old = store.append_publications([Publication(b'{"n":1}', "bob")])
    since = _tick()
    kept = store.append_publications([Publication(b'{"n":2}', "bob")])
    newest = store.put_registry(b'{"admins":["new"]}')
    store.record_round(Round([], [], store.head_offset()))
    while store.compact(1000, 1 << 40, time.time() + 1, since + CLOCKS_DIFFER):  # (it keeps that much more)
        pass
    assert set(store.bodies(np.array(old + kept))) == set(kept)  # before the retention: gone
    assert store.registry_at(kept[0]) == b'{"admins":["v2"]}'  # in force at a retained publication
    assert store.registry_at(versions[0]) is None and store.registry_at(None) == b'{"admins":["new"]}'
    assert [row[0] for row in _all(store, newest, since)] == kept
    while store.compact(1000, 1 << 40, time.time() + 1):  # no retention
        pass
    assert store.bodies(np.array(kept)) == {}


def test_a_match_queued_twice_is_read_once(store):
    """A replaced subscription's initial matches come again in a later feed row: a backlog read that
    finds both (the rows not yet spilled) gives each match once."""
    pubs = store.append_publications([Publication(b'{"n":1}'), Publication(b'{"n":2}')])
    store.put_subscription("s", "alice", b"[]")
    number = store.subscription_number("s")
    store.record_round(Round([number, number], pubs, pubs[1]))
    store.record_round(
        Round([], [], store.head_offset(), stateful=StatefulBatch([], [(number, pubs[0], None)], [], None, None))
    )
    sub_nos, queued, _, _ = store.backlogs(np.array([number]), np.array([0]), 10)
    assert queued.tolist() == pubs and sub_nos.tolist() == [number, number]


def test_compaction_keeps_what_subscriptions_the_pipeline_has_yet_to_reach_replay(store):
    pubs = store.append_publications([Publication(b'{"n":1}', "bob"), Publication(b'{"n":2}', "bob")])
    since = _tick()
    store.record_round(Round([], [], store.head_offset()))
    sub = store.put_subscription("s", "alice", encode_subscription([], since=since), since=since)
    assert store.replaying("alice") and not store.replaying("bob")
    past = _tick() + CLOCKS_DIFFER  # a retention that keeps neither
    while store.compact(1000, 1 << 40, time.time() + 1, past):
        pass
    assert set(store.bodies(np.array(pubs))) == set(pubs)  # its since, less the clocks' margin, holds them
    store.record_round(Round([], [], sub))
    assert not store.replaying("alice")
    while store.compact(1000, 1 << 40, time.time() + 1, past):
        pass
    assert store.bodies(np.array(pubs)) == {}


def test_an_empty_log_is_compacted_with_a_retention(store):
    assert store.compact(1000, 0, time.time(), _tick()) == 0
    assert store.logged_since(0) == 0


def _registry(allowed: bool) -> bytes:
    """Alice may receive everything, or nothing."""
    return orjson.dumps({"users": {"alice": {}}, "rules": {"alice": [[]]} if allowed else {}})


@pytest.mark.parametrize("now", [True, False])
def test_a_replay_is_authorized_under_the_registry_in_force_at_each_publication_and_now(now):
    """Alice could receive when the first publication was logged and not when the second one was:
    the replay gives her the first only, as live delivery would have; and nothing once she may
    receive nothing now (a right taken away since holds)."""
    state = State(_registry(now), with_authorization=True)
    body = encode_subscription([["n", "ge", 0]], since=1)
    page = [(1, b'{"n":1}', "bob", 10), (2, b'{"n":2}', "bob", 20), (3, b'{"x":1}', "bob", 10), (4, b"{", "bob", 10)]
    replay = Initial([(0, b'{"n":0}', "bob")], [(page, {10: _registry(True), 20: _registry(False)})])
    entry = LogEntry(5, KIND_SUBSCRIBE, "s", body, "alice", 0, 7)
    done = match_round(state, [entry], 5, {5: replay}, entry_timeout=5)
    initials = [] if done.stateful is None else [(n, p) for n, p, _ in done.stateful.initials]
    assert initials == ([(7, 0), (7, 1)] if now else [])
    assert not done.quarantined  # the unreadable publication is left out, the subscription stays


def test_a_replayed_copy_is_cropped_as_the_registry_in_force_crops_it_then_as_the_earlier_one_did():
    def cropping(*fields: str) -> bytes:
        crops = [{"data": [], "users": ["alice"], "fields": list(fields)}] if fields else []
        return orjson.dumps({"users": {"alice": {}}, "rules": {"alice": [[]]}, "cropping": {"bob": crops}})

    state = State(cropping("b"), with_authorization=True)
    replay = Initial([], [([(1, b'{"a":1,"b":2,"c":3}', "bob", 10)], {10: cropping("c")})])
    entry = LogEntry(5, KIND_SUBSCRIBE, "s", encode_subscription([], since=1), "alice", 0, 7)
    done = match_round(state, [entry], 5, {5: replay})
    [(_, _, copy)] = done.stateful.initials
    assert orjson.loads(copy) == {"a": 1}


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        (1764403200000, 1764403200000),
        ("2025-11-29T08:00:00Z", 1764403200000),
        ("2025-11-29T09:00:00.5+01:00", 1764403200500),
    ],
)
def test_since_is_milliseconds_or_an_rfc_3339_time(since, expected):
    assert parse_subscribe(orjson.dumps({"data": [], "since": since})).since == expected
    assert decode_subscription(encode_subscription([], since=expected)).since == expected


@pytest.mark.parametrize(
    "since", ["2025-11-29T08:00:00", "yesterday", -1, 1.5, True, 10**17, {"t": 1}, "9999-99-99T00:00:00Z"]
)
def test_a_bad_since_is_refused_by_name(since):
    with pytest.raises(ProtocolError) as refused:
        parse_subscribe(orjson.dumps({"data": [], "since": since}))
    assert refused.value.field == "since"


def test_since_is_refused_for_a_top_k_subscription():
    doc = {"data": [], "since": 1, "topk": {"k": 1, "w": 1000, "score": [{"key": "a", "prefer": "high"}]}}
    with pytest.raises(ProtocolError) as refused:
        parse_subscribe(orjson.dumps(doc))
    assert refused.value.field == "since"
