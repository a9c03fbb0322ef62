"""The embedded store: one SQLite file in WAL mode with synchronous=FULL, so a commit is on disk
before the gateway acknowledges it. Each thread gets its own connection (SQLite connections are not
shareable across threads); the gateway funnels its writes through a single thread so that one
commit covers many concurrent publishes.

What is queued where, and when it goes, is `veil.store.queues`'s policy: here is its SQL. The feed
table holds the packed feed rows, `deliveries` the spilled per-subscription rows; the `status` table
keeps the positions and figures the named methods read and write (it is no part of the interface).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Sequence

import numpy as np
import orjson

from veil.protocol.envelope import Origin
from veil.store.base import (
    KIND_CANCEL,
    KIND_COPY,
    KIND_PUBLICATION,
    KIND_REGISTRY,
    KIND_SUBSCRIBE,
    KIND_TICK,
    KIND_UNSUBSCRIBE,
    Delivery,
    EventStore,
    FeedEntry,
    LogEntry,
    NotOwner,
    PipelineStatus,
    Publication,
    Quarantined,
    QuarantineRecord,
    StatefulBatch,
    StoreMissing,
    StoreUnavailable,
    UnknownAnnouncement,
    UnknownPublication,
    UnknownSubscription,
)
from veil.store.queues import NEVER, consumed_floor, horizon, matches_of, pack, spill_end, unconsumed, unpack

SPILLED = "(SELECT COALESCE(MAX(value), 0) FROM status WHERE name = 'spilled')"  # last feed seq spilled
# the highest feed seq ever given (AUTOINCREMENT never reuses one), even once compaction emptied the feed
LAST_FEED_SEQ = "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'feed'), 0)"
SPILL_POSITION = "(SELECT COALESCE(MAX(value), 0) FROM status WHERE name = 'spill_position')"  # within the next
PROCESSED = "(SELECT COALESCE(MAX(value), 0) FROM status WHERE name = 'processed')"
# The oldest publication any queue holds. The key is (sub_no, pub): a plain MIN(pub) scans every
# queued row (180 ms at 5 M rows, once per compaction chunk), one seek per subscription number does not;
# EXISTS skips those seeks (100,000 of them at that many subscriptions) when nothing is queued.
OLDEST_QUEUED = (
    "(SELECT MIN((SELECT MIN(pub) FROM deliveries d WHERE d.sub_no = n.no)) FROM subscription_numbers n "
    "WHERE EXISTS (SELECT 1 FROM deliveries))"
)
NOT_QUARANTINED = "NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.offset = s.created)"
QUARANTINE_PREVIEW = 4096  # bytes of a quarantined entry kept for the operator to look at
ADDED_COLUMNS = (  # (table, column, declaration) added since the first release
    ("log", "client", "TEXT"),
    ("feed", "cropped", "INTEGER NOT NULL DEFAULT 0"),
    ("log", "time", "INTEGER"),
    ("log", "key_id", "TEXT"),
    ("log", "signature", "TEXT"),
    ("log", "copy_of", "INTEGER"),
    ("log", "cropped", "INTEGER NOT NULL DEFAULT 0"),
    ("log", "number", "INTEGER"),
)
# Stores written before the envelope's facts were columns kept them as a JSON fragment (`meta`).
FROM_META = """
UPDATE log SET key_id = json_extract(m, '$.keyId'), signature = json_extract(m, '$.signature'),
    copy_of = CAST(json_extract(m, '$.id') AS INTEGER), cropped = COALESCE(json_extract(m, '$.cropped'), 0)
