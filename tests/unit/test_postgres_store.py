"""What only the PostgreSQL store has to prove: several processes write one store at once (each
store instance here stands for a gateway or the pipeline), its schema is versioned, and the
pipeline's feed is signalled."""

import threading
import time

import numpy as np
import psycopg
import pytest

from tests.unit.helpers import published
from veil.store import NotOwner, Publication, Round, StatefulBatch, StoreMissing, open_store, postgres
from veil.store.postgres import FEED_LOCK, LOG_LOCK, MIGRATIONS


@pytest.fixture
def stores(postgres_url):
    opened = [open_store(postgres_url) for _ in range(3)]
    yield opened
    for store in opened:
        store.close()


def test_concurrent_appends_become_visible_in_offset_order(stores):
    """A reader that has seen offset N has seen every entry below it, whichever writer made it: the
    pipeline reads up to the head once and never again below it."""
    writers, reader = stores[:2], stores[2]
    done = threading.Event()
    seen: list[tuple[int, list[int]]] = []

    def write(store, name: str) -> None:
        for n in range(150):
            if n % 10 == 0:
                store.put_subscription(f"{name}-{n}", name, b"[]")
            else:
                store.append_publications(published(*[f"{name}{n}.{i}".encode() for i in range(n % 4 + 1)]))

    def read() -> None:
        while not done.is_set():
            head = reader.head_offset()
            seen.append((head, [entry.offset for entry in reader.log_range(0, head)]))

    threads = [threading.Thread(target=write, args=(store, name)) for store, name in zip(writers, "ab", strict=True)]
    watcher = threading.Thread(target=read)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    final = [entry.offset for entry in reader.log_range(0, reader.head_offset())]
    assert len(final) == 2 * (15 + sum(n % 4 + 1 for n in range(150) if n % 10))
    assert final == sorted(set(final))
    assert len(seen) > 10
    for head, offsets in seen:
        assert offsets == [offset for offset in final if offset <= head]


