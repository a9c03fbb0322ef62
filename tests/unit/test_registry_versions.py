"""Registry versions in the store, on each dialect: a change based on a stale version is refused in
the same transaction that would write it (so writers racing from threads never lose one another's
change), and compaction keeps only the versions the pipeline may still read."""

from __future__ import annotations

import threading
import time

import numpy as np
import orjson
import pytest

from tests.unit.helpers import published
from veil.store import Round, StaleRegistry


def test_a_change_from_a_stale_version_is_refused_and_writes_nothing(store):
    assert store.newest_registry() == (0, None) and store.registry_version() == 0
    with pytest.raises(StaleRegistry):
        store.put_registry(b'{"admins":["x"]}', None, 5)  # none stored yet: the base is 0
    first = store.put_registry(b'{"admins":["a"]}', None, 0)
    second = store.put_registry(b'{"admins":["b"]}', None, first)
    head = store.head_offset()
    with pytest.raises(StaleRegistry) as stale:
        store.put_registry(b'{"admins":["c"]}', None, first)
    assert (stale.value.current, stale.value.base) == (second, first)
    assert store.newest_registry() == (second, b'{"admins":["b"]}') and store.registry_version() == second
    assert store.head_offset() == head  # nothing logged either
    assert store.put_registry(b'{"admins":["d"]}') > second  # the registry file's: unconditional


def test_writers_racing_from_threads_lose_no_change(store):
    """Each thread adds its own entries by read, edit, compare-and-set, again on refusal: every entry
    of every thread is in the newest version."""
    threads, changes = 4, 15

    def writer(name: str) -> None:
        for n in range(changes):
            while True:
                version, body = store.newest_registry()
                document = orjson.loads(body) if body else {"admins": []}
                document["admins"].append(f"{name}-{n}")
                try:
                    store.put_registry(orjson.dumps(document), None, version)
                    break
                except StaleRegistry:
                    continue

    workers = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    admins = orjson.loads(store.newest_registry()[1])["admins"]
    assert sorted(admins) == sorted(f"w{i}-{n}" for i in range(threads) for n in range(changes))


def test_compaction_keeps_the_version_in_force_at_the_processed_offset_and_later_ones(store):
    versions = [store.put_registry(orjson.dumps({"admins": [f"v{i}"]})) for i in range(4)]
    [pub] = store.append_publications(published(b'{"a":1}'))
    later = store.put_registry(b'{"admins":["later"]}')
    store.record_round(Round(np.array([], np.int64), np.array([], np.int64), pub))  # processed up to the publication
    while store.compact(1000, 1 << 40, time.time() + 1):
        pass
    assert store.registry_at(pub) == b'{"admins":["v3"]}' and store.registry_at(None) == b'{"admins":["later"]}'
    for gone in versions[:3]:
        assert store.registry_at(gone) is None  # superseded before the processed offset: no copy kept
    assert store.newest_registry()[0] == later