FROM (SELECT offset AS o, '{' || CAST(meta AS TEXT) || '}' AS m FROM log WHERE length(meta) > 0) WHERE offset = o
"""
NUMBERED = "UPDATE log SET number = (SELECT no FROM subscription_numbers n WHERE n.sub_id = log.sub_id) WHERE kind = ?"
ORIGIN = "COALESCE(client, ''), key_id, signature, copy_of, cropped"  # the columns of an Origin

SCHEMA = """
CREATE TABLE IF NOT EXISTS log (
    offset INTEGER PRIMARY KEY AUTOINCREMENT,
    kind INTEGER NOT NULL,
    sub_id TEXT,
    body BLOB,
    client TEXT,  -- who logged it: the publisher of a publication, the owner of a subscription
    time INTEGER,  -- milliseconds since the epoch
    key_id TEXT,  -- the publisher's signing key and signature over the body
    signature TEXT,
    copy_of INTEGER,  -- a copy's original publication
    cropped INTEGER NOT NULL DEFAULT 0,  -- a copy whose body was cropped for its subscriber
    number INTEGER  -- a subscription's number
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
    sub_id TEXT NOT NULL UNIQUE,
    reset INTEGER NOT NULL DEFAULT 0  -- the last unsubscription: older matches are not for the id's queue
);
CREATE TABLE IF NOT EXISTS deliveries (
    sub_no INTEGER NOT NULL,
    pub INTEGER NOT NULL,
    PRIMARY KEY (sub_no, pub)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS feed (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    pairs BLOB NOT NULL,
    first INTEGER NOT NULL,
    created REAL NOT NULL,
    cropped INTEGER NOT NULL DEFAULT 0
);
-- the oldest publication the feed still needs: MIN(first) over the table would read every entry's
-- pairs blob (overflow pages are a linked list), hundreds of megabytes when subscribers lag
CREATE INDEX IF NOT EXISTS feed_first ON feed(first);
CREATE TABLE IF NOT EXISTS copies (  -- cropped copies, for the few matches that deliver one
    sub_no INTEGER NOT NULL,
    pub INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (sub_no, pub)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS announcements (  -- what edge brokers' publishers can produce
    ann_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS validity (  -- publications kept while valid, for the subscriptions to come
    pub INTEGER PRIMARY KEY,
    until INTEGER NOT NULL,  -- milliseconds since the epoch
    cancelled INTEGER  -- the offset of the publisher's withdrawal
);
CREATE TABLE IF NOT EXISTS topk_bands (  -- each top-k/w subscription's skyband as of the processed offset
    number INTEGER PRIMARY KEY,
    blob BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS registry (
    offset INTEGER PRIMARY KEY,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS cursors (
    sub_id TEXT PRIMARY KEY,
    pub INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine (  -- log entries the pipeline could not process, set aside
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    offset INTEGER NOT NULL UNIQUE,  -- of the entry (of the subscription version, for a subscription)
    kind INTEGER NOT NULL,
    sub_id TEXT,
    owner TEXT,  -- the publisher of a publication, the owner of a subscription
    error TEXT NOT NULL,
    body BLOB,  -- the entry's first bytes, for the operator
    time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS status (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL,
    updated REAL NOT NULL
);
"""


class SqliteStore(EventStore):
    def __init__(self, path: str, create: bool = True) -> None:
        self.path = os.path.abspath(path)
        if create:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        elif not os.path.isfile(self.path):
            # An executor on another machine would otherwise create an empty store of its own and
            # match nothing, silently: the file must be the one the gateway writes.
            raise StoreMissing(
                f"no store at {self.path} on host {socket.gethostname()}: the SQLite store is a file of the "
                "gateway's machine, and every pipeline process and executor must see the same file"
            )
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        # Bumped after each committed change of subscriptions or cursors made through this instance
        # (the gateway's, which makes them all): what compaction derived from them stays valid until
        # it moves. At 100,000 subscriptions, deriving it again for every step was most of its time.
        self._changes = 0
        self._floor: tuple[int, np.ndarray] | None = None
        self._consumed_clean = -1  # `_changes` when compaction last found no consumed rows left
        db = self._db()
        db.executescript(SCHEMA)
        _migrate(db)

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
    def append_publications(self, publications: list[Publication]) -> list[int]:
        now = _now_ms()
        with self._tx() as db:
            db.executemany(
                "INSERT INTO log(kind, body, client, key_id, signature, time) "
                f"VALUES ({KIND_PUBLICATION}, ?, ?, ?, ?, {now})",
                [(p.body, p.publisher, p.key_id, p.signature) for p in publications],
            )
            last = db.execute("SELECT last_insert_rowid()").fetchone()[0]
            # One writer holds the lock for the whole transaction, so the rows got consecutive offsets.
            offsets = list(range(last - len(publications) + 1, last + 1))
            db.executemany(
                "INSERT INTO validity(pub, until) VALUES (?, ?)",
                [(o, now + p.valid_for) for o, p in zip(offsets, publications, strict=True) if p.valid_for],
            )
        return offsets

    def put_announcement(self, ann_id: str, owner: str, body: bytes) -> None:
        with self._tx() as db:
            row = db.execute("SELECT owner FROM announcements WHERE ann_id = ?", (ann_id,)).fetchone()
            if row is not None and row[0] != owner:
                raise NotOwner("announcement", ann_id)
            db.execute(
                "INSERT OR REPLACE INTO announcements(ann_id, owner, body) VALUES (?, ?, ?)", (ann_id, owner, body)
            )

    def remove_announcement(self, ann_id: str, owner: str) -> None:
        with self._tx() as db:
            row = db.execute("SELECT owner FROM announcements WHERE ann_id = ?", (ann_id,)).fetchone()
            if row is None:
                raise UnknownAnnouncement(ann_id)
            if row[0] != owner:
                raise NotOwner("announcement", ann_id)
            db.execute("DELETE FROM announcements WHERE ann_id = ?", (ann_id,))

    def announcement(self, ann_id: str) -> tuple[str, bytes] | None:
        return self._db().execute("SELECT owner, body FROM announcements WHERE ann_id = ?", (ann_id,)).fetchone()

    def cancel_publication(self, pub: int, publisher: str) -> int:
        with self._tx() as db:
            row = db.execute(
                "SELECT l.client FROM validity v JOIN log l ON l.offset = v.pub "
                "WHERE v.pub = ? AND v.until > ? AND v.cancelled IS NULL",
                (pub, _now_ms()),
            ).fetchone()
            if row is None:
                raise UnknownPublication(pub)
            if row[0] != publisher:
                raise NotOwner("publication", pub)
            offset = db.execute("INSERT INTO log(kind, time) VALUES (?, ?)", (KIND_CANCEL, _now_ms())).lastrowid
            db.execute("UPDATE validity SET cancelled = ? WHERE pub = ?", (offset, pub))
        return offset  # type: ignore[return-value]

    def valid_at(self, offset: int, time: int) -> list[tuple[int, bytes, str]]:
        return (
            self._db()
            .execute(
                "SELECT v.pub, l.body, COALESCE(l.client, '') FROM validity v JOIN log l ON l.offset = v.pub "
                "WHERE v.pub < ?1 AND v.until > ?2 AND (v.cancelled IS NULL OR v.cancelled > ?1) ORDER BY v.pub",
                (offset, time),
            )
            .fetchall()
        )

    def put_registry(self, body: bytes, file_digest: int | None = None) -> int:
        with self._tx() as db:
            offset = db.execute(
                "INSERT INTO log(kind, body, time) VALUES (?, ?, ?)", (KIND_REGISTRY, body, _now_ms())
            ).lastrowid
            db.execute("INSERT INTO registry(offset, body) VALUES (?, ?)", (offset, body))
            if file_digest is not None:
                _set(db, "registry_file", file_digest)
        return offset  # type: ignore[return-value]

    def registry_file_digest(self) -> int | None:
        return _get(self._db(), "registry_file")

    def append_tick(self) -> int:
        with self._tx() as db:
            return db.execute("INSERT INTO log(kind, time) VALUES (?, ?)", (KIND_TICK, _now_ms())).lastrowid  # type: ignore[return-value]

    def registry_at(self, offset: int | None = None) -> bytes | None:
        row = (
            self._db()
            .execute(
                "SELECT body FROM registry WHERE offset <= ? ORDER BY offset DESC LIMIT 1",
                (NEVER if offset is None else offset,),
            )
            .fetchone()
        )
        return row[0] if row else None

    def put_subscription(self, sub_id: str, owner: str, body: bytes) -> int:
        with self._tx() as db:
            current = _live_owner(db, sub_id)
            if current is not None and current != owner:
                raise NotOwner("subscription", sub_id)
            db.execute("INSERT OR IGNORE INTO subscription_numbers(sub_id) VALUES (?)", (sub_id,))
            offset = db.execute(
                "INSERT INTO log(kind, sub_id, body, client, time, number) "
                "SELECT ?, ?, ?, ?, ?, no FROM subscription_numbers WHERE sub_id = ?",
                (KIND_SUBSCRIBE, sub_id, body, owner, _now_ms(), sub_id),
            ).lastrowid
            db.execute("UPDATE subscriptions SET deleted = ? WHERE sub_id = ? AND deleted IS NULL", (offset, sub_id))
            db.execute(
                "INSERT INTO subscriptions(sub_id, created, owner, body) VALUES (?, ?, ?, ?)",
                (sub_id, offset, owner, body),
            )
        self._changed()
        return offset  # type: ignore[return-value]

    def remove_subscription(self, sub_id: str, owner: str) -> int:
        with self._tx() as db:
            current = _live_owner(db, sub_id)
            if current is None:
                raise UnknownSubscription(sub_id)
            if current != owner:
                raise NotOwner("subscription", sub_id)
            offset = db.execute(
                "INSERT INTO log(kind, sub_id, time) VALUES (?, ?, ?)", (KIND_UNSUBSCRIBE, sub_id, _now_ms())
            ).lastrowid
            db.execute("UPDATE subscriptions SET deleted = ? WHERE sub_id = ? AND deleted IS NULL", (offset, sub_id))
            # matches computed before the unsubscription may still arrive in the feed: they are never
            # spilled or served, since only live subscriptions get them and only after their reset
            db.execute("UPDATE subscription_numbers SET reset = ? WHERE sub_id = ?", (offset, sub_id))
            db.execute(
                "DELETE FROM deliveries WHERE sub_no = (SELECT no FROM subscription_numbers WHERE sub_id = ?)",
                (sub_id,),
            )
            db.execute("DELETE FROM cursors WHERE sub_id = ?", (sub_id,))
        self._changed()
        return offset  # type: ignore[return-value]

    def subscription_owner(self, sub_id: str) -> str | None:
        return _live_owner(self._db(), sub_id)

    def subscription_number(self, sub_id: str) -> int | None:
        row = self._db().execute("SELECT no FROM subscription_numbers WHERE sub_id = ?", (sub_id,)).fetchone()
        return row[0] if row else None

    def feed_since(self, seq: int, limit: int) -> list[FeedEntry]:
        rows = self._db().execute(
            "SELECT seq, pairs, cropped FROM feed WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)
        )
        return [unpack(entry_seq, pairs, bool(cropped)) for entry_seq, pairs, cropped in rows]

    def bodies(self, pubs: np.ndarray) -> dict[int, tuple[bytes, Origin]]:
        return self._bodies(self._db(), pubs)

    @staticmethod
    def _bodies(db: sqlite3.Connection, pubs: np.ndarray) -> dict[int, tuple[bytes, Origin]]:
        rows = db.execute(
            f"SELECT offset, body, {ORIGIN} FROM log WHERE offset IN (SELECT value FROM json_each(?))",
            (orjson.dumps(pubs, option=orjson.OPT_SERIALIZE_NUMPY),),
        )
        return {row[0]: (row[1], _origin(row[2:])) for row in rows}

    def copies(self, sub_nos: np.ndarray, pubs: np.ndarray) -> dict[tuple[int, int], bytes]:
        return self._copies(self._db(), sub_nos, pubs)

    @staticmethod
    def _copies(db: sqlite3.Connection, sub_nos: np.ndarray, pubs: np.ndarray) -> dict[tuple[int, int], bytes]:
        if not len(pubs):
            return {}
        rows = db.execute(
            "SELECT c.sub_no, c.pub, c.body FROM copies c JOIN json_each(?) j "
            "ON c.sub_no = j.value ->> 0 AND c.pub = j.value ->> 1",
            (orjson.dumps(np.column_stack([sub_nos, pubs]), option=orjson.OPT_SERIALIZE_NUMPY),),
        )
        return {(sub_no, pub): body for sub_no, pub, body in rows}

    def backlog(self, sub_id: str, after_pub: int, limit: int) -> tuple[list[Delivery], int]:
        with self._tx(write=False) as db:
            watermark = db.execute(LAST_FEED_SEQ).fetchone()[0]
            live = db.execute(
                "SELECT n.no, n.reset FROM subscriptions s JOIN subscription_numbers n USING (sub_id) "
                "WHERE s.sub_id = ? AND s.deleted IS NULL",
                (sub_id,),
            ).fetchone()
            if live is None:
                return [], watermark
            number, floor = live[0], max(after_pub, live[1])
            rows: list[Delivery] = [
                (row[0], row[1], _origin(row[3:], row[2]))
                for row in db.execute(
                    "SELECT d.pub, COALESCE(c.body, l.body), c.body IS NOT NULL, "
                    "COALESCE(l.client, ''), l.key_id, l.signature, l.copy_of, l.cropped "
                    "FROM deliveries d JOIN log l ON l.offset = d.pub "
                    "LEFT JOIN copies c ON c.sub_no = d.sub_no AND c.pub = d.pub "
                    "WHERE d.sub_no = ? AND d.pub > ? ORDER BY d.pub LIMIT ?",
                    (number, floor, limit),
                )
            ]
            if len(rows) < limit:
                floor = rows[-1][0] if rows else floor
                pubs = self._unspilled(db, number, floor, watermark, limit - len(rows))
                if len(pubs):
                    bodies = self._bodies(db, pubs)
                    copies = self._copies(db, np.full(len(pubs), number, np.int64), pubs)
                    for pub in pubs.tolist():
                        copy = copies.get((number, pub))
                        body, origin = bodies[pub]
                        rows.append((pub, body, origin) if copy is None else (pub, copy, origin._replace(cropped=True)))
        return rows, watermark

    def _unspilled(self, db: sqlite3.Connection, number: int, floor: int, upto_seq: int, limit: int) -> np.ndarray:
        """A subscription's matches after `floor` in the feed rows not yet spilled: a binary search in
        each row, whose pairs are sorted by subscription number."""
        found: list[np.ndarray] = []
        count = 0
        rows = db.execute(
            f"SELECT pairs FROM feed WHERE seq > {SPILLED} AND seq <= ? ORDER BY seq",
            (upto_seq,),
        )
        for (pairs,) in rows:
            found.append(matches_of(unpack(0, pairs), number, floor))
            count += len(found[-1])
            if count >= limit:
                break
        return np.concatenate(found)[:limit] if found else np.empty(0, np.int64)

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
        self._changed()

    def _changed(self) -> None:
        with self._lock:
            self._changes += 1

    def head_offset(self) -> int:
        return self._db().execute("SELECT COALESCE(MAX(offset), 0) FROM log").fetchone()[0]

    def last_feed_seq(self) -> int:
        return self._db().execute(LAST_FEED_SEQ).fetchone()[0]

    # --- pipeline side ------------------------------------------------------------------------
    def log_range(self, start: int, end: int, without: tuple[int, ...] = ()) -> list[LogEntry]:
        rows = self._db().execute(
            "SELECT offset, kind, sub_id, body, client, COALESCE(time, 0), number FROM log "
            f"WHERE offset > ? AND offset <= ? AND kind NOT IN ({', '.join('?' * len(without))}) ORDER BY offset",
            (start, end, *without),
        )
        return [LogEntry(*row) for row in rows]

    def subscriptions_at(self, offset: int) -> list[tuple[str, int, str, bytes]]:
        return (
            self._db()
            .execute(
                "SELECT s.sub_id, n.no, s.owner, s.body FROM subscriptions s "
                "JOIN subscription_numbers n USING (sub_id) "
                f"WHERE s.created <= ?1 AND (s.deleted IS NULL OR s.deleted > ?1) AND {NOT_QUARANTINED}",
                (offset,),
            )
            .fetchall()
        )

    def subscription_changes(self, after: int, upto: int) -> tuple[list[str], list[tuple[str, int, str, bytes]]]:
        with self._tx(write=False) as db:
            dropped = [
                row[0]
                for row in db.execute(
                    "SELECT sub_id FROM subscriptions WHERE deleted > ? AND deleted <= ?", (after, upto)
                )
            ]
            added = db.execute(
                "SELECT s.sub_id, n.no, s.owner, s.body FROM subscriptions s "
                "JOIN subscription_numbers n USING (sub_id) "
                "WHERE s.created > ?1 AND s.created <= ?2 AND (s.deleted IS NULL OR s.deleted > ?2) "
                f"AND {NOT_QUARANTINED} ORDER BY s.created",
                (after, upto),
            ).fetchall()
        return dropped, added

    def record_deliveries(
        self,
        batch_id: int,
        sub_nos: np.ndarray,
        pubs: np.ndarray,
        processed: int,
        copies: Sequence[tuple[int, int, bytes]] = (),
        stateful: StatefulBatch | None = None,
        quarantined: Sequence[Quarantined] = (),
    ) -> None:
        sub_nos = np.asarray(sub_nos, np.int64)
        pubs = np.asarray(pubs, np.int64)
        now = time.time()
        with self._tx() as db:
            # matches of publications at or below the processed offset were recorded by an earlier
            # run of this batch: a replay adds only what is new
            done = db.execute(f"SELECT {PROCESSED}").fetchone()[0]
            fresh = pubs > done
            sub_nos, pubs = sub_nos[fresh], pubs[fresh]
            copies = [copy for copy in copies if copy[1] > done]
            if stateful is not None and processed > done:
                logged = self._record_stateful(db, stateful) + [(n, p) for n, p, _ in stateful.initials]
                sub_nos = np.concatenate([sub_nos, np.array([n for n, _ in logged], np.int64)])
                pubs = np.concatenate([pubs, np.array([p for _, p in logged], np.int64)])
                copies += [(n, p, copy) for n, p, copy in stateful.initials if copy is not None]
            if len(pubs):
                pairs, first = pack(sub_nos, pubs)
                db.execute(
                    "INSERT INTO feed(pairs, first, created, cropped) VALUES (?, ?, ?, ?)",
                    (pairs, first, now, bool(copies)),
                )
                db.executemany("INSERT OR REPLACE INTO copies(sub_no, pub, body) VALUES (?, ?, ?)", copies)
            if processed > done:
                self._quarantine(db, quarantined, processed, now)
            db.executemany(
                "INSERT INTO status(name, value, updated) VALUES (?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = MAX(value, excluded.value), updated = excluded.updated",
                [("processed", processed, now), ("batch", batch_id, now)],
            )
            if len(pubs) and processed > done:
                _set(db, "matches_per_entry", -(-len(pubs) // (processed - done)))

    @staticmethod
    def _record_stateful(db: sqlite3.Connection, batch: StatefulBatch) -> list[tuple[int, int]]:
        """Log each delivery as a copy of its publication (the envelope keeps the original's id) and
        keep the skybands; returns the (subscription number, copy offset) matches."""
        originals = {
            row[0]: row[1:]
            for row in db.execute(
                "SELECT offset, body, client, key_id, signature FROM log "
                "WHERE offset IN (SELECT value FROM json_each(?))",
                (orjson.dumps([pub for _, pub, _ in batch.deliveries]),),
            )
        }
        logged = []
        now = _now_ms()
        for number, pub, cropped in batch.deliveries:
            if pub not in originals:  # kept while any skyband holds it: gone means nobody does
                continue
            body, client, key_id, signature = originals[pub]
            offset = db.execute(
                "INSERT INTO log(kind, body, client, key_id, signature, copy_of, cropped, time) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (KIND_COPY, cropped or body, client, key_id, signature, pub, cropped is not None, now),
            ).lastrowid
            logged.append((number, offset))
        db.executemany(
            "INSERT OR REPLACE INTO topk_bands(number, blob) VALUES (?, ?)",
            [(number, blob) for number, blob in batch.bands if blob is not None],
        )
        db.executemany(
            "DELETE FROM topk_bands WHERE number = ?", [(number,) for number, blob in batch.bands if blob is None]
        )
        for name, value in (("topk_held", batch.held), ("topk_due", batch.due)):
            if value is None:
                db.execute("DELETE FROM status WHERE name = ?", (name,))
            else:
                _set(db, name, value)
        return logged

    @staticmethod
    def _quarantine(db: sqlite3.Connection, entries: Sequence[Quarantined], processed: int, now: float) -> None:
        """Set entries aside; a subscription named without its offset is the version in force at
        `processed` (the one a matcher held when it failed)."""
        for entry in entries:
            offset, owner, body = entry.offset, entry.owner, None
            if entry.kind == KIND_SUBSCRIBE:
                row = db.execute(
                    "SELECT created, owner, substr(body, 1, ?) FROM subscriptions WHERE sub_id = ? AND created <= ? "
                    "AND (deleted IS NULL OR deleted > ?) ORDER BY created DESC LIMIT 1",
                    (QUARANTINE_PREVIEW, entry.sub_id, processed, processed),
                ).fetchone()
                if row is None:
                    continue  # replaced or removed in the same batch: nothing is left to set aside
                offset, owner, body = row
            else:
                row = db.execute(
                    "SELECT client, substr(body, 1, ?) FROM log WHERE offset = ?", (QUARANTINE_PREVIEW, offset)
                ).fetchone()
                if row is not None:
                    owner, body = owner or row[0], row[1]
            db.execute(
                "INSERT OR IGNORE INTO quarantine(offset, kind, sub_id, owner, error, body, time) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (offset, entry.kind, entry.sub_id, owner, entry.error, body, now),
            )

    def quarantine(self, after: int = 0, limit: int = 1000) -> list[QuarantineRecord]:
        rows = self._db().execute(
            "SELECT seq, offset, kind, sub_id, owner, error, body, time FROM quarantine WHERE seq > ? "
            "ORDER BY seq LIMIT ?",
            (after, limit),
        )
        return [QuarantineRecord(*row) for row in rows]

    def quarantine_count(self) -> int:
        return self._db().execute("SELECT COUNT(*) FROM quarantine").fetchone()[0]

    def quarantined_at(self, offset: int) -> QuarantineRecord | None:
        row = self._db().execute(
            "SELECT seq, offset, kind, sub_id, owner, error, body, time FROM quarantine WHERE offset = ?", (offset,)
        ).fetchone()
        return None if row is None else QuarantineRecord(*row)

    def release_quarantined(self, offset: int) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM quarantine WHERE offset = ?", (offset,)).rowcount > 0

    def subscription_refusal(self, sub_id: str) -> str | None:
        row = self._db().execute(
            "SELECT q.error FROM subscriptions s JOIN quarantine q ON q.offset = s.created "
            "WHERE s.sub_id = ? AND s.deleted IS NULL",
            (sub_id,),
        ).fetchone()
        return row[0] if row else None

    def topk_bands(self, numbers: Sequence[int]) -> dict[int, bytes]:
        rows = self._db().execute(
            "SELECT number, blob FROM topk_bands WHERE number IN (SELECT value FROM json_each(?))",
            (orjson.dumps(list(numbers)),),
        )
        return dict(rows.fetchall())

    def processed_offset(self) -> int:
        return _get(self._db(), "processed") or 0

    def matches_per_entry(self) -> int:
        return _get(self._db(), "matches_per_entry") or 0

    def topk_due(self) -> int | None:
        return _get(self._db(), "topk_due")

    def register_pipeline(self, pid: int) -> None:
        with self._tx() as db:
            _set(db, "pipeline", pid)

    def expect_pipeline(self) -> None:
        self.register_pipeline(0)

    def heartbeat(self, batch_since: int) -> None:
        with self._tx() as db:
            _set(db, "heartbeat", batch_since)

    def pipeline_status(self) -> PipelineStatus | None:
        rows = dict(
            (name, (value, updated))
            for name, value, updated in self._db().execute(
                "SELECT name, value, updated FROM status WHERE name IN ('pipeline', 'heartbeat')"
            )
        )
        if "pipeline" not in rows:
            return None
        (pid, registered), beat = rows["pipeline"], rows.get("heartbeat")
        return PipelineStatus(pid, registered, beat[0] if beat else 0, beat[1] if beat else None)

    def compact(self, limit: int, fanned_out: int, spill_before: float) -> int:
        with self._tx() as db:
            # the hub offers entries to connected sessions first; spilling one it has not offered yet
            # would write rows that are about to be consumed
            spilled = self._spill(db, fanned_out, spill_before, limit)
            consumed = 0
            changes = self._changes
            if changes != self._consumed_clean:  # spilling never writes a consumed row: cursors must move
                # one primary-key range delete per cursor: cost follows the rows deleted, not the table
                for number, pub in db.execute(
                    "SELECT n.no, c.pub FROM cursors c JOIN subscription_numbers n USING (sub_id) "
                    "WHERE EXISTS (SELECT 1 FROM deliveries d WHERE d.sub_no = n.no AND d.pub <= c.pub)"
                ).fetchall():
                    consumed += db.execute(
                        "DELETE FROM deliveries WHERE sub_no = ? AND pub <= ?", (number, pub)
                    ).rowcount
                    if consumed >= limit:
                        break
                else:
                    self._consumed_clean = changes
            fed = db.execute(
                f"DELETE FROM feed WHERE seq <= MIN(?, {SPILLED})",
                (fanned_out,),
            ).rowcount
            # Publications at or below the processed offset are never read by the pipeline again (a
            # replayed batch starts after the last recorded one), and below the oldest queued delivery
            # no queue needs their bodies.
            # Nor are the publications a top-k/w skyband holds: a later expiry may deliver them.
            processed, oldest_spilled, oldest_fed, held = db.execute(
                f"SELECT {PROCESSED}, {OLDEST_QUEUED}, (SELECT MIN(first) FROM feed), "
                "(SELECT value FROM status WHERE name = 'topk_held')"
            ).fetchone()
            below = horizon(processed, oldest_spilled, oldest_fed, held)
            # Valid publications stay for the subscriptions to come, until the pipeline has passed the
            # moment they expire or their withdrawal.
            clock = db.execute(
                "SELECT COALESCE(MAX(time), 0) FROM log WHERE offset = (SELECT MAX(offset) FROM log WHERE offset <= ?)",
                (processed,),
            ).fetchone()[0]
            published = db.execute(
                "DELETE FROM validity WHERE until <= ? OR cancelled <= ?", (clock, processed)
            ).rowcount
            published += db.execute(
                "DELETE FROM log WHERE offset IN (SELECT offset FROM log WHERE kind IN (?, ?, ?, ?) AND offset <= ? "
                "AND offset NOT IN (SELECT pub FROM validity) ORDER BY offset LIMIT ?)",
                (KIND_PUBLICATION, KIND_COPY, KIND_TICK, KIND_CANCEL, below, limit),
            ).rowcount
            published += db.execute("DELETE FROM copies WHERE pub <= ?", (below,)).rowcount
        return spilled + consumed + fed + published

    def _spill(self, db: sqlite3.Connection, upto: int, before: float, limit: int) -> int:
        """Move the matches of feed rows up to seq `upto` created before `before` that live
        subscriptions have not consumed into per-subscription rows, about `limit` matches per call
        (a large entry is spilled over several calls, whole subscriptions at a time, so that no
        transaction holds the write lock for long); returns the matches looked at."""
        spilled, position = db.execute(f"SELECT {SPILLED}, {SPILL_POSITION}").fetchone()
        rows = db.execute(  # stepped one entry at a time: entries can be tens of megabytes
            "SELECT seq, pairs FROM feed WHERE seq > ? AND seq <= ? AND created < ? ORDER BY seq",
            (spilled, upto, before),
        )
        looked = 0
        floor: np.ndarray | None = None
        for row in rows:
            entry = unpack(*row)
            end = spill_end(entry, position, limit - looked)
            sub_nos, pubs = entry.sub_nos[position:end], entry.pubs[position:end]
            floor = self._consumed_floor(db) if floor is None else floor
            keep = unconsumed(sub_nos, pubs, floor)
            if keep.any():  # pairs are sorted by (subscription, publication): the B-tree fills in order
                db.execute(
                    "INSERT OR IGNORE INTO deliveries(sub_no, pub) SELECT value ->> 0, value ->> 1 FROM json_each(?)",
                    (orjson.dumps(np.column_stack([sub_nos[keep], pubs[keep]]), option=orjson.OPT_SERIALIZE_NUMPY),),
                )
            looked += end - position
            if end < len(entry.pubs):
                position = end
                break
            spilled, position = entry.seq, 0
            if looked >= limit:
                break
        if looked:
            _set(db, "spilled", spilled)
            _set(db, "spill_position", position)
        return looked

    def _consumed_floor(self, db: sqlite3.Connection) -> np.ndarray:
        """`consumed_floor`, derived again only when subscriptions or cursors changed."""
        changes = self._changes
        if self._floor is not None and self._floor[0] == changes:
            return self._floor[1]
        floor = consumed_floor(
            db.execute(
                "SELECT n.no, MAX(n.reset, COALESCE(c.pub, 0)) FROM subscriptions s "
                "JOIN subscription_numbers n USING (sub_id) LEFT JOIN cursors c USING (sub_id) "
                "WHERE s.deleted IS NULL"
            ).fetchall()
        )
        self._floor = (changes, floor)
        return floor

    def close(self) -> None:
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _origin(row: Sequence, cropped: bool = False) -> Origin:
    """An Origin from the ORIGIN columns; `cropped`: the subscriber gets a cropped copy."""
    publisher, key_id, signature, copy_of, was_cropped = row
    return Origin(publisher, key_id, signature, copy_of, bool(was_cropped or cropped))


def _get(db: sqlite3.Connection, name: str) -> int | None:
    row = db.execute("SELECT value FROM status WHERE name = ?", (name,)).fetchone()
    return row[0] if row else None


def _set(db: sqlite3.Connection, name: str, value: int) -> None:
    db.execute(
        "INSERT INTO status(name, value, updated) VALUES (?, ?, ?) "
        "ON CONFLICT(name) DO UPDATE SET value = excluded.value, updated = excluded.updated",
        (name, value, time.time()),
    )


def _migrate(db: sqlite3.Connection) -> None:
    """Bring a store written by an earlier release up to this schema."""
    for table, column, declaration in ADDED_COLUMNS:
        if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
    if "meta" in {row[1] for row in db.execute("PRAGMA table_info(log)")}:
        with _Transaction(db, True):
            db.execute(FROM_META)
            db.execute(NUMBERED, (KIND_SUBSCRIBE,))
            db.execute("ALTER TABLE log DROP COLUMN meta")


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
        try:
            self.db.execute("BEGIN IMMEDIATE" if self.write else "BEGIN")
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(str(exc)) from exc
        return self.db

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, *_: object) -> None:
        """A full disk, an I/O error or a lock held too long is the store's condition, not the caller's
        mistake: it surfaces as StoreUnavailable (the gateway answers 503), with nothing half-written."""
        try:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        except sqlite3.OperationalError as failure:
            if exc_type is None:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
                raise StoreUnavailable(str(failure)) from failure
        if isinstance(exc, sqlite3.OperationalError):
            raise StoreUnavailable(str(exc)) from exc
