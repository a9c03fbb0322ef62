"""The embedded store: one SQLite file in WAL mode with synchronous=FULL, so a commit is on disk
before the gateway acknowledges it. Each thread gets its own connection (SQLite connections are not
shareable across threads); the gateway funnels its writes through a single thread so that one
commit covers many concurrent publishes. A write transaction takes SQLite's one write lock at once
(BEGIN IMMEDIATE), so that it cannot fail half-way on a lock upgrade.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sqlite3
import threading
from collections.abc import Sequence

import numpy as np
import orjson

from veil.store.base import KIND_PUBLICATION, KIND_SUBSCRIBE, Publication, StoreMissing, StoreUnavailable
from veil.store.relational import STATUS_WITHOUT_TOPK, Db, RelationalStore, Transaction

FAILURES = (sqlite3.OperationalError,)  # full disks, I/O errors, locks held too long
ADDED_COLUMNS = (  # (table, column, declaration) added since the first release
    ("gateways", "incarnation", "TEXT NOT NULL DEFAULT ''"),
    ("log", "client", "TEXT"),
    ("feed", "cropped", "INTEGER NOT NULL DEFAULT 0"),
    ("log", "time", "INTEGER"),
    ("log", "key_id", "TEXT"),
    ("log", "signature", "TEXT"),
    ("log", "copy_of", "INTEGER"),
    ("log", "cropped", "INTEGER NOT NULL DEFAULT 0"),
    ("log", "number", "INTEGER"),
    ("quarantine", "released", "REAL"),
    ("deliveries", "size", "INTEGER NOT NULL DEFAULT 0"),
    ("subscriptions", "since", "INTEGER"),
)
# Withdrawals by the publication they name (kind 6: KIND_CANCEL), for replays of the retained log
# (made once the log has the column); those logged before they named it, named from validity
WITHDRAWALS = "CREATE INDEX IF NOT EXISTS log_withdrawals ON log(copy_of) WHERE kind = 6"
WITHDRAWALS_NAMED = (
    "UPDATE log SET copy_of = (SELECT v.pub FROM validity v WHERE v.cancelled = log.offset) "
    "WHERE kind = 6 AND copy_of IS NULL"
)
# Stores written before queues were counted: their spilled rows counted once (their sizes were not kept)
QUEUES_COUNTED = (
    "INSERT INTO queues(sub_no, deliveries, bytes) SELECT sub_no, COUNT(*), 0 FROM deliveries "
    "WHERE NOT EXISTS (SELECT 1 FROM queues) GROUP BY sub_no"
)
# Stores written before the envelope's facts were columns kept them as a JSON fragment (`meta`).
FROM_META = """
UPDATE log SET key_id = json_extract(m, '$.keyId'), signature = json_extract(m, '$.signature'),
    copy_of = CAST(json_extract(m, '$.id') AS INTEGER), cropped = COALESCE(json_extract(m, '$.cropped'), 0)
