"""Bounded queues: what leaves a subscription's queue past its bounds goes to its dead letters, which
its owner (or an admin) reads, replays or purges.

A queue's spilled rows carry their publications' sizes and are counted per subscription (`queues`),
so that a bound is checked without reading the queue. Past a bound, the oldest deliveries after a
floor leave: the floor is the last delivery that may be in flight. For a subscription no connection
holds, that is its cursor (compaction's pass); for one a connection holds, only the gateway holding
it knows what it has read ahead, so that gateway bounds it, under its claim. Write transactions are
serialized, so a claim and a pass over unclaimed queues never interleave: a delivery is either
dead-lettered or delivered, never both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from veil.protocol.envelope import Origin
from veil.store.base import KIND_REDELIVER, DeadLetter, QueueBounds
from veil.store.relational.dialect import Db, Dialect, add_status, now_ms
from veil.store.relational.log import append_entry, first_logged

# a live subscription's queue: its number, floor (the cursor) and the bounds its subscriber set
QUEUED = (
    "SELECT q.sub_no, COALESCE(c.pub, 0), b.deliveries, b.bytes, b.age, q.deliveries, q.bytes "
    "FROM queues q JOIN subscription_numbers n ON n.no = q.sub_no "
    "JOIN subscriptions s ON s.sub_id = n.sub_id AND s.deleted IS NULL "
    "LEFT JOIN cursors c ON c.sub_id = n.sub_id LEFT JOIN queue_bounds b ON b.sub_no = q.sub_no "
)
CLAIMED = "SELECT 1 FROM connections k JOIN gateways g ON g.gateway = k.gateway WHERE k.sub_id = n.sub_id"


def dequeue(db: Db, number: int, after: int, upto: int) -> tuple[int, int]:
    """Take a subscription's rows after < pub <= upto out of its queue and its count; returns how
    many, and their publications' bytes."""
    count, size = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM deliveries WHERE sub_no = ? AND pub > ? AND pub <= ?",
        (number, after, upto),
    ).fetchone()
    if count:
        db.execute("DELETE FROM deliveries WHERE sub_no = ? AND pub > ? AND pub <= ?", (number, after, upto))
        db.execute(
            "UPDATE queues SET deliveries = deliveries - ?, bytes = bytes - ? WHERE sub_no = ?", (count, size, number)
        )
        # (a match queued twice is counted twice: an emptied queue starts its count again)
        db.execute(
            "DELETE FROM queues WHERE sub_no = ? AND NOT EXISTS (SELECT 1 FROM deliveries WHERE sub_no = ?)",
            (number, number),
        )
    return int(count), int(size)


