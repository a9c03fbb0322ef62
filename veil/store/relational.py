"""The store written once in SQL, for every dialect: what each method reads and writes, in which
transaction. A dialect (`sqlite`, `postgres`) adds its schema, its connections and the few fragments
where SQL differs (array parameters, scalar min/max, how a batch of rows gets its offsets); the
statements here use `?` placeholders and quote `"offset"`, which both dialects accept.

Every write transaction is serialized against every other (SQLite's single writer; PostgreSQL's
transaction-level advisory lock), so offsets and feed sequence numbers become visible in the order
they were given: a reader that has seen offset N has seen everything below it.

What is queued where, and when it goes, is `veil.store.queues`'s policy: here is its SQL. The feed
table holds the packed feed rows, `deliveries` the spilled per-subscription rows; the `status` table
keeps the positions and figures the named methods read and write (it is no part of the interface).
"""

from __future__ import annotations

import contextlib
import time
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

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
    StoreUnavailable,
    UnknownAnnouncement,
    UnknownPublication,
    UnknownSubscription,
)
from veil.store.queues import NEVER, consumed_floor, horizon, matches_of, pack, spill_end, unconsumed, unpack


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Db(Protocol):
    """A connection as the statements use it: DB-API `execute`/`executemany` with `?` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...

    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Any: ...


def _status(name: str) -> str:
    return f"(SELECT COALESCE(MAX(value), 0) FROM status WHERE name = '{name}')"


SPILLED = _status("spilled")  # the last feed seq spilled
SPILL_POSITION = _status("spill_position")  # how far into the next feed row spilling got
PROCESSED = _status("processed")
# The highest feed seq ever given, even once compaction emptied the feed: written in the feed row's
# transaction, so that a reader never sees a seq whose row it cannot see yet.
LAST_FEED_SEQ = f"SELECT {_status('feed_seq')}"
# The oldest publication any queue holds. The key is (sub_no, pub): a plain MIN(pub) scans every
# queued row (180 ms at 5 M rows, once per compaction chunk), one seek per subscription number does not;
# EXISTS skips those seeks (100,000 of them at that many subscriptions) when nothing is queued.
OLDEST_QUEUED = (
    "(SELECT MIN((SELECT MIN(pub) FROM deliveries d WHERE d.sub_no = n.no)) FROM subscription_numbers n "
    "WHERE EXISTS (SELECT 1 FROM deliveries))"
)
NOT_QUARANTINED = 'NOT EXISTS (SELECT 1 FROM quarantine q WHERE q."offset" = s.created)'
QUARANTINE_PREVIEW = 4096  # bytes of a quarantined entry kept for the operator to look at
ORIGIN = "COALESCE(client, ''), key_id, signature, copy_of, cropped"  # the columns of an Origin
QUARANTINE_COLUMNS = 'seq, "offset", kind, sub_id, owner, error, body, time'
SUBSCRIPTION_ROWS = (
    "SELECT s.sub_id, n.no, s.owner, s.body FROM subscriptions s JOIN subscription_numbers n USING (sub_id) "
)


class RelationalStore(EventStore):
    # --- what a dialect provides ---------------------------------------------------------------
    IN_IDS: str  # `column IN_IDS` with one parameter made by `_ids`
    NOT_IN_IDS: str
    PAIRS: str  # a table j(sub_no, pub) of the parameters `_pairs` makes
    GREATEST: str  # the scalar max and min of two values
    LEAST: str

    @abstractmethod
    def _tx(self, write: bool = True) -> contextlib.AbstractContextManager[Db]:
        """A transaction: a write one is serialized against all others; a read one sees one snapshot."""

    @abstractmethod
    def _read(self) -> contextlib.AbstractContextManager[Db]:
        """A connection for single statements (each sees a snapshot of its own)."""

    @abstractmethod
    def _ids(self, values: Sequence[int] | np.ndarray) -> Any: ...

    @abstractmethod
    def _pairs(self, sub_nos: np.ndarray, pubs: np.ndarray) -> tuple[Any, ...]: ...

    @abstractmethod
    def _insert_publications(self, db: Db, now: int, publications: list[Publication]) -> list[int]:
        """Log the publications with consecutive offsets (the caller holds the write lock)."""

    def _feed_written(self, db: Db) -> None:
        """Signal a new feed row, for `wait_for_feed` (delivered when the transaction commits)."""

    # --- gateway side -------------------------------------------------------------------------
    def append_publications(self, publications: list[Publication]) -> list[int]:
        now = _now_ms()
        with self._tx() as db:
            offsets = self._insert_publications(db, now, publications)
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
                "INSERT INTO announcements(ann_id, owner, body) VALUES (?, ?, ?) "
                "ON CONFLICT (ann_id) DO UPDATE SET owner = excluded.owner, body = excluded.body",
                (ann_id, owner, body),
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
        with self._read() as db:
            return db.execute("SELECT owner, body FROM announcements WHERE ann_id = ?", (ann_id,)).fetchone()

    def cancel_publication(self, pub: int, publisher: str) -> int:
        with self._tx() as db:
            row = db.execute(
                'SELECT l.client FROM validity v JOIN log l ON l."offset" = v.pub '
                "WHERE v.pub = ? AND v.until > ? AND v.cancelled IS NULL",
                (pub, _now_ms()),
            ).fetchone()
            if row is None:
                raise UnknownPublication(pub)
            if row[0] != publisher:
                raise NotOwner("publication", pub)
            offset = self._log(db, "kind, time", (KIND_CANCEL, _now_ms()))
            db.execute("UPDATE validity SET cancelled = ? WHERE pub = ?", (offset, pub))
        return offset

    def valid_at(self, offset: int, time: int) -> list[tuple[int, bytes, str]]:
        with self._read() as db:
            return db.execute(
                "SELECT v.pub, l.body, COALESCE(l.client, '') FROM validity v "
                'JOIN log l ON l."offset" = v.pub '
                "WHERE v.pub < ? AND v.until > ? AND (v.cancelled IS NULL OR v.cancelled > ?) ORDER BY v.pub",
                (offset, time, offset),
            ).fetchall()

    def put_registry(self, body: bytes, file_digest: int | None = None) -> int:
        with self._tx() as db:
            offset = self._log(db, "kind, body, time", (KIND_REGISTRY, body, _now_ms()))
            db.execute('INSERT INTO registry("offset", body) VALUES (?, ?)', (offset, body))
            if file_digest is not None:
                _set(db, "registry_file", file_digest)
        return offset

    def registry_file_digest(self) -> int | None:
        with self._read() as db:
            return _get(db, "registry_file")

    def append_tick(self) -> int:
        with self._tx() as db:
            return self._log(db, "kind, time", (KIND_TICK, _now_ms()))

    def registry_at(self, offset: int | None = None) -> bytes | None:
        with self._read() as db:
            row = db.execute(
                'SELECT body FROM registry WHERE "offset" <= ? ORDER BY "offset" DESC LIMIT 1',
                (NEVER if offset is None else offset,),
            ).fetchone()
        return row[0] if row else None

    def put_subscription(self, sub_id: str, owner: str, body: bytes) -> int:
        with self._tx() as db:
            current = _live_owner(db, sub_id)
            if current is not None and current != owner:
                raise NotOwner("subscription", sub_id)
            db.execute(  # not ON CONFLICT: PostgreSQL would use up a number on every replacement
                "INSERT INTO subscription_numbers(sub_id) SELECT ? "
                "WHERE NOT EXISTS (SELECT 1 FROM subscription_numbers WHERE sub_id = ?)",
                (sub_id, sub_id),
            )
            offset = db.execute(
                "INSERT INTO log(kind, sub_id, body, client, time, number) "
                'SELECT ?, ?, ?, ?, ?, no FROM subscription_numbers WHERE sub_id = ? RETURNING "offset"',
                (KIND_SUBSCRIBE, sub_id, body, owner, _now_ms(), sub_id),
            ).fetchone()[0]
            db.execute("UPDATE subscriptions SET deleted = ? WHERE sub_id = ? AND deleted IS NULL", (offset, sub_id))
            db.execute(
                "INSERT INTO subscriptions(sub_id, created, owner, body) VALUES (?, ?, ?, ?)",
                (sub_id, offset, owner, body),
            )
            _changed(db)
        return offset

    def remove_subscription(self, sub_id: str, owner: str) -> int:
        with self._tx() as db:
            current = _live_owner(db, sub_id)
            if current is None:
                raise UnknownSubscription(sub_id)
            if current != owner:
                raise NotOwner("subscription", sub_id)
            offset = self._log(db, "kind, sub_id, time", (KIND_UNSUBSCRIBE, sub_id, _now_ms()))
            db.execute("UPDATE subscriptions SET deleted = ? WHERE sub_id = ? AND deleted IS NULL", (offset, sub_id))
            # matches computed before the unsubscription may still arrive in the feed: they are never
            # spilled or served, since only live subscriptions get them and only after their reset
            db.execute("UPDATE subscription_numbers SET reset = ? WHERE sub_id = ?", (offset, sub_id))
            db.execute(
                "DELETE FROM deliveries WHERE sub_no = (SELECT no FROM subscription_numbers WHERE sub_id = ?)",
                (sub_id,),
            )
            db.execute("DELETE FROM cursors WHERE sub_id = ?", (sub_id,))
            _changed(db)
        return offset

    def subscription_owner(self, sub_id: str) -> str | None:
        with self._read() as db:
            return _live_owner(db, sub_id)

    def subscription_number(self, sub_id: str) -> int | None:
        with self._read() as db:
            row = db.execute("SELECT no FROM subscription_numbers WHERE sub_id = ?", (sub_id,)).fetchone()
        return row[0] if row else None

    def feed_since(self, seq: int, limit: int) -> list[FeedEntry]:
        with self._read() as db:
            rows = db.execute(
                "SELECT seq, pairs, cropped FROM feed WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)
            ).fetchall()
        return [unpack(entry_seq, pairs, bool(cropped)) for entry_seq, pairs, cropped in rows]

    def bodies(self, pubs: np.ndarray) -> dict[int, tuple[bytes, Origin]]:
        with self._read() as db:
            return self._bodies(db, pubs)

    def _bodies(self, db: Db, pubs: np.ndarray) -> dict[int, tuple[bytes, Origin]]:
        rows = db.execute(f'SELECT "offset", body, {ORIGIN} FROM log WHERE "offset" {self.IN_IDS}', (self._ids(pubs),))
        return {row[0]: (row[1], _origin(row[2:])) for row in rows}

    def copies(self, sub_nos: np.ndarray, pubs: np.ndarray) -> dict[tuple[int, int], bytes]:
        with self._read() as db:
            return self._copies(db, sub_nos, pubs)

    def _copies(self, db: Db, sub_nos: np.ndarray, pubs: np.ndarray) -> dict[tuple[int, int], bytes]:
        if not len(pubs):
            return {}
        rows = db.execute(
            f"SELECT c.sub_no, c.pub, c.body FROM copies c JOIN {self.PAIRS} ON c.sub_no = j.sub_no AND c.pub = j.pub",
            self._pairs(sub_nos, pubs),
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
                    'FROM deliveries d JOIN log l ON l."offset" = d.pub '
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

    @staticmethod
    def _unspilled(db: Db, number: int, floor: int, upto_seq: int, limit: int) -> np.ndarray:
        """A subscription's matches after `floor` in the feed rows not yet spilled: a binary search in
        each row, whose pairs are sorted by subscription number."""
        found: list[np.ndarray] = []
        count = 0
        rows = db.execute(f"SELECT pairs FROM feed WHERE seq > {SPILLED} AND seq <= ? ORDER BY seq", (upto_seq,))
        for (pairs,) in rows:
            found.append(matches_of(unpack(0, pairs), number, floor))
            count += len(found[-1])
            if count >= limit:
                break
        return np.concatenate(found)[:limit] if found else np.empty(0, np.int64)

    def cursor(self, sub_id: str) -> int:
        with self._read() as db:
            row = db.execute("SELECT pub FROM cursors WHERE sub_id = ?", (sub_id,)).fetchone()
        return row[0] if row else 0

    def save_cursors(self, cursors: dict[str, int]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT INTO cursors(sub_id, pub) SELECT ?, ? WHERE EXISTS "
                "(SELECT 1 FROM subscriptions WHERE sub_id = ? AND deleted IS NULL) "
                f"ON CONFLICT (sub_id) DO UPDATE SET pub = {self.GREATEST}(cursors.pub, excluded.pub)",
                [(sub_id, pub, sub_id) for sub_id, pub in cursors.items()],
            )
            _changed(db)

    def head_offset(self) -> int:
        with self._read() as db:
            return db.execute('SELECT COALESCE(MAX("offset"), 0) FROM log').fetchone()[0]

    def last_feed_seq(self) -> int:
        with self._read() as db:
            return db.execute(LAST_FEED_SEQ).fetchone()[0]

    # --- pipeline side ------------------------------------------------------------------------
    def log_range(self, start: int, end: int, without: tuple[int, ...] = ()) -> list[LogEntry]:
        with self._read() as db:
            rows = db.execute(
                'SELECT "offset", kind, sub_id, body, client, COALESCE(time, 0), number FROM log '
                f'WHERE "offset" > ? AND "offset" <= ? AND kind {self.NOT_IN_IDS} ORDER BY "offset"',
                (start, end, self._ids(without)),
            ).fetchall()
        return [LogEntry(*row) for row in rows]

    def subscriptions_at(self, offset: int) -> list[tuple[str, int, str, bytes]]:
        with self._read() as db:
            rows = db.execute(
                SUBSCRIPTION_ROWS
                + f"WHERE s.created <= ? AND (s.deleted IS NULL OR s.deleted > ?) AND {NOT_QUARANTINED}",
                (offset, offset),
            ).fetchall()
        return rows

    def subscription_changes(self, after: int, upto: int) -> tuple[list[str], list[tuple[str, int, str, bytes]]]:
        with self._tx(write=False) as db:
            dropped = [
                row[0]
                for row in db.execute(
                    "SELECT sub_id FROM subscriptions WHERE deleted > ? AND deleted <= ?", (after, upto)
                )
            ]
            added = db.execute(
                SUBSCRIPTION_ROWS + "WHERE s.created > ? AND s.created <= ? AND (s.deleted IS NULL OR s.deleted > ?) "
                f"AND {NOT_QUARANTINED} ORDER BY s.created",
                (after, upto, upto),
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
                seq = db.execute(
                    "INSERT INTO feed(pairs, first, created, cropped) VALUES (?, ?, ?, ?) RETURNING seq",
                    (pairs, first, now, bool(copies)),
                ).fetchone()[0]
                _set(db, "feed_seq", seq)
                self._feed_written(db)
                db.executemany(
                    "INSERT INTO copies(sub_no, pub, body) VALUES (?, ?, ?) "
                    "ON CONFLICT (sub_no, pub) DO UPDATE SET body = excluded.body",
                    copies,
                )
            if processed > done:
                self._quarantine(db, quarantined, processed, now)
            db.executemany(
                "INSERT INTO status(name, value, updated) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE "
                f"SET value = {self.GREATEST}(status.value, excluded.value), updated = excluded.updated",
                [("processed", processed, now), ("batch", batch_id, now)],
            )
            if len(pubs) and processed > done:
                _set(db, "matches_per_entry", -(-len(pubs) // (processed - done)))

    def _record_stateful(self, db: Db, batch: StatefulBatch) -> list[tuple[int, int]]:
        """Log each delivery as a copy of its publication (the envelope keeps the original's id) and
        keep the skybands; returns the (subscription number, copy offset) matches."""
        originals = {
            row[0]: row[1:]
            for row in db.execute(
                f'SELECT "offset", body, client, key_id, signature FROM log WHERE "offset" {self.IN_IDS}',
                (self._ids([pub for _, pub, _ in batch.deliveries]),),
            )
        }
        logged = []
        now = _now_ms()
        for number, pub, cropped in batch.deliveries:
            if pub not in originals:  # kept while any skyband holds it: gone means nobody does
                continue
            body, client, key_id, signature = originals[pub]
            offset = self._log(
                db,
                "kind, body, client, key_id, signature, copy_of, cropped, time",
                (KIND_COPY, cropped or body, client, key_id, signature, pub, cropped is not None, now),
            )
            logged.append((number, offset))
        db.executemany(
            "INSERT INTO topk_bands(number, blob) VALUES (?, ?) "
            "ON CONFLICT (number) DO UPDATE SET blob = excluded.blob",
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
    def _log(db: Db, columns: str, values: tuple[Any, ...]) -> int:
        """Append one log entry; returns its offset."""
        marks = ", ".join("?" * len(values))
        return db.execute(f'INSERT INTO log({columns}) VALUES ({marks}) RETURNING "offset"', values).fetchone()[0]

    @staticmethod
    def _quarantine(db: Db, entries: Sequence[Quarantined], processed: int, now: float) -> None:
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
                    'SELECT client, substr(body, 1, ?) FROM log WHERE "offset" = ?', (QUARANTINE_PREVIEW, offset)
                ).fetchone()
                if row is not None:
                    owner, body = owner or row[0], row[1]
            db.execute(
                'INSERT INTO quarantine("offset", kind, sub_id, owner, error, body, time) '
                'VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT ("offset") DO NOTHING',
                (offset, entry.kind, entry.sub_id, owner, entry.error, body, now),
            )

    def quarantine(self, after: int = 0, limit: int = 1000) -> list[QuarantineRecord]:
        with self._read() as db:
            rows = db.execute(
                f"SELECT {QUARANTINE_COLUMNS} FROM quarantine WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
            ).fetchall()
        return [QuarantineRecord(*row) for row in rows]

    def quarantine_count(self) -> int:
        with self._read() as db:
            return db.execute("SELECT COUNT(*) FROM quarantine").fetchone()[0]

    def quarantined_at(self, offset: int) -> QuarantineRecord | None:
        with self._read() as db:
            row = db.execute(f'SELECT {QUARANTINE_COLUMNS} FROM quarantine WHERE "offset" = ?', (offset,)).fetchone()
        return None if row is None else QuarantineRecord(*row)

    def release_quarantined(self, offset: int) -> bool:
        with self._tx() as db:
            return db.execute('DELETE FROM quarantine WHERE "offset" = ?', (offset,)).rowcount > 0

    def subscription_refusal(self, sub_id: str) -> str | None:
        with self._read() as db:
            row = db.execute(
                'SELECT q.error FROM subscriptions s JOIN quarantine q ON q."offset" = s.created '
                "WHERE s.sub_id = ? AND s.deleted IS NULL",
                (sub_id,),
            ).fetchone()
        return row[0] if row else None

    def topk_bands(self, numbers: Sequence[int]) -> dict[int, bytes]:
        with self._read() as db:
            rows = db.execute(
                f"SELECT number, blob FROM topk_bands WHERE number {self.IN_IDS}", (self._ids(numbers),)
            ).fetchall()
        return dict(rows)

    def processed_offset(self) -> int:
        with self._read() as db:
            return _get(db, "processed") or 0

    def matches_per_entry(self) -> int:
        with self._read() as db:
            return _get(db, "matches_per_entry") or 0

    def topk_due(self) -> int | None:
        with self._read() as db:
            return _get(db, "topk_due")

    def register_pipeline(self, pid: int) -> None:
        with self._tx() as db:
            _set(db, "pipeline", pid)

    def expect_pipeline(self) -> None:
        self.register_pipeline(0)

    def heartbeat(self, batch_since: int) -> None:
        with self._tx() as db:
            _set(db, "heartbeat", batch_since)

    def pipeline_status(self) -> PipelineStatus | None:
        with self._read() as db:
            rows = {
                name: (value, updated)
                for name, value, updated in db.execute(
                    "SELECT name, value, updated FROM status WHERE name IN ('pipeline', 'heartbeat')"
                )
            }
        if "pipeline" not in rows:
            return None
        (pid, registered), beat = rows["pipeline"], rows.get("heartbeat")
        return PipelineStatus(pid, registered, beat[0] if beat else 0, beat[1] if beat else None)

    def compact(self, limit: int, fanned_out: int, spill_before: float) -> int:
        with self._tx() as db:
            changes = _get(db, "changes") or 0
            # the hub offers entries to connected sessions first; spilling one it has not offered yet
            # would write rows that are about to be consumed
            spilled = self._spill(db, fanned_out, spill_before, limit, changes)
            consumed = 0
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
            fed = db.execute(f"DELETE FROM feed WHERE seq <= {self.LEAST}(?, {SPILLED})", (fanned_out,)).rowcount
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
                'SELECT COALESCE(MAX(time), 0) FROM log WHERE "offset" = '
                '(SELECT MAX("offset") FROM log WHERE "offset" <= ?)',
                (processed,),
            ).fetchone()[0]
            published = db.execute(
                "DELETE FROM validity WHERE until <= ? OR cancelled <= ?", (clock, processed)
            ).rowcount
            published += db.execute(
                'DELETE FROM log WHERE "offset" IN (SELECT "offset" FROM log WHERE kind IN (?, ?, ?, ?) '
                'AND "offset" <= ? AND "offset" NOT IN (SELECT pub FROM validity) ORDER BY "offset" LIMIT ?)',
                (KIND_PUBLICATION, KIND_COPY, KIND_TICK, KIND_CANCEL, below, limit),
            ).rowcount
            published += db.execute("DELETE FROM copies WHERE pub <= ?", (below,)).rowcount
        return spilled + consumed + fed + published

    def _spill(self, db: Db, upto: int, before: float, limit: int, changes: int) -> int:
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
            floor = self._consumed_floor(db, changes) if floor is None else floor
            keep = unconsumed(sub_nos, pubs, floor)
            if keep.any():  # pairs are sorted by (subscription, publication): the B-tree fills in order
                db.execute(
                    # WHERE: without it, SQLite reads ON CONFLICT as the ON of a join
                    f"INSERT INTO deliveries(sub_no, pub) SELECT j.sub_no, j.pub FROM {self.PAIRS} WHERE TRUE "
                    "ON CONFLICT (sub_no, pub) DO NOTHING",
                    self._pairs(sub_nos[keep], pubs[keep]),
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

    def _consumed_floor(self, db: Db, changes: int) -> np.ndarray:
        """`consumed_floor`, derived again only when subscriptions or cursors changed (at 100,000
        subscriptions, deriving it for every step was most of compaction's time)."""
        if self._floor is not None and self._floor[0] == changes:
            return self._floor[1]
        floor = consumed_floor(
            db.execute(
                f"SELECT n.no, {self.GREATEST}(n.reset, COALESCE(c.pub, 0)) FROM subscriptions s "
                "JOIN subscription_numbers n USING (sub_id) LEFT JOIN cursors c USING (sub_id) "
                "WHERE s.deleted IS NULL"
            ).fetchall()
        )
        self._floor = (changes, floor)
        return floor

    # What compaction derived from subscriptions and cursors, valid while the store's count of their
    # changes (`_changed`, kept in the store so that every gateway's changes count) stands still.
    _floor: tuple[int, np.ndarray] | None = None
    _consumed_clean = -1  # that count when compaction last found no consumed rows left


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _origin(row: Sequence[Any], cropped: bool = False) -> Origin:
    """An Origin from the ORIGIN columns; `cropped`: the subscriber gets a cropped copy."""
    publisher, key_id, signature, copy_of, was_cropped = row
    return Origin(publisher, key_id, signature, copy_of, bool(was_cropped or cropped))


def _get(db: Db, name: str) -> int | None:
    row = db.execute("SELECT value FROM status WHERE name = ?", (name,)).fetchone()
    return row[0] if row else None


def _set(db: Db, name: str, value: int) -> None:
    db.execute(
        "INSERT INTO status(name, value, updated) VALUES (?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated = excluded.updated",
        (name, value, time.time()),
    )


def _changed(db: Db) -> None:
    """Count a change of subscriptions or cursors, in its own transaction."""
    db.execute(
        "INSERT INTO status(name, value, updated) VALUES ('changes', 1, ?) "
        "ON CONFLICT (name) DO UPDATE SET value = status.value + 1, updated = excluded.updated",
        (time.time(),),
    )


def _live_owner(db: Db, sub_id: str) -> str | None:
    row = db.execute("SELECT owner FROM subscriptions WHERE sub_id = ? AND deleted IS NULL", (sub_id,)).fetchone()
    return row[0] if row else None


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