FROM (SELECT offset AS o, '{' || CAST(meta AS TEXT) || '}' AS m FROM log WHERE length(meta) > 0) WHERE offset = o
"""
NUMBERED = "UPDATE log SET number = (SELECT no FROM subscription_numbers n WHERE n.sub_id = log.sub_id) WHERE kind = ?"
# Stores written before each new subscription got a new number kept one number per id, and the last
# unsubscription (`reset`) as a floor below which the id's queue was not read: it becomes the cursor of
# the id's live subscription, which no read then goes below unless its client resumes there.
RESET_AS_CURSOR = (
    "INSERT INTO cursors(sub_id, pub) SELECT n.sub_id, n.reset FROM subscription_numbers n WHERE n.reset > 0 "
    "AND EXISTS (SELECT 1 FROM subscriptions s WHERE s.sub_id = n.sub_id AND s.deleted IS NULL) AND TRUE "
    "ON CONFLICT (sub_id) DO UPDATE SET pub = MAX(cursors.pub, excluded.pub)"
)
# Stores written before the last feed seq was kept in `status` read it from AUTOINCREMENT's table.
FEED_SEQ = (
    "INSERT INTO status(name, value, updated) SELECT 'feed_seq', seq, 0 FROM sqlite_sequence WHERE name = 'feed' "
    "AND NOT EXISTS (SELECT 1 FROM status WHERE name = 'feed_seq')"
)

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
    since INTEGER,  -- ms: it replays the retained publications logged from then on
    PRIMARY KEY (sub_id, created)
);
CREATE INDEX IF NOT EXISTS subscriptions_created ON subscriptions(created);
CREATE INDEX IF NOT EXISTS subscriptions_deleted ON subscriptions(deleted);
DROP INDEX IF EXISTS subscriptions_owner_live;  -- an earlier release's: the owner alone
-- a client's live subscriptions: counted on every subscribe, and listed in id order a page at a time
CREATE INDEX IF NOT EXISTS subscriptions_owner_id ON subscriptions(owner, sub_id) WHERE deleted IS NULL;
CREATE TABLE IF NOT EXISTS subscription_numbers (  -- each id's newest number (rows are never deleted)
    no INTEGER PRIMARY KEY,
    sub_id TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS deliveries (
    sub_no INTEGER NOT NULL,
    pub INTEGER NOT NULL,
    size INTEGER NOT NULL DEFAULT 0,  -- bytes of the publication
    PRIMARY KEY (sub_no, pub)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS acked (  -- acknowledged by a shared subscription's members past its cursor
    sub_no INTEGER NOT NULL,
    pub INTEGER NOT NULL,
    PRIMARY KEY (sub_no, pub)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS queues (  -- each subscription's spilled rows: how many, and their publications' bytes
    sub_no INTEGER PRIMARY KEY,
    deliveries INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS queue_bounds (  -- the bounds a subscriber set on its subscription's queue
    sub_no INTEGER PRIMARY KEY,
    deliveries INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    age INTEGER NOT NULL  -- ms
);
CREATE TABLE IF NOT EXISTS dead_letters (  -- deliveries that left their queue past one of its bounds
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    sub_no INTEGER NOT NULL,
    pub INTEGER NOT NULL,  -- held like a queued delivery: its publication (and cropped copy) stays
    reason TEXT NOT NULL,
    at INTEGER NOT NULL  -- ms since the epoch
);
CREATE INDEX IF NOT EXISTS dead_letters_sub ON dead_letters(sub_no, seq);
CREATE INDEX IF NOT EXISTS dead_letters_pub ON dead_letters(pub);  -- the oldest one held
CREATE INDEX IF NOT EXISTS dead_letters_at ON dead_letters(at);  -- those past their time
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
CREATE INDEX IF NOT EXISTS feed_created ON feed(created);  -- the newest row compaction may spill
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
CREATE TABLE IF NOT EXISTS subscription_state (  -- each stateful subscription's state at the processed offset
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
    time REAL NOT NULL,
    released REAL  -- when an operator dropped it: kept, so that meeting the entry again does not bring it back
);
-- the subscription versions set aside, looked up for every round recorded (kind 1: KIND_SUBSCRIBE)
CREATE INDEX IF NOT EXISTS quarantined_subscriptions ON quarantine(offset) WHERE kind = 1;
CREATE TABLE IF NOT EXISTS gateways (  -- the gateways sharing the store, while they renew their row
    gateway TEXT PRIMARY KEY,
    incarnation TEXT NOT NULL DEFAULT '',  -- of the process that holds the name
    fanned_out INTEGER NOT NULL,  -- the feed seq it has offered to its connections
    seen REAL NOT NULL  -- unix seconds of its last renewal
);
CREATE TABLE IF NOT EXISTS connections (  -- which gateway delivers to a connected subscription
    sub_id TEXT PRIMARY KEY,
    gateway TEXT NOT NULL,
    since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency (  -- publishers' idempotency keys while they are kept
    name TEXT PRIMARY KEY,  -- SHA-256 (hex) of [publisher, key] as JSON
    pub INTEGER NOT NULL,  -- the publication logged under it
    until INTEGER NOT NULL  -- ms since the epoch
);
CREATE INDEX IF NOT EXISTS idempotency_until ON idempotency(until);
CREATE TABLE IF NOT EXISTS webhooks (  -- subscriptions delivered by POSTs: where, signed with what
    sub_no INTEGER PRIMARY KEY,
    url TEXT NOT NULL,
    secret TEXT NOT NULL,
    batch INTEGER NOT NULL  -- deliveries per request at most
);
CREATE TABLE IF NOT EXISTS status (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL,
    updated REAL NOT NULL
);
"""


