"""The embedded store: one SQLite file in WAL mode with synchronous=FULL, so a commit is on disk
before the gateway acknowledges it. Each thread gets its own connection (SQLite connections are not
shareable across threads); the gateway funnels its writes through a single thread so that one
commit covers many concurrent publishes.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time

import numpy as np
import orjson

from veil.store.base import (
    KIND_PUBLICATION,
    KIND_SUBSCRIBE,
    KIND_UNSUBSCRIBE,
    Delivery,
    EventStore,
    FeedEntry,
    LogEntry,
    NotOwner,
    UnknownSubscription,
)

FEED_RETENTION = 120.0  # seconds a micro-batch's matches stay in the live feed

SCHEMA = """
CREATE TABLE IF NOT EXISTS log (
    offset INTEGER PRIMARY KEY AUTOINCREMENT,
    kind INTEGER NOT NULL,
    sub_id TEXT,
    body BLOB
);
CREATE TABLE IF NOT EXISTS subscriptions (
    sub_id TEXT NOT NULL,
    created INTEGER NOT NULL,
    deleted INTEGER,
    owner TEXT NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (sub_id, created)
);
CREATE INDEX IF NOT EXISTS subscriptions_created ON subscriptions(created);
CREATE INDEX IF NOT EXISTS subscriptions_deleted ON subscriptions(deleted);
CREATE TABLE IF NOT EXISTS subscription_numbers (
    no INTEGER PRIMARY KEY,
    sub_id TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS deliveries (
    sub_no INTEGER NOT NULL,
    pub INTEGER NOT NULL,
    PRIMARY KEY (sub_no, pub)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS feed (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    pairs BLOB NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS removed (
    sub_no INTEGER PRIMARY KEY,
    at_offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS cursors (
    sub_id TEXT PRIMARY KEY,
    pub INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS status (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL,
    updated REAL NOT NULL
);
"""


class SqliteStore(EventStore):
    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._db().executescript(SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=60)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=60000")
            self._local.db = db
            with self._lock:
                self._connections.append(db)
        return db

    def _tx(self, write: bool = True) -> _Transaction:
        return _Transaction(self._db(), write)

    # --- gateway side -------------------------------------------------------------------------
    def append_publications(self, bodies: list[bytes]) -> list[int]:
        with self._tx() as db:
            db.executemany("INSERT INTO log(kind, body) VALUES (?, ?)", [(KIND_PUBLICATION, b) for b in bodies])
            last = db.execute("SELECT last_insert_rowid()").fetchone()[0]
        # One writer holds the lock for the whole transaction, so the rows got consecutive offsets.
        return list(range(last - len(bodies) + 1, last + 1))

    def put_subscription(self, sub_id: str, owner: str, body: bytes) -> int:
        with self._tx() as db:
            current = _live_owner(db, sub_id)
            if current is not None and current != owner:
                raise NotOwner(sub_id)
            offset = db.execute(
                "INSERT INTO log(kind, sub_id, body) VALUES (?, ?, ?)", (KIND_SUBSCRIBE, sub_id, body)
            ).lastrowid
            db.execute("UPDATE subscriptions SET deleted = ? WHERE sub_id = ? AND deleted IS NULL", (offset, sub_id))
            db.execute(
                "INSERT INTO subscriptions(sub_id, created, owner, body) VALUES (?, ?, ?, ?)",
                (sub_id, offset, owner, body),
            )
            db.execute("INSERT OR IGNORE INTO subscription_numbers(sub_id) VALUES (?)", (sub_id,))
            db.execute(
                "DELETE FROM removed WHERE sub_no = (SELECT no FROM subscription_numbers WHERE sub_id = ?)", (sub_id,)
            )
        return offset  # type: ignore[return-value]

    def remove_subscription(self, sub_id: str, owner: str) -> int:
        with self._tx() as db:
            current = _live_owner(db, sub_id)
            if current is None:
                raise UnknownSubscription(sub_id)
            if current != owner:
                raise NotOwner(sub_id)
            offset = db.execute("INSERT INTO log(kind, sub_id) VALUES (?, ?)", (KIND_UNSUBSCRIBE, sub_id)).lastrowid
            db.execute("UPDATE subscriptions SET deleted = ? WHERE sub_id = ? AND deleted IS NULL", (offset, sub_id))
            # matches computed before the unsubscription may still arrive: compaction drops them
            db.execute(
                "INSERT OR REPLACE INTO removed(sub_no, at_offset) "
                "SELECT no, ? FROM subscription_numbers WHERE sub_id = ?",
                (offset, sub_id),
            )
            db.execute(
                "DELETE FROM deliveries WHERE sub_no = (SELECT no FROM subscription_numbers WHERE sub_id = ?)",
                (sub_id,),
            )
            db.execute("DELETE FROM cursors WHERE sub_id = ?", (sub_id,))
        return offset  # type: ignore[return-value]

    def subscription_owner(self, sub_id: str) -> str | None:
        return _live_owner(self._db(), sub_id)

    def subscription_number(self, sub_id: str) -> int | None:
        row = self._db().execute("SELECT no FROM subscription_numbers WHERE sub_id = ?", (sub_id,)).fetchone()
        return row[0] if row else None

    def feed_since(self, seq: int, limit: int) -> list[FeedEntry]:
        rows = self._db().execute("SELECT seq, pairs FROM feed WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit))
        entries = []
        for entry_seq, pairs in rows:
            both = np.frombuffer(pairs, np.int64)
            half = len(both) // 2
            entries.append(FeedEntry(entry_seq, both[:half], both[half:]))
        return entries

    def bodies(self, pubs: np.ndarray) -> dict[int, bytes]:
        rows = self._db().execute(
            "SELECT offset, body FROM log WHERE offset IN (SELECT value FROM json_each(?))",
            (orjson.dumps(pubs, option=orjson.OPT_SERIALIZE_NUMPY),),
        )
        return dict(rows.fetchall())

    def backlog(self, sub_id: str, after_pub: int, limit: int) -> tuple[list[Delivery], int]:
        with self._tx(write=False) as db:
            rows = db.execute(
                "SELECT d.pub, l.body FROM deliveries d JOIN log l ON l.offset = d.pub "
                "WHERE d.sub_no = (SELECT no FROM subscription_numbers WHERE sub_id = ?) AND d.pub > ? "
                "ORDER BY d.pub LIMIT ?",
                (sub_id, after_pub, limit),
            ).fetchall()
            watermark = db.execute("SELECT COALESCE(MAX(seq), 0) FROM feed").fetchone()[0]
        return rows, watermark

    def cursor(self, sub_id: str) -> int:
        row = self._db().execute("SELECT pub FROM cursors WHERE sub_id = ?", (sub_id,)).fetchone()
        return row[0] if row else 0

    def save_cursors(self, cursors: dict[str, int]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT INTO cursors(sub_id, pub) SELECT ?1, ?2 WHERE EXISTS "
                "(SELECT 1 FROM subscriptions WHERE sub_id = ?1 AND deleted IS NULL) "
                "ON CONFLICT(sub_id) DO UPDATE SET pub = MAX(pub, excluded.pub)",
                list(cursors.items()),
            )

    def head_offset(self) -> int:
        return self._db().execute("SELECT COALESCE(MAX(offset), 0) FROM log").fetchone()[0]

    def last_feed_seq(self) -> int:
        return self._db().execute("SELECT COALESCE(MAX(seq), 0) FROM feed").fetchone()[0]

    # --- pipeline side ------------------------------------------------------------------------
    def log_range(self, start: int, end: int) -> list[LogEntry]:
        rows = self._db().execute(
            "SELECT offset, kind, sub_id, body FROM log WHERE offset > ? AND offset <= ? ORDER BY offset",
            (start, end),
        )
        return [LogEntry(*row) for row in rows]

    def subscriptions_at(self, offset: int) -> list[tuple[str, int, bytes]]:
        return (
            self._db()
            .execute(
                "SELECT s.sub_id, n.no, s.body FROM subscriptions s JOIN subscription_numbers n USING (sub_id) "
                "WHERE s.created <= ?1 AND (s.deleted IS NULL OR s.deleted > ?1)",
                (offset,),
            )
            .fetchall()
        )

    def subscription_changes(self, after: int, upto: int) -> tuple[list[str], list[tuple[str, int, bytes]]]:
        with self._tx(write=False) as db:
            dropped = [
                row[0]
                for row in db.execute(
                    "SELECT sub_id FROM subscriptions WHERE deleted > ? AND deleted <= ?", (after, upto)
                )
            ]
            added = db.execute(
                "SELECT s.sub_id, n.no, s.body FROM subscriptions s JOIN subscription_numbers n USING (sub_id) "
                "WHERE s.created > ?1 AND s.created <= ?2 AND (s.deleted IS NULL OR s.deleted > ?2) "
                "ORDER BY s.created",
                (after, upto),
            ).fetchall()
        return dropped, added

    def record_deliveries(self, batch_id: int, sub_nos: np.ndarray, pubs: np.ndarray, processed: int) -> None:
        sub_nos = np.asarray(sub_nos, np.int64)
        pubs = np.asarray(pubs, np.int64)
        now = time.time()
        with self._tx() as db:
            if len(pubs):
                # one statement for the whole batch, SQLite unpacking the pairs itself, in key order so
                # that the B-tree is filled sequentially per subscription
                order = np.lexsort((pubs, sub_nos))
                pairs = orjson.dumps(np.column_stack([sub_nos[order], pubs[order]]), option=orjson.OPT_SERIALIZE_NUMPY)
                db.execute(
                    "INSERT OR IGNORE INTO deliveries(sub_no, pub) SELECT value ->> 0, value ->> 1 FROM json_each(?)",
                    (pairs,),
                )
                db.execute("INSERT INTO feed(pairs, created) VALUES (?, ?)", (sub_nos.tobytes() + pubs.tobytes(), now))
            db.executemany(
                "INSERT INTO status(name, value, updated) VALUES (?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = MAX(value, excluded.value), updated = excluded.updated",
                [("processed", processed, now), ("batch", batch_id, now)],
            )

    def processed_offset(self) -> int:
        found = self.status("processed")
        return found[0] if found else 0

    def set_status(self, name: str, value: int) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO status(name, value, updated) VALUES (?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value, updated = excluded.updated",
                (name, value, time.time()),
            )

    def status(self, name: str) -> tuple[int, float] | None:
        return self._db().execute("SELECT value, updated FROM status WHERE name = ?", (name,)).fetchone()

    def compact(self, limit: int) -> int:
        with self._tx() as db:
            processed = db.execute("SELECT COALESCE(MAX(value), 0) FROM status WHERE name = 'processed'").fetchone()[0]
            removed = db.execute("DELETE FROM deliveries WHERE sub_no IN (SELECT sub_no FROM removed)").rowcount
            # once the pipeline is past an unsubscription, no late match for it can come any more
            db.execute("DELETE FROM removed WHERE at_offset <= ?", (processed,))
            consumed = db.execute(
                "DELETE FROM deliveries WHERE (sub_no, pub) IN (SELECT d.sub_no, d.pub FROM cursors c "
                "JOIN subscription_numbers n ON n.sub_id = c.sub_id "
                "JOIN deliveries d ON d.sub_no = n.no AND d.pub <= c.pub LIMIT ?)",
                (limit,),
            ).rowcount
            fed = db.execute("DELETE FROM feed WHERE created < ?", (time.time() - FEED_RETENTION,)).rowcount
            # Publications at or below the processed offset are never read by the pipeline again (a
            # replayed batch starts after the last recorded one), and below the oldest queued delivery
            # no queue needs their bodies.
            oldest = db.execute("SELECT MIN(pub) FROM deliveries").fetchone()[0]
            horizon = processed if oldest is None else min(processed, oldest - 1)
            published = db.execute(
                "DELETE FROM log WHERE offset IN (SELECT offset FROM log WHERE kind = ? AND offset <= ? "
                "ORDER BY offset LIMIT ?)",
                (KIND_PUBLICATION, horizon, limit),
            ).rowcount
        return removed + consumed + fed + published

    def close(self) -> None:
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()


def _live_owner(db: sqlite3.Connection, sub_id: str) -> str | None:
    row = db.execute("SELECT owner FROM subscriptions WHERE sub_id = ? AND deleted IS NULL", (sub_id,)).fetchone()
    return row[0] if row else None


class _Transaction:
    """BEGIN ... COMMIT, rolled back on error: no half-written state. A write transaction takes the
    write lock at once (IMMEDIATE) so that it cannot fail half-way on a lock upgrade; a read
    transaction gives several queries one consistent snapshot."""

    def __init__(self, db: sqlite3.Connection, write: bool) -> None:
        self.db = db
        self.write = write

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE" if self.write else "BEGIN")
        return self.db

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
