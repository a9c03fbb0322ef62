"""Idempotent publish in the store and the protocol: a publisher's key names one publication for the
window, however often and in whatever groups it is sent again; another publisher's equal key is
another publication."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from veil.protocol import ProtocolError, keyed, parse_publication, parse_publication_batch
from veil.store import KIND_PUBLICATION, Publication, open_store


def logged_bodies(store) -> list[bytes]:
    return [entry.body for entry in store.log_range(0, store.head_offset() + 1) if entry.kind == KIND_PUBLICATION]


def test_a_repeat_gets_the_first_offset_within_a_call_and_across_calls(store):
    first = store.append_publications(
        [
            Publication(b'{"n":1}', "pat", key="k"),
            Publication(b'{"n":2}', "pat"),
            Publication(b'{"n":3}', "pat", key="k"),  # a repeat in the same commit
            Publication(b'{"n":4}', "sam", key="k"),  # another publisher's key
        ]
    )
    assert first[0] == first[2] and len(set(first)) == 3
    again = store.append_publications([Publication(b'{"n":5}', "pat", key="k"), Publication(b'{"n":6}', "sam")])
    assert again[0] == first[0]
    assert logged_bodies(store) == [b'{"n":1}', b'{"n":2}', b'{"n":4}', b'{"n":6}']


def test_a_key_is_forgotten_after_its_window_and_swept(store):
    (first,) = store.append_publications([Publication(b'{"n":1}', "pat", key="k")], keys_kept=50)
    (kept,) = store.append_publications([Publication(b'{"n":2}', "pat", key="k")], keys_kept=50)
    assert kept == first
    time.sleep(0.1)
    (later,) = store.append_publications([Publication(b'{"n":3}', "pat", key="k")], keys_kept=50)
    assert later > first
    time.sleep(0.1)
    store.compact(1000, 0, time.time())
    with store._read() as db:  # (the window's end is the only bound on what keys cost the store)
        assert db.execute("SELECT COUNT(*) FROM idempotency").fetchone()[0] == 0
    (afresh,) = store.append_publications([Publication(b'{"n":4}', "pat", key="k")])
    assert afresh > later
    assert logged_bodies(store) == [b'{"n":1}', b'{"n":3}', b'{"n":4}']


def test_keys_survive_a_reopened_store(tmp_path):
    url = f"sqlite:///{tmp_path}/veil.db"
    store = open_store(url)
    (first,) = store.append_publications([Publication(b'{"n":1}', "pat", key="k")])
    store.close()
    store = open_store(url)
    try:
        assert store.append_publications([Publication(b'{"n":1}', "pat", key="k")]) == [first]
    finally:
        store.close()


calls = st.lists(
    st.lists(st.tuples(st.sampled_from(["pat", "sam"]), st.none() | st.sampled_from("abcde")), min_size=1, max_size=6),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls)
def test_every_key_names_one_publication_whatever_the_grouping(tmp_path_factory, groups):
    """Random commits of keyed and unkeyed publications by two publishers, against a model: each
    (publisher, key) is logged once and every repeat is answered with its first offset."""
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('keys')}/veil.db")
    try:
        first: dict[tuple[str, str], int] = {}
        logged = 0
        for group in groups:
            offsets = store.append_publications([Publication(b"{}", who, key=key) for who, key in group])
            for (who, key), offset in zip(group, offsets, strict=True):
                if key is None or (who, key) not in first:
                    logged += 1
                    if key is not None:
                        first[(who, key)] = offset
                assert key is None or offset == first[(who, key)]
        assert len(logged_bodies(store)) == logged
    finally:
        store.close()


def test_the_header_keys_a_request_and_a_batch_line_by_line():
    one = parse_publication(b'{"n": 1}')
    assert keyed([one], "order-7", batch=False) == ["order-7"]
    lines = parse_publication_batch(b'{"n": 1}\n\n{"n": 2}')
    assert keyed(lines, "order-7", batch=True) == ["order-7#1", "order-7#3"]
    assert keyed(lines, None, batch=True) == [None, None]


def test_lines_name_their_own_keys_and_bad_keys_are_refused_by_field():
    lines = parse_publication_batch(b'{"n": 1, "veil:key": "a"}\n{"n": 2}')
    assert keyed(lines, None, batch=True) == ["a", None]
    with pytest.raises(ProtocolError) as both:
        keyed(lines, "b", batch=True)
    assert both.value.field == "Idempotency-Key"
    for bad in (
        b'{"veil:key": ""}',
        b'{"veil:key": 7}',
        b'{"veil:key": "' + b"x" * 257 + b'"}',
        b'{"veil:key": "a\\n"}',
    ):
        with pytest.raises(ProtocolError) as refused:
            parse_publication_batch(b'{"n": 1}\n' + bad)
        assert refused.value.field == "line 2: veil:key"
    with pytest.raises(ProtocolError) as header:
        keyed([parse_publication(b"{}")], "", batch=False)
    assert header.value.field == "Idempotency-Key"