def test_only_one_of_racing_owners_gets_a_subscription_id(stores):
    """Every round contests a fresh id, and the three claims leave a barrier together: a claim made
    after another had committed would test only the ownership check, not the race."""
    owners = "xyz"

    def claim(store, owner: str, sub_id: str, barrier: threading.Barrier, outcomes: dict[str, str]) -> None:
        barrier.wait(timeout=10)
        try:
            store.put_subscription(sub_id, owner, b"[]")
            outcomes[owner] = "owns it"
        except NotOwner:
            outcomes[owner] = "refused"

    for round_number in range(20):
        sub_id = f"contested-{round_number}"
        barrier = threading.Barrier(len(owners))
        outcomes: dict[str, str] = {}
        threads = [
            threading.Thread(target=claim, args=(store, owner, sub_id, barrier, outcomes))
            for store, owner in zip(stores, owners, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        winner = stores[0].subscription_owner(sub_id)
        assert winner in owners, (round_number, winner)
        assert outcomes == {owner: "owns it" if owner == winner else "refused" for owner in owners}, round_number
        assert all(store.subscription_owner(sub_id) == winner for store in stores)


def test_a_cursor_saved_while_its_subscription_goes_never_outlives_it(stores):
    """A gateway saving a cursor while another removes the subscription either saves it before (and
    the removal deletes it) or saves nothing, so a later subscription of the id starts from the
    beginning, not from where the removed one was; one saved while the owner replaces the
    subscription (same number) is kept."""
    saver, remover = stores[:2]
    for n in range(40):
        sub_id = f"gone-{n}"
        remover.put_subscription(sub_id, "alice", b"[]")
        number = remover.subscription_number(sub_id)
        start = threading.Barrier(2)

        def save(number: int = number, start: threading.Barrier = start) -> None:
            start.wait()
            for pub in range(1, 30):
                saver.save_cursors({number: 1_000_000 + pub}, acked={number: [2_000_000 + pub]})

        thread = threading.Thread(target=save)
        thread.start()
        start.wait()
        time.sleep(0.001 * (n % 8))
        remover.remove_subscription(sub_id, "alice")
        thread.join()
        remover.put_subscription(sub_id, "alice", b"[]")
        again = remover.subscription_number(sub_id)
        assert remover.cursor(sub_id) == 0 and remover.acked([number, again]) == {}
        replacing = threading.Thread(target=remover.put_subscription, args=(sub_id, "alice", b"[1]"))
        replacing.start()
        saver.save_cursors({again: 77})
        replacing.join()
        assert remover.cursor(sub_id) == 77


def test_concurrent_rounds_become_visible_in_feed_order(stores, postgres_url):
    """Two partitions' rounds, recorded while a group commit holds the log's lock, and a hub reading
    the feed: a hub that has read seq N never gets a row below it later (it reads from its last seq
    on)."""
    partitions, hub = stores[:2], stores[2]
    hub.set_partitions(2)
    pubs = hub.append_publications(published(*[b"{}"] * 60))
    done = threading.Event()
    seen: list[int] = []

    def record(store, part: int) -> None:
        for pub in pubs:
            store.record_round(Round(np.array([part + 1]), np.array([pub]), pub, part=part))

    def read() -> None:
        last = 0
        while not done.is_set():
            for entry in hub.feed_since(last, 100):
                seen.append(entry.seq)
                last = entry.seq

    threads = [threading.Thread(target=record, args=(store, part)) for part, store in enumerate(partitions)]
    reader = threading.Thread(target=read)
    with psycopg.connect(postgres_url) as appending:
        appending.execute("SELECT pg_advisory_xact_lock(%s)", (LOG_LOCK,))
        reader.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        appending.rollback()
    assert not any(thread.is_alive() for thread in threads)
    done.set()
    reader.join()
    every = [entry.seq for entry in hub.feed_since(0, 1000)]
    assert len(every) == 120
    assert seen == every[: len(seen)] and len(seen) > 10


def _held(lock: int, postgres_url: str, write, wait: float) -> bool:
    """Whether `write` finishes within `wait` seconds while another session holds `lock` (it must
    finish once the lock is free)."""
    with psycopg.connect(postgres_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
        finished = threading.Event()
        writer = threading.Thread(target=lambda: (write(), finished.set()))
        writer.start()
        beside = finished.wait(wait)
        holder.rollback()
    writer.join(30)
    assert finished.is_set()
    return beside


def test_publications_and_rounds_take_locks_of_their_own(stores, postgres_url):
    """A group commit of publications takes the log's lock alone; a round, a claim of a log range,
    a save of cursors and a gateway's renewal the feed's alone; a round logging copies for stateful
    subscriptions, and every other write, both."""
    store = stores[0]
    store.take_over_gateway("g", "i", 0)
    store.put_subscription("s", "owner", b"[]")
    rounds = iter(store.append_publications(published(*[b"{}"] * 8)))
    original = store.append_publications(published(b"{}"))[0]

    def round_(stateful: StatefulBatch | None = None) -> None:
        end = next(rounds)
        store.record_round(Round(np.array([1]), np.array([end]), end, part=3, stateful=stateful))

    writes = {
        "publish": lambda: store.append_publications(published(b"{}")),
        "publish with a key": lambda: store.append_publications([Publication(b"{}", key=f"k{time.monotonic()}")]),
        "round": round_,
        "claim a range": lambda: store.claim_range(10, 1),
        "save cursors": lambda: store.save_cursors({1: 1}),
        "renew": lambda: store.renew_gateway("g", "i", 1),
        "stateful round": lambda: round_(StatefulBatch([], [], [], None, None)),
        "stateful round logging a copy": lambda: round_(StatefulBatch([(1, original, None)], [], [], None, None)),
        "subscribe": lambda: store.put_subscription(f"s{time.monotonic()}", "owner", b"[]"),
        "unsubscribe": lambda: store.remove_subscription("s", "owner"),
    }
    log_only = {"publish", "publish with a key"}
    feed_only = {"round", "claim a range", "save cursors", "renew", "stateful round"}
    for name, write in writes.items():
        # (a write that runs beside a lock has 20 s to finish; one that waits is given 1 s)
        assert _held(LOG_LOCK, postgres_url, write, 20 if name in feed_only else 1) == (name in feed_only), name
    for name, write in writes.items():
        if name != "unsubscribe":
            assert _held(FEED_LOCK, postgres_url, write, 20 if name in log_only else 1) == (name in log_only), name


def test_a_write_of_both_waiting_for_a_round_holds_no_publication_up(stores, postgres_url):
    """A write of both locks takes the feed's first: while a round holds it, the write waits without
    the log's lock, and group commits of publications go on."""
    store, publisher = stores[0], stores[1]
    with psycopg.connect(postgres_url) as round_:
        round_.execute("SELECT pg_advisory_xact_lock(%s)", (FEED_LOCK,))
        subscribing = threading.Thread(target=lambda: store.put_subscription("s", "owner", b"[]"))
        subscribing.start()
        time.sleep(0.5)  # (the subscription waits for the feed's lock)
        published_while = threading.Event()
        publishing = threading.Thread(
            target=lambda: (publisher.append_publications(published(b"{}")), published_while.set())
        )
        publishing.start()
        assert published_while.wait(20)
        assert subscribing.is_alive()
        round_.rollback()
    subscribing.join(20)
    assert not subscribing.is_alive()


def test_a_feed_row_wakes_a_waiting_gateway(stores):
    gateway, pipeline = stores[0], stores[1]
    assert gateway.feed_signal
    assert gateway.wait_for_feed(0, 0.2) == 0
    woke: list[tuple[int, float]] = []

    seq = gateway.last_feed_seq()

    def wait() -> None:
        woke.append((gateway.wait_for_feed(seq, 10), time.monotonic()))

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    pub = pipeline.append_publications(published(b"{}"))[0]
    written = time.monotonic()
    pipeline.record_round(Round(np.array([1]), np.array([pub]), pub))
    waiter.join()
    assert woke and woke[0][0] > seq and written <= woke[0][1] < written + 5  # woken by the row, not the timeout
    assert gateway.wait_for_feed(0, 10) > 0  # a row already there: no wait


def test_a_waiter_whose_signals_are_lost_reads_the_counter_again(stores, monkeypatch):
    """A signal lost on the way (here: the listener stops listening) delays a waiter by REREAD
    seconds, not until the next write."""
    monkeypatch.setattr(postgres, "REREAD", 0.5)
    waiter, writer = stores[0], stores[1]
    head = waiter.wait_for_log(0, 0)
    waiter._log_listeners.listener.connection.execute("UNLISTEN *")
    offset = writer.append_publications(published(b"{}"))[0]
    began = time.monotonic()
    assert waiter.wait_for_log(head, 10) == offset
    assert time.monotonic() - began < 5


def test_a_large_feed_row_is_stored_uncompressed_and_read_back_whole(stores, postgres_url):
    """Compressing a round's feed row cost PostgreSQL more than it saved (pglz: 70 ms to insert a row
    of a million matches, 11 stored as it is), while the round held the feed's lock."""
    gateway, pipeline = stores[0], stores[1]
    first = pipeline.append_publications(published(*[b"{}"] * 300))[0]
    sub_nos = np.repeat(np.arange(1, 513, dtype=np.int64), 300)
    pubs = np.tile(np.arange(first, first + 300, dtype=np.int64), 512)
    pipeline.record_round(Round(sub_nos, pubs, first + 299))
    with psycopg.connect(postgres_url) as db:
        stored, size = db.execute("SELECT pg_column_size(pairs), octet_length(pairs) FROM feed").fetchone()
    assert size > 100_000 and stored == size  # out of line, as it is
    (entry,) = gateway.feed_since(0, 10)
    assert sorted(zip(entry.sub_nos.tolist(), entry.pubs.tolist(), strict=True)) == sorted(
        zip(sub_nos.tolist(), pubs.tolist(), strict=True)
    )


def test_the_schema_is_versioned_and_the_pipeline_never_creates_it(postgres_url):
    with pytest.raises(StoreMissing, match="a gateway creates it"):
        open_store(postgres_url, create=False)
    open_store(postgres_url).close()
    open_store(postgres_url).close()  # the second start migrates nothing
    with psycopg.connect(postgres_url) as db:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(len(MIGRATIONS),)]
        db.execute("UPDATE schema_version SET version = version + 1")
    with pytest.raises(StoreMissing, match="newer than this release"):
        open_store(postgres_url)


def test_a_database_holding_other_tables_is_refused(postgres_url):
    with psycopg.connect(postgres_url) as db:
        db.execute("CREATE TABLE log (x int)")
    with pytest.raises(StoreMissing, match="holds other tables"):
        open_store(postgres_url)


def test_a_store_with_one_number_per_id_is_migrated(postgres_url):
    """A store of schema version 2 kept one number per id and floored its queue at the last
    unsubscription (`reset`): the floor becomes the live subscription's cursor, and the next new
    subscription of the id gets a new number."""
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        db.execute("INSERT INTO schema_version VALUES (2)")
        for step in MIGRATIONS[:2]:
            db.execute(step)
        db.execute("INSERT INTO log(kind, sub_id, body, client, number) VALUES (1, 's', '[]', 'alice', 1)")
        db.execute("INSERT INTO subscription_numbers(sub_id, reset) VALUES ('s', 5)")
        db.execute("INSERT INTO subscriptions VALUES ('s', 1, NULL, 'alice', '[]')")
    store = open_store(postgres_url)
    try:
        assert store.cursor("s") == 5 and store.subscription_number("s", "alice") == 1
        store.remove_subscription("s", "alice")
        store.put_subscription("s", "alice", b"[]")
        assert store.subscription_number("s") == 2
    finally:
        store.close()


def test_a_store_that_named_its_state_for_top_k_is_migrated(postgres_url):
    """Schema version 8 kept the one stateful kind's state in `topk_bands` and `topk_*` status rows."""
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        db.execute("INSERT INTO schema_version VALUES (8)")
        for step in MIGRATIONS[:8]:
            db.execute(step)
        db.execute("INSERT INTO topk_bands VALUES (3, '\\x01')")
        db.execute(
            "INSERT INTO status(name, value, updated) VALUES ('topk_held.0', 10, 0), ('topk_held', 10, 0), "
            "('topk_due', 900, 0)"
        )
    store = open_store(postgres_url)
    try:
        assert store.subscription_states([3]) == {3: b"\x01"} and store.due() == 900
    finally:
        store.close()