class DeadLetterSql(Dialect):
    def bound_queues(self, bounds: QueueBounds, now: int, alive_since: float, limit: int) -> int:
        with self._tx() as db:
            rows = db.execute(QUEUED + f"WHERE NOT EXISTS ({CLAIMED} AND g.seen >= ?)", (alive_since,)).fetchall()
            return self._bound(db, rows, {}, bounds, now, limit)

    def bound_held_queues(
        self, floors: Mapping[int, int], gateway: str, bounds: QueueBounds, now: int, limit: int
    ) -> int:
        if not floors:
            return 0
        with self._tx() as db:
            rows = db.execute(
                QUEUED + f"WHERE q.sub_no {self.IN_IDS} AND EXISTS ({CLAIMED} AND k.gateway = ?)",
                (self._ids(list(floors)), gateway),
            ).fetchall()
            return self._bound(db, rows, floors, bounds, now, limit)

    def _bound(
        self, db: Db, rows: list[Any], floors: Mapping[int, int], bounds: QueueBounds, now: int, limit: int
    ) -> int:
        """Dead-letter what the queues of `rows` (QUEUED) hold past their bounds, after their floors
        (`floors`, else their cursors), up to about `limit` deliveries; returns how many."""
        moved = 0
        expiry: dict[int, int] = {}  # age bound -> the first offset logged within it
        for number, cursor, deliveries, size_bound, age, held, size in rows:
            mine = bounds if deliveries is None else QueueBounds(deliveries, size_bound, age).within(bounds)
            floor = max(cursor, floors.get(number, 0))
            if mine.age_ms not in expiry:
                expiry[mine.age_ms] = first_logged(db, now - mine.age_ms)
            oldest = db.execute(
                "SELECT MIN(pub) FROM deliveries WHERE sub_no = ? AND pub > ?", (number, floor)
            ).fetchone()[0]
            if oldest is None or (oldest >= expiry[mine.age_ms] and held <= mine.deliveries and size <= mine.bytes):
                continue
            moved += self._bound_one(db, number, floor, mine, expiry[mine.age_ms], now)
            if moved >= limit:
                break
        return moved

    def _bound_one(self, db: Db, number: int, floor: int, bounds: QueueBounds, within: int, now: int) -> int:
        """One queue past a bound: its deliveries logged before offset `within` go (age), then the
        oldest past its count, then the oldest past its bytes."""
        moved = 0
        if within - 1 > floor:
            moved += self._dead_letter(db, number, floor, within - 1, "age", now)[0]
            floor = within - 1
        held, size = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM deliveries WHERE sub_no = ? AND pub > ?", (number, floor)
        ).fetchone()
        if held > bounds.deliveries:
            (cut,) = db.execute(
                "SELECT pub FROM deliveries WHERE sub_no = ? AND pub > ? ORDER BY pub LIMIT 1 OFFSET ?",
                (number, floor, held - bounds.deliveries - 1),
            ).fetchone()
            count, dropped = self._dead_letter(db, number, floor, cut, "deliveries", now)
            moved, floor, size = moved + count, cut, size - dropped
        if size > bounds.bytes:
            excess, cut = size - bounds.bytes, floor
            for pub, bytes_ in db.execute(
                "SELECT pub, size FROM deliveries WHERE sub_no = ? AND pub > ? ORDER BY pub", (number, floor)
            ):
                cut, excess = pub, excess - bytes_
                if excess <= 0:
                    break
            moved += self._dead_letter(db, number, floor, cut, "bytes", now)[0]
        return moved

    def _dead_letter(self, db: Db, number: int, after: int, upto: int, reason: str, now: int) -> tuple[int, int]:
        """Move a subscription's queued deliveries after < pub <= upto to its dead letters, whole;
        returns how many, and their publications' bytes."""
        db.execute(
            "INSERT INTO dead_letters(sub_no, pub, reason, at, logged, body, client, key_id, signature, copy_of, "
            "cropped) SELECT d.sub_no, d.pub, ?, ?, COALESCE(l.time, 0), COALESCE(c.body, l.body), l.client, "
            "l.key_id, l.signature, l.copy_of, l.cropped OR c.body IS NOT NULL FROM deliveries d "
            'JOIN log l ON l."offset" = d.pub LEFT JOIN copies c ON c.sub_no = d.sub_no AND c.pub = d.pub '
            "WHERE d.sub_no = ? AND d.pub > ? AND d.pub <= ? ORDER BY d.pub",
            (reason, now, number, after, upto),
        )
        moved = dequeue(db, number, after, upto)
        add_status(db, f"dead_lettered.{reason}", moved[0])
        return moved

    def dead_letters(self, number: int, after: int = 0, limit: int = 1000) -> list[DeadLetter]:
        with self._read() as db:
            rows = db.execute(
                "SELECT seq, COALESCE(copy_of, pub), reason, at, logged, body, COALESCE(client, ''), key_id, "
                "signature, copy_of, cropped FROM dead_letters WHERE sub_no = ? AND seq > ? ORDER BY seq LIMIT ?",
                (number, after, limit),
            ).fetchall()
        return [
            DeadLetter(seq, pub, reason, at, logged, body, Origin(publisher, key_id, signature, copy_of, bool(cropped)))
            for seq, pub, reason, at, logged, body, publisher, key_id, signature, copy_of, cropped in rows
        ]

    def purge_dead_letters(self, number: int, upto: int | None = None) -> int:
        with self._tx() as db:
            return int(
                db.execute(
                    "DELETE FROM dead_letters WHERE sub_no = ? AND seq <= ?", (number, NEWEST if upto is None else upto)
                ).rowcount
            )

    def replay_dead_letters(self, sub_id: str, number: int, upto: int | None = None) -> int:
        now = now_ms()
        with self._tx() as db:
            rows = db.execute(
                "SELECT seq, body, client, key_id, signature, COALESCE(copy_of, pub), cropped FROM dead_letters "
                "WHERE sub_no = ? AND seq <= ? ORDER BY seq",
                (number, NEWEST if upto is None else upto),
            ).fetchall()
            live = db.execute(
                "SELECT 1 FROM subscription_numbers n JOIN subscriptions s USING (sub_id) "
                "WHERE n.no = ? AND n.sub_id = ? AND s.deleted IS NULL",
                (number, sub_id),
            ).fetchone()
            if not rows or live is None:
                return 0
            for _, body, client, key_id, signature, original, cropped in rows:
                append_entry(
                    db, "kind, sub_id, number, body, client, key_id, signature, copy_of, cropped, time",
                    (KIND_REDELIVER, sub_id, number, body, client, key_id, signature, original, cropped, now),
                )  # fmt: skip
            db.execute("DELETE FROM dead_letters WHERE sub_no = ? AND seq <= ?", (number, rows[-1][0]))
            return len(rows)

    def dead_letter_count(self, number: int) -> int:
        with self._read() as db:
            return int(db.execute("SELECT COUNT(*) FROM dead_letters WHERE sub_no = ?", (number,)).fetchone()[0])


NEWEST = 2**62  # a seq past every dead letter's