class SqliteStore(RelationalStore):
    failures = (StoreUnavailable, sqlite3.OperationalError)
    IN_IDS = "IN (SELECT value FROM json_each(?))"
    # numbers only grow (rows are never deleted), so the greatest plus one was never given
    NEW_NUMBER = "(SELECT MAX(no) + 1 FROM subscription_numbers)"
    NOT_IN_IDS = "NOT IN (SELECT value FROM json_each(?))"
    IN_NAMES = IN_IDS
    PAIRS = "(SELECT value ->> 0 AS sub_no, value ->> 1 AS pub FROM json_each(?)) AS j"
    TRIPLES = "(SELECT value ->> 0 AS sub_no, value ->> 1 AS pub, value ->> 2 AS size FROM json_each(?)) AS j"
    GREATEST = "MAX"
    LEAST = "MIN"
    ROW_LOCK = ""  # one writer at a time already

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
        self._pipeline_lock: int | None = None  # a file lock beside the store: the one pipeline holds it
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

    def _tx(self, write: bool = True, log: bool = True, feed: bool = True) -> Transaction:
        return Transaction(self._db(), ("BEGIN IMMEDIATE",) if write else ("BEGIN",), FAILURES)

    def _read(self) -> contextlib.nullcontext[Db]:
        return contextlib.nullcontext(self._db())

    # JSON parameters are bound as text: SQLite 3.45 and later read a blob given to its JSON functions
    # as binary JSONB wherever its first bytes happen to fit that format (`[1234]` does)
    def _ids(self, values: Sequence[int] | np.ndarray) -> str:
        return orjson.dumps(np.asarray(values, np.int64), option=orjson.OPT_SERIALIZE_NUMPY).decode()

    def _names(self, values: Sequence[str]) -> str:
        return orjson.dumps(list(values)).decode()

    def _pairs(self, sub_nos: np.ndarray, pubs: np.ndarray) -> tuple[str]:
        return (orjson.dumps(np.column_stack([sub_nos, pubs]), option=orjson.OPT_SERIALIZE_NUMPY).decode(),)

    def _triples(self, sub_nos: np.ndarray, pubs: np.ndarray, sizes: np.ndarray) -> tuple[str]:
        columns = np.column_stack([sub_nos, pubs, sizes]).astype(np.int64)
        return (orjson.dumps(columns, option=orjson.OPT_SERIALIZE_NUMPY).decode(),)

    def _insert_publications(self, db: Db, now: int, publications: list[Publication]) -> list[int]:
        db.executemany(
            f"INSERT INTO log(kind, body, client, key_id, signature, time) VALUES ({KIND_PUBLICATION}, ?, ?, ?, ?, ?)",
            [(p.body, p.publisher, p.key_id, p.signature, now) for p in publications],
        )
        last = db.execute("SELECT last_insert_rowid()").fetchone()[0]
        # One writer holds the lock for the whole transaction, so the rows got consecutive offsets.
        return list(range(last - len(publications) + 1, last + 1))

    def claim_pipeline(self) -> bool:
        if self._pipeline_lock is None:
            fd = os.open(self.path + ".pipeline", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self._pipeline_lock = fd
        return True

    def close(self) -> None:
        if self._pipeline_lock is not None:
            os.close(self._pipeline_lock)
            self._pipeline_lock = None
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()


def _migrate(db: sqlite3.Connection) -> None:
    """Bring a store written by an earlier release up to this schema."""
    for table, column, declaration in ADDED_COLUMNS:
        if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
    with Transaction(db, ("BEGIN IMMEDIATE",), FAILURES):
        if "meta" in {row[1] for row in db.execute("PRAGMA table_info(log)")}:
            db.execute(FROM_META)
            db.execute(NUMBERED, (KIND_SUBSCRIBE,))
            db.execute("ALTER TABLE log DROP COLUMN meta")
        db.execute(FEED_SEQ)
        db.execute(QUEUES_COUNTED)
        db.execute(WITHDRAWALS)
        db.execute(WITHDRAWALS_NAMED)
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'topk_bands'").fetchone():
            db.execute("INSERT OR REPLACE INTO subscription_state SELECT number, blob FROM topk_bands")
            db.execute("DROP TABLE topk_bands")
            for statement in STATUS_WITHOUT_TOPK:
                db.execute(statement)
        if "reset" in {row[1] for row in db.execute("PRAGMA table_info(subscription_numbers)")}:
            db.execute(RESET_AS_CURSOR)
            db.execute("ALTER TABLE subscription_numbers DROP COLUMN reset")
