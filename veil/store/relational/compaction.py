"""Compaction, `veil.store.queues`'s policy in SQL: spill what lagging subscribers have not consumed,
drop what they have, and drop the publications below the horizon."""

from __future__ import annotations

import time

import numpy as np

from veil.store.base import KIND_CANCEL, KIND_COPY, KIND_PUBLICATION, KIND_REDELIVER, KIND_REGISTRY, KIND_TICK
from veil.store.queues import (
    MOST_MATCH_BYTES,
    consumed_floor,
    horizon,
    last_within,
    spill_end,
    unconsumed,
    uniques,
    unpack,
)
from veil.store.relational.dialect import (
    PROCESSED,
    SPILL_POSITION,
    SPILLED,
    Db,
    Dialect,
    get_status,
    now_ms,
    set_status,
)
from veil.store.relational.log import CLOCKS_DIFFER, first_logged

# The oldest publication any queue holds. The key is (sub_no, pub): a plain MIN(pub) scans every
# queued row (180 ms at 5 M rows, once per compaction chunk), one seek per subscription number does not;
# EXISTS skips those seeks (100,000 of them at that many subscriptions) when nothing is queued.
OLDEST_QUEUED = (
    "(SELECT MIN((SELECT MIN(pub) FROM deliveries d WHERE d.sub_no = n.no)) FROM subscription_numbers n "
    "WHERE EXISTS (SELECT 1 FROM deliveries))"
)


SWEEP_AT_LEAST = 10.0  # seconds between sweeps of publications while spilling goes on


