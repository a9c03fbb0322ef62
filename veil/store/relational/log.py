"""The log and what is logged in it: publications, withdrawals, registry versions, ticks,
subscription changes (with their owners and numbers) and edge brokers' announcements."""

from __future__ import annotations

from typing import Any

from veil.store.base import (
    KIND_CANCEL,
    KIND_REGISTRY,
    KIND_SUBSCRIBE,
    KIND_TICK,
    KIND_UNSUBSCRIBE,
    LogEntry,
    NotOwner,
    Publication,
    TooMany,
    UnknownAnnouncement,
    UnknownPublication,
    UnknownSubscription,
)
from veil.store.queues import NEVER
from veil.store.relational.dialect import Db, Dialect, add_status, count_change, get_status, now_ms, set_status

NOT_QUARANTINED = 'NOT EXISTS (SELECT 1 FROM quarantine q WHERE q."offset" = s.created)'
SUBSCRIPTION_ROWS = (
    "SELECT s.sub_id, n.no, s.owner, s.body FROM subscriptions s JOIN subscription_numbers n USING (sub_id) "
)


class LogSql(Dialect):
    def append_publications(self, publications: list[Publication]) -> list[int]:
        now = now_ms()
        with self._tx() as db:
            offsets = self._insert_publications(db, now, publications)
            add_status(db, "received", len(offsets))
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
                (pub, now_ms()),
            ).fetchone()
            if row is None:
                raise UnknownPublication(pub)
            if row[0] != publisher:
                raise NotOwner("publication", pub)
            offset = append_entry(db, "kind, time", (KIND_CANCEL, now_ms()))
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
            offset = append_entry(db, "kind, body, time", (KIND_REGISTRY, body, now_ms()))
            db.execute('INSERT INTO registry("offset", body) VALUES (?, ?)', (offset, body))
            if file_digest is not None:
                set_status(db, "registry_file", file_digest)
        return offset

    def registry_file_digest(self) -> int | None:
        with self._read() as db:
            return get_status(db, "registry_file")

    def append_tick(self) -> int:
        with self._tx() as db:
            return append_entry(db, "kind, time", (KIND_TICK, now_ms()))

    def registry_at(self, offset: int | None = None) -> bytes | None:
        with self._read() as db:
            row = db.execute(
                'SELECT body FROM registry WHERE "offset" <= ? ORDER BY "offset" DESC LIMIT 1',
                (NEVER if offset is None else offset,),
            ).fetchone()
        return row[0] if row else None

    def put_subscription(self, sub_id: str, owner: str, body: bytes, most: int | None = None) -> int:
        with self._tx() as db:
            current = _live_owner(db, sub_id)
            if current is not None and current != owner:
                raise NotOwner("subscription", sub_id)
            if current is None and most is not None:
                held = db.execute(
                    "SELECT COUNT(*) FROM subscriptions WHERE owner = ? AND deleted IS NULL", (owner,)
                ).fetchone()[0]
                if held >= most:
                    raise TooMany("subscriptions", most)
            db.execute(  # not ON CONFLICT: PostgreSQL would use up a number on every replacement
                "INSERT INTO subscription_numbers(sub_id) SELECT ? "
                "WHERE NOT EXISTS (SELECT 1 FROM subscription_numbers WHERE sub_id = ?)",
                (sub_id, sub_id),
            )
            offset = db.execute(
                "INSERT INTO log(kind, sub_id, body, client, time, number) "
                'SELECT ?, ?, ?, ?, ?, no FROM subscription_numbers WHERE sub_id = ? RETURNING "offset"',
                (KIND_SUBSCRIBE, sub_id, body, owner, now_ms(), sub_id),
            ).fetchone()[0]
            db.execute("UPDATE subscriptions SET deleted = ? WHERE sub_id = ? AND deleted IS NULL", (offset, sub_id))
            db.execute(
                "INSERT INTO subscriptions(sub_id, created, owner, body) VALUES (?, ?, ?, ?)",
                (sub_id, offset, owner, body),
            )
            count_change(db)
        return offset

    def remove_subscription(self, sub_id: str, owner: str) -> int:
        with self._tx() as db:
            current = _live_owner(db, sub_id)
            if current is None:
                raise UnknownSubscription(sub_id)
            if current != owner:
                raise NotOwner("subscription", sub_id)
            offset = append_entry(db, "kind, sub_id, time", (KIND_UNSUBSCRIBE, sub_id, now_ms()))
            db.execute("UPDATE subscriptions SET deleted = ? WHERE sub_id = ? AND deleted IS NULL", (offset, sub_id))
            # matches computed before the unsubscription may still arrive in the feed: they are never
            # spilled or served, since only live subscriptions get them and only after their reset
            db.execute("UPDATE subscription_numbers SET reset = ? WHERE sub_id = ?", (offset, sub_id))
            db.execute(
                "DELETE FROM deliveries WHERE sub_no = (SELECT no FROM subscription_numbers WHERE sub_id = ?)",
                (sub_id,),
            )
            db.execute("DELETE FROM cursors WHERE sub_id = ?", (sub_id,))
            count_change(db)
        return offset

    def subscription_owner(self, sub_id: str) -> str | None:
        with self._read() as db:
            return _live_owner(db, sub_id)

    def subscription_number(self, sub_id: str) -> int | None:
        with self._read() as db:
            row = db.execute("SELECT no FROM subscription_numbers WHERE sub_id = ?", (sub_id,)).fetchone()
        return row[0] if row else None

    def head_offset(self) -> int:
        with self._read() as db:
            return db.execute('SELECT COALESCE(MAX("offset"), 0) FROM log').fetchone()[0]

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


def _live_owner(db: Db, sub_id: str) -> str | None:
    row = db.execute("SELECT owner FROM subscriptions WHERE sub_id = ? AND deleted IS NULL", (sub_id,)).fetchone()
    return row[0] if row else None


def append_entry(db: Db, columns: str, values: tuple[Any, ...]) -> int:
    """Append one log entry; returns its offset."""
    marks = ", ".join("?" * len(values))
    return db.execute(f'INSERT INTO log({columns}) VALUES ({marks}) RETURNING "offset"', values).fetchone()[0]
