"""Bounded queues: what leaves a subscription's queue past its bounds goes to its dead letters, which
its owner (or an admin) reads, replays or purges.

A queue's spilled rows carry their publications' sizes and are counted per subscription as they are
spilled (`queues`), so that a bound is checked without reading the queue. Consumption does not lower
the count (it is compaction's hottest statement): a count past a bound is an upper bound, and the
pass counts that queue again, past its floor, before it moves anything.

Past a bound, the oldest deliveries after a floor leave: the floor is the last delivery that may be
in flight. For a subscription no connection holds, that is its cursor (the pass over queues no live
gateway holds); for one a connection holds, only the gateway holding it knows what it has read
ahead, so that gateway bounds it, under its claim. Write transactions are serialized, so a claim and
a pass over unclaimed queues never interleave: a delivery is either dead-lettered or delivered,
never both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from veil.protocol.envelope import Origin
from veil.store.base import KIND_REDELIVER, REPLAY_MOST, DeadLetter, QueueBounds
from veil.store.relational.dialect import SPILL_POSITION, SPILLED, Db, Dialect, add_status, now_ms
from veil.store.relational.log import LIVE, LIVE_NUMBER, append_entry, first_logged

# a live subscription's queue: its number, floor (the cursor) and the bounds its subscriber set
QUEUED = (
    "SELECT q.sub_no, COALESCE(c.pub, 0), b.deliveries, b.bytes, b.age, q.deliveries, q.bytes "
    "FROM queues q JOIN subscription_numbers n ON n.no = q.sub_no "
    "LEFT JOIN cursors c ON c.sub_id = n.sub_id LEFT JOIN queue_bounds b ON b.sub_no = q.sub_no "
    f"WHERE EXISTS ({LIVE_NUMBER}) "
)
NEWEST = 2**62  # a seq (and an offset) past every one
CLAIMED = "SELECT 1 FROM connections k JOIN gateways g ON g.gateway = k.gateway WHERE k.sub_id = n.sub_id"
# a dead letter's publication, and the cropped copy it delivers, if it was one
JOINED = 'JOIN log l ON l."offset" = d.pub LEFT JOIN copies c ON c.sub_no = d.sub_no AND c.pub = d.pub'
BODY = "COALESCE(c.body, l.body)"


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
    return int(count), int(size)


class DeadLetterSql(Dialect):
    def bound_queues(self, bounds: QueueBounds, now: int, alive_since: float, limit: int, ages: bool = True) -> int:
        with self._tx() as db:
            # dead letters past the operator's age bound, counted from when they left their queue
            expired = db.execute(
                "DELETE FROM dead_letters WHERE seq IN (SELECT seq FROM dead_letters WHERE at < ? LIMIT ?)",
                (now - bounds.age_ms, limit),
            ).rowcount
            add_status(db, "dead_letters_expired", expired)
            rows = db.execute(QUEUED + f"AND NOT EXISTS ({CLAIMED} AND g.seen >= ?)", (alive_since,)).fetchall()
            return expired + self._bound(db, rows, {}, bounds, now, limit, ages)

    def bound_held_queues(
        self, floors: Mapping[int, int], gateway: str, bounds: QueueBounds, now: int, limit: int
    ) -> int:
        if not floors:
            return 0
        with self._tx() as db:
            rows = db.execute(
                QUEUED + f"AND q.sub_no {self.IN_IDS} AND EXISTS ({CLAIMED} AND k.gateway = ?)",
                (self._ids(list(floors)), gateway),
            ).fetchall()
            return self._bound(db, rows, floors, bounds, now, limit, True)

    def _bound(
        self, db: Db, rows: list[Any], floors: Mapping[int, int], bounds: QueueBounds, now: int, limit: int,
        ages: bool,
    ) -> int:  # fmt: skip
        """Dead-letter what the queues of `rows` (QUEUED) hold past their bounds, after their floors
        (`floors`, else their cursors), up to about `limit` deliveries; returns how many. Their counts
        say which may be past a count or bytes bound; their ages (`ages`) cost a read each. A feed row
        being spilled (over several steps) still holds the pairs already spilled, which a backlog read
        may take from it: nothing from its first publication on leaves a queue meanwhile."""
        spilled, position = db.execute(f"SELECT {SPILLED}, {SPILL_POSITION}").fetchone()
        # (the first row past the spilled ones: seqs may have gaps, as PostgreSQL's identity leaves
        # one where a round's transaction rolled back)
        partial = (
            db.execute("SELECT first FROM feed WHERE seq > ? ORDER BY seq LIMIT 1", (spilled,)).fetchone()
            if position
            else None
        )
        ceiling = NEWEST if partial is None else partial[0] - 1
        moved = 0
        for number, cursor, deliveries, size_bound, age, held, size in rows:
            mine = bounds if deliveries is None else QueueBounds(deliveries, size_bound, age).within(bounds)
            if not ages and held <= mine.deliveries and size <= mine.bytes:
                continue
            floor = max(cursor, floors.get(number, 0))
            oldest = db.execute(
                'SELECT d.pub, COALESCE(l.time, 0) FROM deliveries d JOIN log l ON l."offset" = d.pub '
                "WHERE d.sub_no = ? AND d.pub > ? ORDER BY d.pub LIMIT 1",
                (number, floor),
            ).fetchone()
            if oldest is None:
                # consumed since it was counted: counted again when it next holds something
                db.execute("DELETE FROM queues WHERE sub_no = ?", (number,))
                continue
            if oldest[0] > ceiling:
                continue
            if oldest[1] >= now - mine.age_ms and held <= mine.deliveries and size <= mine.bytes:
                continue
            within = first_logged(db, now - mine.age_ms) if oldest[1] < now - mine.age_ms else 0
            moved += self._bound_one(db, number, floor, mine, within, ceiling, now)
            if moved >= limit:
                break
        return moved

    def _bound_one(
        self, db: Db, number: int, floor: int, bounds: QueueBounds, within: int, ceiling: int, now: int
    ) -> int:
        """One queue past a bound: its deliveries logged before offset `within` go (age), then the
        oldest past its count, then the oldest past its bytes; none past `ceiling`."""
        moved = 0
        if min(within - 1, ceiling) > floor:
            moved += self._dead_letter(db, number, floor, min(within - 1, ceiling), "age", now)[0]
            floor = min(within - 1, ceiling)
        held, size = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM deliveries WHERE sub_no = ? AND pub > ?", (number, floor)
        ).fetchone()
        if held > bounds.deliveries:
            (cut,) = db.execute(
                "SELECT pub FROM deliveries WHERE sub_no = ? AND pub > ? ORDER BY pub LIMIT 1 OFFSET ?",
                (number, floor, held - bounds.deliveries - 1),
            ).fetchone()
            count, dropped = self._dead_letter(db, number, floor, min(cut, ceiling), "deliveries", now)
            moved, floor, size = moved + count, max(floor, min(cut, ceiling)), size - dropped
        if size > bounds.bytes:
            excess, cut = size - bounds.bytes, floor
            for pub, bytes_ in db.execute(
                "SELECT pub, size FROM deliveries WHERE sub_no = ? AND pub > ? ORDER BY pub", (number, floor)
            ):
                cut, excess = pub, excess - bytes_
                if excess <= 0:
                    break
            moved += self._dead_letter(db, number, floor, min(cut, ceiling), "bytes", now)[0]
        # its count exactly (one of a match queued twice counts twice): off, it would be read every pass
        db.execute(
            "UPDATE queues SET deliveries = (SELECT COUNT(*) FROM deliveries WHERE sub_no = ?), "
            "bytes = (SELECT COALESCE(SUM(size), 0) FROM deliveries WHERE sub_no = ?) WHERE sub_no = ?",
            (number, number, number),
        )
        return moved

    def _dead_letter(self, db: Db, number: int, after: int, upto: int, reason: str, now: int) -> tuple[int, int]:
        """Move a subscription's queued deliveries after < pub <= upto to its dead letters (which hold
        their publications as its queue did); returns how many left the queue, and their publications'
        bytes. Those its group's members acknowledged already (`acked`) were delivered: they only leave."""
        if upto <= after:
            return 0, 0
        lettered = db.execute(
            "INSERT INTO dead_letters(sub_no, pub, reason, at) SELECT sub_no, pub, ?, ? FROM deliveries d "
            "WHERE sub_no = ? AND pub > ? AND pub <= ? "
            "AND NOT EXISTS (SELECT 1 FROM acked a WHERE a.sub_no = d.sub_no AND a.pub = d.pub) ORDER BY pub",
            (reason, now, number, after, upto),
        ).rowcount
        moved = dequeue(db, number, after, upto)
        add_status(db, f"dead_lettered.{reason}", lettered)
        return moved

    def dead_letters(
        self, number: int, after: int = 0, limit: int = 1000, budget: int = NEWEST
    ) -> tuple[list[DeadLetter], int | None]:
        with self._read() as db:
            # their sizes first: a page holds at most `budget` bytes of publications (one at least)
            sizes = db.execute(
                f"SELECT d.seq, length({BODY}) FROM dead_letters d {JOINED} WHERE d.sub_no = ? AND d.seq > ? "
                "ORDER BY d.seq LIMIT ?",
                (number, after, limit + 1),
            ).fetchall()
            taken: list[int] = []
            for seq, size in sizes[:limit]:
                budget -= size or 0
                if budget < 0 and taken:
                    break
                taken.append(seq)
            if not taken:
                return [], None
            rows = db.execute(
                f"SELECT d.seq, COALESCE(l.copy_of, d.pub), d.reason, d.at, COALESCE(l.time, 0), {BODY}, "
                "COALESCE(l.client, ''), l.key_id, l.signature, c.body IS NOT NULL OR l.cropped "
                f"FROM dead_letters d {JOINED} WHERE d.sub_no = ? AND d.seq > ? AND d.seq <= ? ORDER BY d.seq",
                (number, after, taken[-1]),
            ).fetchall()
        letters = [
            DeadLetter(seq, pub, reason, at, logged, body or b"", Origin(publisher, key_id, signature, pub, bool(cut)))
            for seq, pub, reason, at, logged, body, publisher, key_id, signature, cut in rows
        ]
        return letters, taken[-1] if len(sizes) > len(taken) else None

    def purge_dead_letters(self, number: int, upto: int | None = None) -> int:
        with self._tx() as db:
            return int(
                db.execute(
                    "DELETE FROM dead_letters WHERE sub_no = ? AND seq <= ?", (number, NEWEST if upto is None else upto)
                ).rowcount
            )

    def replay_dead_letters(
        self, sub_id: str, number: int, upto: int | None = None, most: int = REPLAY_MOST
    ) -> tuple[int, int]:
        with self._tx() as db:
            live = db.execute(LIVE, (sub_id,)).fetchone()
            if live is None or live[1] != number:
                return 0, 0
            chosen = db.execute(
                "SELECT seq FROM dead_letters WHERE sub_no = ? AND seq <= ? ORDER BY seq LIMIT ?",
                (number, NEWEST if upto is None else upto, most),
            ).fetchall()
            if not chosen:
                return 0, 0
            last = chosen[-1][0]
            # logged in their order, each with its original's facts (and its cropped copy, if it was one)
            for (seq,) in chosen:
                append_entry(
                    db, "kind, sub_id, number, body, client, key_id, signature, copy_of, cropped, time",
                    db.execute(
                        f"SELECT ?, ?, ?, {BODY}, l.client, l.key_id, l.signature, COALESCE(l.copy_of, d.pub), "
                        f"c.body IS NOT NULL OR l.cropped, ? FROM dead_letters d {JOINED} WHERE d.seq = ?",
                        (KIND_REDELIVER, sub_id, number, now_ms(), seq),
                    ).fetchone(),
                )  # fmt: skip
            db.execute("DELETE FROM dead_letters WHERE sub_no = ? AND seq <= ?", (number, last))
            left = db.execute(
                "SELECT COUNT(*) FROM dead_letters WHERE sub_no = ? AND seq <= ?",
                (number, NEWEST if upto is None else upto),
            ).fetchone()[0]
            return len(chosen), int(left)

    def dead_letter_count(self, number: int) -> int:
        with self._read() as db:
            return int(db.execute("SELECT COUNT(*) FROM dead_letters WHERE sub_no = ?", (number,)).fetchone()[0])