class CompactionSql(Dialect):
    # What compaction derived from subscriptions and cursors, valid while the store's count of their
    # changes (`count_change`, kept in the store so that every gateway's changes count) stands still.
    _floor: tuple[int, np.ndarray] | None = None
    _consumed_clean = -1  # that count when compaction last found no consumed rows left
    _swept_at = 0.0  # when publications were last swept (time.monotonic)

    def compact(self, limit: int, fanned_out: int, spill_before: float, retained_since: int | None = None) -> int:
        with self._tx() as db:
            changes = get_status(db, "changes") or 0
            # the hub offers entries to connected subscriptions first; spilling one it has not offered yet
            # would write rows that are about to be consumed
            spilled = self._spill(db, fanned_out, spill_before, limit, changes)
            consumed = 0
            if changes != self._consumed_clean:  # spilling never writes a consumed row: cursors must move
                # one primary-key range delete per cursor: cost follows the rows deleted, not the table
                for number, pub in db.execute(
                    "SELECT n.no, c.pub FROM cursors c JOIN subscription_numbers n USING (sub_id) "
                    "WHERE EXISTS (SELECT 1 FROM deliveries d WHERE d.sub_no = n.no AND d.pub <= c.pub)"
                ).fetchall():
                    # (its queue's count is not lowered here: the bounds' pass counts again what it finds past a bound)
                    consumed += db.execute(
                        "DELETE FROM deliveries WHERE sub_no = ? AND pub <= ?", (number, pub)
                    ).rowcount
                    if consumed >= limit:
                        break
                else:
                    self._consumed_clean = changes
                # what a group's members acknowledged past a cursor that has moved over it since
                # (a connection of one after the group): a small table, read whole
                db.execute(
                    "DELETE FROM acked WHERE pub <= (SELECT c.pub FROM cursors c "
                    "JOIN subscription_numbers n USING (sub_id) WHERE n.no = acked.sub_no)"
                )
            fed = db.execute(f"DELETE FROM feed WHERE seq <= {self.LEAST}(?, {SPILLED})", (fanned_out,)).rowcount
            published = 0
            # the sweep of publications derives the horizon, which seeks every subscription's queue:
            # once a round (when spilling is done for now), not once a step of a large spill
            if spilled + consumed < limit or time.monotonic() - self._swept_at > SWEEP_AT_LEAST:
                published = self._sweep(db, limit, retained_since)
                self._swept_at = time.monotonic()
            # idempotency keys past their window, every call: at high rates as many expire a second as
            # are published, and they do not wait for spilling to be done
            forgotten = db.execute(
                "DELETE FROM idempotency WHERE name IN (SELECT name FROM idempotency WHERE until <= ? LIMIT ?)",
                (now_ms(), limit),
            ).rowcount
        return spilled + consumed + fed + published + forgotten

    def _sweep(self, db: Db, limit: int, retained_since: int | None) -> int:
        """Drop up to `limit` publications below the horizon; returns the rows dropped."""
        # Publications at or below the processed offset are never read by the pipeline again (a
        # replayed batch starts after the last recorded one), and below the oldest queued delivery
        # no queue needs their bodies.
        # Nor are the publications a stateful subscription holds: it may select them later.
        # Nor are those dead letters hold (as long as they are kept).
        processed, oldest_spilled, oldest_fed, held, oldest_dead = db.execute(
            f"SELECT {PROCESSED}, {OLDEST_QUEUED}, (SELECT MIN(first) FROM feed), "
            "(SELECT value FROM status WHERE name = 'held'), (SELECT MIN(pub) FROM dead_letters)"
        ).fetchone()
        # The retention keeps what was logged since `retained_since` (and the registry versions in
        # force then) for the subscriptions that replay it.
        # so do the subscriptions that the pipeline has yet to reach, from their own `since`
        pending = db.execute(
            f"SELECT MIN(since) FROM subscriptions WHERE created > {PROCESSED} AND since IS NOT NULL"
        ).fetchone()[0]
        kept = [moment for moment in (retained_since, pending) if moment is not None]
        retained = first_logged(db, min(kept) - CLOCKS_DIFFER) if kept else None
        below = horizon(processed, oldest_spilled, oldest_fed, held, oldest_dead, retained)
        # Valid publications stay for the subscriptions to come, until the pipeline has passed the
        # moment they expire or their withdrawal.
        clock = db.execute(
            'SELECT COALESCE(MAX(time), 0) FROM log WHERE "offset" = '
            '(SELECT MAX("offset") FROM log WHERE "offset" <= ?)',
            (processed,),
        ).fetchone()[0]
        published = db.execute("DELETE FROM validity WHERE until <= ? OR cancelled <= ?", (clock, processed)).rowcount
        published += db.execute(
            'DELETE FROM log WHERE "offset" IN (SELECT "offset" FROM log WHERE kind IN (?, ?, ?, ?, ?, ?) '
            'AND "offset" <= ? AND "offset" NOT IN (SELECT pub FROM validity) ORDER BY "offset" LIMIT ?)',
            (KIND_PUBLICATION, KIND_COPY, KIND_TICK, KIND_CANCEL, KIND_REGISTRY, KIND_REDELIVER, below, limit),
        ).rowcount
        published += db.execute("DELETE FROM copies WHERE pub <= ?", (below,)).rowcount
        # registry versions superseded before the processed offset: the pipeline reads the one in force
        # there and later ones (`registry_at`), and a whole copy per change would otherwise pile up
        published += db.execute(
            'DELETE FROM registry WHERE "offset" < (SELECT MAX("offset") FROM registry WHERE "offset" <= ?)',
            (processed if retained is None else min(processed, retained),),
        ).rowcount
        return published

    def _spill(self, db: Db, upto: int, before: float, limit: int, changes: int) -> int:
        """Move the matches of feed rows up to seq `upto` and to the newest created before `before`
        (rows are made in seq order under the feed's lock, so in `created` order while the clock does
        not step back; a younger row before it goes early, which costs queue rows and loses nothing)
        that live subscriptions have not consumed into per-subscription rows, about `limit` matches
        per call (a large entry is spilled over several calls, whole subscriptions at a time, so that
        no transaction holds the write locks for long); returns the matches looked at."""
        spilled, position = db.execute(f"SELECT {SPILLED}, {SPILL_POSITION}").fetchone()
        # the newest row old enough, found by its index: SQLite keeps a column after a long blob in the
        # blob's overflow pages, so reading `created` from the rows walked each row's pairs
        due = db.execute("SELECT seq FROM feed WHERE created < ? ORDER BY created DESC LIMIT 1", (before,)).fetchone()
        if due is None:
            return 0
        # then the rows' sizes (no row is read whole for it; a row holds a match at least, so no more
        # rows than matches), and only the rows this step reaches: a PostgreSQL cursor fetches its
        # whole result, and every step under the write lock read every row due (at 512
        # subscriptions, seconds of the feed, for 20,000 matches each)
        sizes = db.execute(
            "SELECT seq, length(pairs) FROM feed WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
            (spilled, min(upto, due[0]), limit + 1),
        ).fetchall()
        if not sizes:
            return 0
        # rows that hold the step's matches at least (the first row's first `position` are spilled)
        last = last_within(sizes, MOST_MATCH_BYTES * (limit + position))
        rows = db.execute(  # stepped one entry at a time: entries can be tens of megabytes
            "SELECT seq, pairs FROM feed WHERE seq > ? AND seq <= ? ORDER BY seq", (spilled, last)
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
                self._queue(db, sub_nos[keep], pubs[keep])
            looked += end - position
            if end < len(entry.pubs):
                position = end
                break
            spilled, position = entry.seq, 0
            if looked >= limit:
                break
        if looked:
            set_status(db, "spilled", spilled)
            set_status(db, "spill_position", position)
        return looked

    def _queue(self, db: Db, sub_nos: np.ndarray, pubs: np.ndarray) -> None:
        """Spilled matches into their subscriptions' queue rows, with their publications' sizes, and
        counted per subscription (what the queues' bounds are checked against)."""
        wanted, index = uniques(pubs)
        known = dict(
            db.execute(f'SELECT "offset", length(body) FROM log WHERE "offset" {self.IN_IDS}', (self._ids(wanted),))
        )
        sizes = np.array([known.get(pub) or 0 for pub in wanted.tolist()], np.int64)[index]
        db.execute(
            # WHERE: without it, SQLite reads ON CONFLICT as the ON of a join
            f"INSERT INTO deliveries(sub_no, pub, size) SELECT j.sub_no, j.pub, j.size FROM {self.TRIPLES} WHERE TRUE "
            "ON CONFLICT (sub_no, pub) DO NOTHING",
            self._triples(sub_nos, pubs, sizes),
        )
        numbers, starts = np.unique(sub_nos, return_index=True)  # (sorted by subscription already)
        counts = np.diff(np.r_[starts, len(sub_nos)])
        db.executemany(
            "INSERT INTO queues(sub_no, deliveries, bytes) VALUES (?, ?, ?) ON CONFLICT (sub_no) DO UPDATE "
            "SET deliveries = queues.deliveries + excluded.deliveries, bytes = queues.bytes + excluded.bytes",
            list(zip(numbers.tolist(), counts.tolist(), np.add.reduceat(sizes, starts).tolist(), strict=True)),
        )

    def _consumed_floor(self, db: Db, changes: int) -> np.ndarray:
        """`consumed_floor`, derived again only when subscriptions or cursors changed (at 100,000
        subscriptions, deriving it for every step was most of compaction's time)."""
        if self._floor is not None and self._floor[0] == changes:
            return self._floor[1]
        floor = consumed_floor(
            db.execute(
                "SELECT n.no, COALESCE(c.pub, 0) FROM subscriptions s "
                "JOIN subscription_numbers n USING (sub_id) LEFT JOIN cursors c USING (sub_id) "
                "WHERE s.deleted IS NULL"
            ).fetchall()
        )
        self._floor = (changes, floor)
        return floor
