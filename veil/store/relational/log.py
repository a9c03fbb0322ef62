"""The log and what is logged in it: publications, withdrawals, registry versions, ticks,
subscription changes (with their owners and numbers) and edge brokers' announcements.

A subscription is its owner's: a number is given to each creation of one, kept while its owner
replaces it, and never given again, so that whatever was matched, queued, offered or ranked for a
subscription (all of it by number) reaches no later subscription that takes the same id. The
`subscription_numbers` table holds each id's newest number; the log entry of each version keeps its own."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import orjson

from veil.store.base import (
    KEYS_KEPT,
    KIND_CANCEL,
    KIND_PUBLICATION,
    KIND_REGISTRY,
    KIND_SUBSCRIBE,
    KIND_TICK,
    KIND_UNSUBSCRIBE,
    LiveSubscription,
    LogEntry,
    NotOwner,
    Publication,
    QueueBounds,
    StaleRegistry,
    TooMany,
    UnknownAnnouncement,
    UnknownPublication,
    UnknownSubscription,
    Webhook,
)
from veil.store.queues import NEVER
from veil.store.relational.dialect import (
    PROCESSED,
    Db,
    Dialect,
    add_status,
    count_change,
    get_status,
    now_ms,
    set_status,
)

# ms by which the clocks of gateways sharing a store (which time what they log) may disagree: a replay
# looks that far before the first entry its clock reaches, and filters by time from there
CLOCKS_DIFFER = 60_000
HEAD = 'SELECT COALESCE(MAX("offset"), 0) FROM log'
HEAD_POLL = 0.002  # seconds between looks at the log's head while waiting for a commit, where polled
NOT_QUARANTINED = 'NOT EXISTS (SELECT 1 FROM quarantine q WHERE q."offset" = s.created)'
# each version with the number it was logged with: an id freed and taken again has a newer one
SUBSCRIPTION_ROWS = (
    'SELECT s.sub_id, l.number, s.owner, s.body FROM subscriptions s JOIN log l ON l."offset" = s.created '
)
# an id's live subscription: its owner and number
LIVE = (
    "SELECT s.owner, n.no FROM subscriptions s JOIN subscription_numbers n USING (sub_id) "
    "WHERE s.sub_id = ? AND s.deleted IS NULL"
)
# `subscription_numbers n` names a live subscription (of its id, the newest number names the live one);
# as EXISTS, so that a query over numbers stays driven by them (as a join, SQLite's planner may walk
# every live subscription and look each up in the numbers asked: 46 s for 18,000 of 20,000)
LIVE_NUMBER = "SELECT 1 FROM subscriptions s WHERE s.sub_id = n.sub_id AND s.deleted IS NULL"


class LogSql(Dialect):
    def append_publications(
        self, publications: list[Publication], registry: int | None = None, keys_kept: int = KEYS_KEPT
    ) -> list[int]:
        now = now_ms()
        if all(p.key is None for p in publications):  # (the common case)
            return self._append_unkeyed(now, publications, registry)
        with self._tx(feed=False) as db:
            _check_registry(db, registry)
            names = [_key_name(p) for p in publications]
            known = dict(
                db.execute(
                    f"SELECT name, pub FROM idempotency WHERE name {self.IN_NAMES} AND until > ?",
                    (self._names([n for n in names if n is not None]), now),
                ).fetchall()
            )
            # a key's first publication in this call is logged; its repeats, here or earlier, take its offset
            first: dict[str, int] = {}  # name -> place of its first publication here
            new = [
                at for at, name in enumerate(names)
                if name is None or (name not in known and first.setdefault(name, at) == at)
            ]  # fmt: skip
            offsets = self._log_publications(db, now, [publications[at] for at in new]) if new else []
            logged = dict(zip(new, offsets, strict=True))
            known.update((name, logged[at]) for name, at in first.items())
            db.executemany(
                "INSERT INTO idempotency(name, pub, until) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET pub = excluded.pub, until = excluded.until",
                [(name, known[name], now + keys_kept) for name in first],
            )
            return [logged[at] if name is None else known[name] for at, name in enumerate(names)]

    def _append_unkeyed(self, now: int, publications: list[Publication], registry: int | None) -> list[int]:
        """`append_publications` of publications without idempotency keys."""
        with self._tx() as db:
            _check_registry(db, registry)
            return self._log_publications(db, now, publications)

    def _log_publications(self, db: Db, now: int, publications: list[Publication]) -> list[int]:
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
            row = db.execute("SELECT owner, body FROM announcements WHERE ann_id = ?", (ann_id,)).fetchone()
        return None if row is None else (row[0], bytes(row[1]))

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
            # (naming the publication, so that a replay of the retained log leaves it out too)
            offset = append_entry(db, "kind, copy_of, time", (KIND_CANCEL, pub, now_ms()))
            db.execute("UPDATE validity SET cancelled = ? WHERE pub = ?", (offset, pub))
        return offset

    def valid_at(self, offset: int, time: int, since: int | None = None) -> list[tuple[int, bytes, str]]:
        with self._read() as db:
            return db.execute(
                "SELECT v.pub, l.body, COALESCE(l.client, '') FROM validity v "
                'JOIN log l ON l."offset" = v.pub '
                "WHERE v.pub < ? AND v.until > ? AND (v.cancelled IS NULL OR v.cancelled > ?) "
                "AND COALESCE(l.time, 0) < ? ORDER BY v.pub",
                (offset, time, offset, NEVER if since is None else since),
            ).fetchall()

    def retained_since(
        self, offset: int, since: int, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, bytes, str, int]]:
        with self._read() as db:
            start = after or first_logged(db, since - CLOCKS_DIFFER) - 1
            return db.execute(
                f"""SELECT l."offset", l.body, COALESCE(l.client, ''),
                    COALESCE((SELECT MAX(r."offset") FROM registry r WHERE r."offset" < l."offset"), 0)
                FROM log l WHERE l."offset" > ? AND l."offset" < ? AND l.kind = ? AND COALESCE(l.time, 0) >= ?
                -- a quarantined publication delivers to nobody; a withdrawn one to no later subscription
                AND NOT EXISTS (SELECT 1 FROM quarantine q WHERE q."offset" = l."offset")
                AND NOT EXISTS (SELECT 1 FROM validity v WHERE v.pub = l."offset" AND v.cancelled < ?)
                AND NOT EXISTS (SELECT 1 FROM log c WHERE c.copy_of = l."offset" AND c.kind = {KIND_CANCEL}
                    AND c."offset" < ?)
                ORDER BY l."offset" LIMIT ?""",
                (start, offset, KIND_PUBLICATION, since, offset, offset, limit),
            ).fetchall()

    def logged_since(self, time: int) -> int:
        with self._read() as db:
            newest = db.execute('SELECT MAX("offset") FROM log').fetchone()[0]
            return 0 if newest is None else max(0, int(newest) - first_logged(db, time - CLOCKS_DIFFER) + 1)

    def replaying(self, owner: str) -> bool:
        with self._read() as db:
            return (
                db.execute(
                    f"SELECT 1 FROM subscriptions WHERE owner = ? AND since IS NOT NULL AND created > {PROCESSED}",
                    (owner,),
                ).fetchone()
                is not None
            )

    def put_registry(self, body: bytes, file_digest: int | None = None, base: int | None = None) -> int:
        with self._tx() as db:  # write transactions are serialized: no version lands between check and insert
            if base is not None:
                current = _registry_version(db)
                if current != base:
                    raise StaleRegistry(current, base)
            offset = append_entry(db, "kind, body, time", (KIND_REGISTRY, body, now_ms()))
            db.execute('INSERT INTO registry("offset", body) VALUES (?, ?)', (offset, body))
            if file_digest is not None:
                set_status(db, "registry_file", file_digest)
        return offset

    def newest_registry(self) -> tuple[int, bytes | None]:
        with self._read() as db:
            row = db.execute('SELECT "offset", body FROM registry ORDER BY "offset" DESC LIMIT 1').fetchone()
        return (row[0], row[1]) if row else (0, None)

    def registry_version(self) -> int:
        with self._read() as db:
            return _registry_version(db)

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

    def put_subscription(
        self, sub_id: str, owner: str, body: bytes, most: int | None = None, bounds: QueueBounds | None = None,
        since: int | None = None, webhook: Webhook | None = None, most_webhooks: int | None = None,
    ) -> int:  # fmt: skip
        with self._tx() as db:
            live = db.execute(LIVE, (sub_id,)).fetchone()
            if live is not None and live[0] != owner:
                raise NotOwner("subscription", sub_id)
            if live is None and most is not None:
                held = db.execute(
                    "SELECT COUNT(*) FROM subscriptions WHERE owner = ? AND deleted IS NULL", (owner,)
                ).fetchone()[0]
                if held >= most:
                    raise TooMany("subscriptions", most)
            if webhook is not None and most_webhooks is not None:
                held = db.execute(
                    "SELECT COUNT(*) FROM subscriptions s JOIN subscription_numbers n ON n.sub_id = s.sub_id "
                    "JOIN webhooks w ON w.sub_no = n.no WHERE s.owner = ? AND s.deleted IS NULL AND s.sub_id <> ?",
                    (owner, sub_id),
                ).fetchone()[0]
                if held >= most_webhooks:
                    raise TooMany("webhook subscriptions", most_webhooks)
            number = live[1] if live is not None else self._new_number(db, sub_id)
            offset = append_entry(
                db, "kind, sub_id, body, client, time, number", (KIND_SUBSCRIBE, sub_id, body, owner, now_ms(), number)
            )
            db.execute("UPDATE subscriptions SET deleted = ? WHERE sub_id = ? AND deleted IS NULL", (offset, sub_id))
            db.execute(
                "INSERT INTO subscriptions(sub_id, created, owner, body, since) VALUES (?, ?, ?, ?, ?)",
                (sub_id, offset, owner, body, since),
            )
            db.execute("DELETE FROM queue_bounds WHERE sub_no = ?", (number,))
            if bounds is not None:
                db.execute(
                    "INSERT INTO queue_bounds(sub_no, deliveries, bytes, age) VALUES (?, ?, ?, ?)", (number, *bounds)
                )
            # a webhook goes with its subscription's number: written again with each version
            db.execute("DELETE FROM webhooks WHERE sub_no = ?", (number,))
            if webhook is not None:
                db.execute(
                    "INSERT INTO webhooks(sub_no, url, secret, batch) VALUES (?, ?, ?, ?)",
                    (number, webhook.url, webhook.secret, webhook.batch),
                )
            count_change(db)
        return offset

    def _new_number(self, db: Db, sub_id: str) -> int:
        """Give the id a number no subscription had (an UPDATE first: PostgreSQL's INSERT ... ON CONFLICT
        would use up a number of its sequence on every id taken again)."""
        row = db.execute(
            f"UPDATE subscription_numbers SET no = {self.NEW_NUMBER} WHERE sub_id = ? RETURNING no", (sub_id,)
        ).fetchone()
        if row is None:
            row = db.execute("INSERT INTO subscription_numbers(sub_id) VALUES (?) RETURNING no", (sub_id,)).fetchone()
        return int(row[0])

    def remove_subscription(self, sub_id: str, owner: str) -> int:
        with self._tx() as db:
            live = db.execute(LIVE, (sub_id,)).fetchone()
            if live is None or live[0] != owner:  # one answer: whether someone else holds the id is not told
                raise UnknownSubscription(sub_id)
            offset = append_entry(db, "kind, sub_id, time", (KIND_UNSUBSCRIBE, sub_id, now_ms()))
            db.execute("UPDATE subscriptions SET deleted = ? WHERE sub_id = ? AND deleted IS NULL", (offset, sub_id))
            # matches computed before the unsubscription may still arrive in the feed under its number:
            # no live subscription has that number any more, so they are neither spilled nor served
            for table in ("deliveries", "queues", "queue_bounds", "dead_letters", "acked", "webhooks"):
                db.execute(f"DELETE FROM {table} WHERE sub_no = ?", (live[1],))
            db.execute("DELETE FROM cursors WHERE sub_id = ?", (sub_id,))
            # nor is its connection's claim: a later subscription of the id may connect through any gateway
            db.execute("DELETE FROM connections WHERE sub_id = ?", (sub_id,))
            count_change(db)
        return offset

    def subscription_owner(self, sub_id: str) -> str | None:
        with self._read() as db:
            live = db.execute(LIVE, (sub_id,)).fetchone()
        return live[0] if live else None

    def owned_subscriptions(
        self, owner: str, after: str = "", limit: int = 1000, only: str | None = None
    ) -> list[tuple[str, int, bytes]]:
        which, args = ("sub_id = ?", (only,)) if only is not None else ("sub_id > ?", (after,))
        with self._read() as db:
            rows = db.execute(
                f"SELECT sub_id, created, body FROM subscriptions WHERE owner = ? AND deleted IS NULL AND {which} "
                "ORDER BY sub_id LIMIT ?",
                (owner, *args, limit),
            ).fetchall()
        return [(sub_id, created, bytes(body)) for sub_id, created, body in rows]

    def owned_sizes(self, owner: str, after: str = "", limit: int = 1000) -> list[tuple[str, int]]:
        with self._read() as db:
            return db.execute(
                "SELECT sub_id, LENGTH(body) FROM subscriptions WHERE owner = ? AND deleted IS NULL AND sub_id > ? "
                "ORDER BY sub_id LIMIT ?",
                (owner, after, limit),
            ).fetchall()

    def live_subscriptions(self, sub_ids: Sequence[str], owner: str) -> list[LiveSubscription | None]:
        with self._read() as db:
            rows = db.execute(
                "SELECT s.sub_id, n.no, s.body, q.error, COALESCE(c.pub, 0), "
                "EXISTS (SELECT 1 FROM webhooks w WHERE w.sub_no = n.no) FROM subscriptions s "
                "JOIN subscription_numbers n USING (sub_id) "
                'LEFT JOIN quarantine q ON q."offset" = s.created AND q.released IS NULL '
                "LEFT JOIN cursors c ON c.sub_id = s.sub_id "
                f"WHERE s.sub_id {self.IN_NAMES} AND s.deleted IS NULL AND s.owner = ?",
                (self._names(sub_ids), owner),
            ).fetchall()
        found = {row[0]: LiveSubscription(row[1], bytes(row[2]), row[3], row[4], bool(row[5])) for row in rows}
        return [found.get(sub_id) for sub_id in sub_ids]

    def live_numbers(self, sub_ids: Sequence[str]) -> list[int | None]:
        with self._read() as db:
            numbers = self._live_numbers(db, sub_ids)
        return [numbers.get(sub_id) for sub_id in sub_ids]

    def subscription_number(self, sub_id: str, owner: str | None = None) -> int | None:
        with self._read() as db:
            live = db.execute(LIVE, (sub_id,)).fetchone()
        return live[1] if live is not None and owner in (None, live[0]) else None

    def head_offset(self) -> int:
        with self._read() as db:
            return int(db.execute(HEAD).fetchone()[0])

    def wait_for_log(self, offset: int, timeout: float) -> int:
        """Polled every HEAD_POLL: a head read is a few microseconds of an index's last page, and the
        gateways that commit may be other processes. A dialect with a server to signal through
        waits for its signal instead."""
        head = self.head_offset()
        deadline = time.monotonic() + timeout
        while head <= offset and time.monotonic() < deadline:
            time.sleep(HEAD_POLL)
            head = self.head_offset()
        return head

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


def _registry_version(db: Db) -> int:
    return int(db.execute('SELECT COALESCE(MAX("offset"), 0) FROM registry').fetchone()[0])


def _check_registry(db: Db, registry: int | None) -> None:
    """Refuse a write based on registry version `registry` once a newer one is stored."""
    if registry is not None and (newest := _registry_version(db)) > registry:
        raise StaleRegistry(newest, registry)


def append_entry(db: Db, columns: str, values: tuple[Any, ...]) -> int:
    """Append one log entry; returns its offset."""
    marks = ", ".join("?" * len(values))
    return int(db.execute(f'INSERT INTO log({columns}) VALUES ({marks}) RETURNING "offset"', values).fetchone()[0])


def _key_name(publication: Publication) -> str | None:
    """Where a publication's idempotency key is remembered: keys are the publisher's own, so another
    publisher's equal key names another publication. A digest, so that however long an identity
    (a claimed authHash, a token's subject) every name fits an index entry."""
    if publication.key is None:
        return None
    return hashlib.sha256(orjson.dumps([publication.publisher, publication.key])).hexdigest()


def first_logged(db: Db, since: int) -> int:
    """The first offset of the log logged at `since` (ms) or later, by a binary search over offsets
    (the log has no index by time; its times rise with its offsets but where clocks disagree)."""
    low, high = db.execute('SELECT COALESCE(MIN("offset"), 0), COALESCE(MAX("offset"), 0) + 1 FROM log').fetchone()
    while low < high:
        middle = (low + high) // 2
        row = db.execute(
            'SELECT "offset", COALESCE(time, 0) FROM log WHERE "offset" >= ? ORDER BY "offset" LIMIT 1', (middle,)
        ).fetchone()
        if row is None:  # (an empty log)
            break
        at, logged = row
        if logged >= since:
            high = middle
        else:
            low = at + 1
    return int(low)
