"""What the relational store's parts share: the connection protocol its statements use, the
transaction, the fragments and hooks a dialect provides, and the `status` table's helpers."""

from __future__ import annotations

import contextlib
import time
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from veil.store.base import BATCH_BOUNDS_MS, EventStore, Publication, StoreUnavailable


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Db(Protocol):
    """A connection as the statements use it: DB-API `execute`/`executemany` with `?` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor: ...

    def executemany(self, sql: str, params: Sequence[Sequence[Any]], /) -> Any: ...


def status_value(name: str, default: int | None = 0) -> str:
    """A status row's value as a scalar subquery (`default` when there is no row; None: NULL)."""
    value = "MAX(value)" if default is None else f"COALESCE(MAX(value), {default})"
    return f"(SELECT {value} FROM status WHERE name = '{name}')"


SPILLED = status_value("spilled")  # the last feed seq spilled
SPILL_POSITION = status_value("spill_position")  # how far into the next feed row spilling got
PROCESSED = status_value("processed")
# The highest feed seq ever given, even once compaction emptied the feed: written in the feed row's
# transaction, so that a reader never sees a seq whose row it cannot see yet.
LAST_FEED_SEQ = f"SELECT {status_value('feed_seq')}"


class Dialect(EventStore):
    """What a dialect provides; every part of the relational store builds on it."""

    IN_IDS: str  # `column IN_IDS` with one parameter made by `_ids`
    NOT_IN_IDS: str
    IN_NAMES: str  # `column IN_NAMES` with one parameter made by `_names`
    PAIRS: str  # a table j(sub_no, pub) of the parameters `_pairs` makes
    TRIPLES: str  # a table j(sub_no, pub, size) of the parameters `_triples` makes
    GREATEST: str  # the scalar max and min of two values
    LEAST: str
    ROW_LOCK: str  # after a SELECT in a write transaction: a writer without the write lock waits for it
    NEW_NUMBER: str  # a subscription number never given before (the caller holds the write locks: both, on PostgreSQL)

    @abstractmethod
    def _tx(self, write: bool = True, log: bool = True, feed: bool = True) -> contextlib.AbstractContextManager[Db]:
        """A transaction: a write one is serialized against every other holding an order it holds
        (`log`: it gives log offsets, `feed`: feed sequence numbers; a write holding both, the default,
        is serialized against all others); a read one sees one snapshot. SQLite's file has one
        writer, so there every write is serialized against all others."""

    @abstractmethod
    def _read(self) -> contextlib.AbstractContextManager[Db]:
        """A connection for single statements (each sees a snapshot of its own)."""

    failures: tuple[type[Exception], ...]  # what the dialect's driver raises for the store's condition

    @contextlib.contextmanager
    def _alone(self) -> Iterator[Db]:
        """A write of one statement, its own transaction, without the locks `_tx` takes on
        PostgreSQL (SQLite's file still has one writer at a time); a failure is the store's
        (StoreUnavailable), as in a `Transaction`."""
        try:
            with self._read() as db:
                yield db
        except StoreUnavailable:
            raise
        except self.failures as exc:
            raise StoreUnavailable(str(exc)) from exc

    def _hold_log(self, db: Db) -> None:
        """In a write transaction holding the feed's order alone (`_tx(log=False)`), take the log's
        too, once it turns out to give log offsets (SQLite's one writer holds everything already)."""

    def _pipelined(self, db: Db) -> contextlib.AbstractContextManager[object]:
        """Statements whose results nobody reads, sent together where the store is across a network:
        one round trip for all of them instead of one each, where a transaction holding a write
        lock waits for every one (an error surfaces when the block ends)."""
        return contextlib.nullcontext()

    @abstractmethod
    def _ids(self, values: Sequence[int] | np.ndarray) -> Any: ...

    @abstractmethod
    def _names(self, values: Sequence[str]) -> Any: ...

    @abstractmethod
    def _pairs(self, sub_nos: np.ndarray, pubs: np.ndarray) -> tuple[Any, ...]: ...

    @abstractmethod
    def _triples(self, sub_nos: np.ndarray, pubs: np.ndarray, sizes: np.ndarray) -> tuple[Any, ...]: ...

    def _live_numbers(self, db: Db, sub_ids: Sequence[str]) -> dict[str, int]:
        """The numbers of these ids' live subscriptions (an id without one is left out)."""
        rows = db.execute(
            "SELECT s.sub_id, n.no FROM subscriptions s JOIN subscription_numbers n USING (sub_id) "
            f"WHERE s.sub_id {self.IN_NAMES} AND s.deleted IS NULL",
            (self._names(sub_ids),),
        ).fetchall()
        return dict(rows)

    @abstractmethod
    def _insert_publications(self, db: Db, now: int, publications: list[Publication]) -> list[int]:
        """Log the publications with consecutive offsets (the caller holds the log's lock)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def get_status(db: Db, name: str) -> int | None:
    row = db.execute("SELECT value FROM status WHERE name = ?", (name,)).fetchone()
    return row[0] if row else None


def set_status(db: Db, name: str, value: int) -> None:
    set_statuses(db, {name: value})


def set_statuses(db: Db, values: dict[str, int]) -> None:
    """Several status rows in one statement (one round trip, and its own transaction outside one)."""
    now = time.time()
    db.execute(
        f"INSERT INTO status(name, value, updated) VALUES {', '.join(['(?, ?, ?)'] * len(values))} "
        "ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated = excluded.updated",
        [item for name, value in values.items() for item in (name, value, now)],
    )


def add_status(db: Db, name: str, amount: int) -> None:
    add_statuses(db, {name: amount})


def add_statuses(db: Db, amounts: dict[str, int]) -> None:
    """Add to several counters in one statement."""
    now = time.time()
    db.execute(
        f"INSERT INTO status(name, value, updated) VALUES {', '.join(['(?, ?, ?)'] * len(amounts))} "
        "ON CONFLICT (name) DO UPDATE SET value = status.value + excluded.value, updated = excluded.updated",
        [item for name, amount in amounts.items() for item in (name, amount, now)],
    )


def partition_progress(db: Db, part: int) -> int:
    """How far matcher partition `part` has recorded the log: its own row, or where the whole pipeline
    was when it had none (a store recorded before partitions kept their own progress)."""
    own = get_status(db, f"processed.{part}")
    return own if own is not None else get_status(db, "processed") or 0


# Status rows of an earlier release, named for the one stateful kind there was (a row of the new name,
# written by this release while one of the earlier one also ran, gives way)
STATUS_WITHOUT_TOPK = (
    "DELETE FROM status WHERE name IN (SELECT substr(name, 6) FROM status WHERE name LIKE 'topk%')",
    "UPDATE status SET name = substr(name, 6) WHERE name LIKE 'topk%'",
)


def set_least(db: Db, name: str, prefix: str) -> None:
    """Status `name` becomes the least of the rows named `prefix`<partition> (gone when there are
    none): each partition records its own progress and its stateful subscriptions' due and held
    moments, the gateway and compaction read the whole pipeline's. Write transactions are
    serialized, so every row read is current. Two statements whose results are not read, so that
    they may be sent together with others (`Dialect._pipelined`)."""
    db.execute(
        "INSERT INTO status(name, value, updated) SELECT ?, m.least, ? "
        "FROM (SELECT MIN(value) AS least FROM status WHERE name LIKE ?) AS m WHERE m.least IS NOT NULL "
        "ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated = excluded.updated",
        (name, time.time(), prefix + "%"),
    )
    db.execute(
        "DELETE FROM status WHERE name = ? AND NOT EXISTS (SELECT 1 FROM status WHERE name LIKE ?)",
        (name, prefix + "%"),
    )


def duration_counts(durations: Sequence[int]) -> dict[str, int]:
    """Matching rounds' durations (ms) as counts to add to the buckets of BATCH_BOUNDS_MS and to their sum."""
    buckets = np.bincount(np.searchsorted(BATCH_BOUNDS_MS, durations), minlength=len(BATCH_BOUNDS_MS) + 1)
    counts = {f"batch_{i}": int(buckets[i]) for i in np.flatnonzero(buckets).tolist()}
    if len(durations):
        counts["batch_ms"] = int(sum(durations))
    return counts


def count_change(db: Db) -> None:
    """Count a change of subscriptions or cursors, in its own transaction."""
    add_status(db, "changes", 1)


class Transaction:
    """BEGIN ... COMMIT, rolled back on error: no half-written state. A full disk, an I/O error, a
    lost connection or a lock held too long (`failures`) is the store's condition, not the caller's
    mistake: it surfaces as StoreUnavailable (the gateway answers 503), with nothing half-written."""

    def __init__(self, db: Db, begin: Sequence[str], failures: tuple[type[Exception], ...]) -> None:
        self.db = db
        self.begin = begin
        self.failures = failures

    def __enter__(self) -> Db:
        try:
            for statement in self.begin:
                self.db.execute(statement)
        except self.failures as exc:
            with contextlib.suppress(Exception):
                self.db.execute("ROLLBACK")
            raise StoreUnavailable(str(exc)) from exc
        return self.db

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, *_: object) -> None:
        try:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        except self.failures as failure:
            if exc_type is None:
                with contextlib.suppress(Exception):
                    self.db.execute("ROLLBACK")
                raise StoreUnavailable(str(failure)) from failure
        if isinstance(exc, self.failures):
            raise StoreUnavailable(str(exc)) from exc
