"""The delivery queues: the pipeline's feed rows, a subscription's backlog (spilled rows, then the
unspilled feed), the publications' bodies and cropped copies, and the subscribers' cursors."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from veil.protocol.envelope import Origin
from veil.store.base import KIND_COPY, KIND_SUBSCRIBE, FeedEntry, Round, StatefulBatch
from veil.store.queues import (
    FEED_READ_PAIRS,
    FEWEST_MATCH_BYTES,
    distinct,
    feed_rows,
    last_within,
    matches_of,
    sorted_pairs,
    unpack,
)
from veil.store.relational.dialect import (
    LAST_FEED_SEQ,
    SPILLED,
    Db,
    Dialect,
    add_status,
    add_statuses,
    count_change,
    duration_counts,
    now_ms,
    set_least,
    set_status,
    set_statuses,
    status_value,
)
from veil.store.relational.log import LIVE_NUMBER, append_entry
from veil.store.relational.status import set_aside, set_aside_pairs

ORIGIN = "COALESCE(client, ''), key_id, signature, copy_of, cropped"  # the columns of an Origin


class DeliverySql(Dialect):
    def feed_since(self, seq: int, limit: int) -> list[FeedEntry]:
        with self._read() as db:
            # the rows' sizes first (no row is read whole for it): as many rows as hold at most about
            # FEED_READ_PAIRS pairs, at least one, so that what one read holds stays bounded
            sizes = db.execute(
                "SELECT seq, length(pairs) FROM feed WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)
            ).fetchall()
            if not sizes:
                return []
            last = last_within(sizes, FEWEST_MATCH_BYTES * FEED_READ_PAIRS)
            rows = db.execute(
                "SELECT seq, pairs, cropped FROM feed WHERE seq > ? AND seq <= ? ORDER BY seq", (seq, last)
            ).fetchall()
        return [unpack(entry_seq, pairs, bool(cropped)) for entry_seq, pairs, cropped in rows]

    def bodies(self, pubs: np.ndarray) -> dict[int, tuple[bytes, Origin, int]]:
        with self._read() as db:
            return self._bodies(db, pubs)

    def _bodies(self, db: Db, pubs: np.ndarray) -> dict[int, tuple[bytes, Origin, int]]:
        rows = db.execute(
            f'SELECT "offset", body, COALESCE(time, 0), {ORIGIN} FROM log WHERE "offset" {self.IN_IDS}',
            (self._ids(pubs),),
        )
        return {row[0]: (row[1], _origin(row[3:]), row[2]) for row in rows}

    def copies(self, sub_nos: np.ndarray, pubs: np.ndarray) -> dict[tuple[int, int], bytes]:
        with self._read() as db:
            return self._copies(db, sub_nos, pubs)

    def _copies(self, db: Db, sub_nos: np.ndarray, pubs: np.ndarray) -> dict[tuple[int, int], bytes]:
        if not len(pubs):
            return {}
        # most subscriptions never get a cropped copy: a seek per subscription says so, where the join
        # below parses every pair it is given
        anyone = f"SELECT EXISTS (SELECT 1 FROM copies WHERE sub_no {self.IN_IDS})"
        if not db.execute(anyone, (self._ids(np.unique(sub_nos)),)).fetchone()[0]:
            return {}
        rows = db.execute(
            f"SELECT c.sub_no, c.pub, c.body FROM copies c JOIN {self.PAIRS} ON c.sub_no = j.sub_no AND c.pub = j.pub",
            self._pairs(sub_nos, pubs),
        )
        return {(sub_no, pub): body for sub_no, pub, body in rows}

    def backlogs(
        self, numbers: np.ndarray, afters: np.ndarray, limit: int | np.ndarray, from_seq: int = 0
    ) -> tuple[np.ndarray, np.ndarray, int, int]:
        with self._tx(write=False) as db:
            watermark = db.execute(LAST_FEED_SEQ).fetchone()[0]
            sub_nos, pubs, reached = self._queued(db, numbers, afters, limit, watermark, from_seq)
        return sub_nos, pubs, watermark, reached

    def _queued(
        self, db: Db, numbers: np.ndarray, afters: np.ndarray, limit: int | np.ndarray, watermark: int, from_seq: int
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """`backlogs` inside a read transaction: the live subscriptions' spilled rows, then the
        unspilled feed up to `watermark`; and where a next read of the feed starts."""
        limits = np.broadcast_to(np.asarray(limit, np.int64), numbers.shape)
        # a number is live while it is its id's newest and the id has a live subscription: the queue of
        # an earlier subscription of the id is nobody's
        live = {
            number
            for (number,) in db.execute(
                # driven by the numbers: a join lets SQLite scan every live subscription instead
                f"SELECT n.no FROM subscription_numbers n WHERE n.no {self.IN_IDS} AND EXISTS ({LIVE_NUMBER})",
                (self._ids(numbers),),
            )
        }
        # most queues have no spilled rows: one statement (a seek each) says which have, and only
        # those are read, a statement each (a LIMIT per subscription, whatever it holds)
        spilling = {
            number
            for (number,) in db.execute(
                f"SELECT j.sub_no FROM {self.PAIRS} WHERE EXISTS "
                "(SELECT 1 FROM deliveries d WHERE d.sub_no = j.sub_no AND d.pub > j.pub)",
                self._pairs(numbers, afters),
            )
        }
        floors: dict[int, int] = {}
        caps: dict[int, int] = {}
        found: list[tuple[int, int]] = []
        for number, floor, cap in zip(numbers.tolist(), afters.tolist(), limits.tolist(), strict=True):
            if number not in live:
                continue
            spilled = (
                db.execute(
                    "SELECT pub FROM deliveries WHERE sub_no = ? AND pub > ? ORDER BY pub LIMIT ?", (number, floor, cap)
                ).fetchall()
                if number in spilling
                else []
            )
            found += [(number, pub) for (pub,) in spilled]
            if len(spilled) < cap:  # what is left of the cap, from the feed (a read past the cap skips the rest)
                floors[number] = spilled[-1][0] if spilled else floor
                caps[number] = cap - len(spilled)
        sub_nos = np.array([number for number, _ in found], np.int64)
        pubs = np.array([pub for _, pub in found], np.int64)
        reached = watermark
        if floors:
            more_nos, more_pubs, reached = self._unspilled(db, floors, watermark, caps, from_seq)
            sub_nos, pubs = np.concatenate([sub_nos, more_nos]), np.concatenate([pubs, more_pubs])
        if len(floors) < len(live):  # some filled up on spilled rows: their feed is still to read
            reached = from_seq
        sub_nos, pubs = sorted_pairs(sub_nos, pubs)
        # a match queued twice (a replaced subscription's initial matches again, in a later feed row)
        # is delivered once
        once = np.r_[True, (sub_nos[1:] != sub_nos[:-1]) | (pubs[1:] != pubs[:-1])][: len(pubs)]
        sub_nos, pubs = sub_nos[once], pubs[once]
        by_number = np.argsort(numbers)
        kept = _ranks(sub_nos) < limits[by_number][np.searchsorted(numbers[by_number], sub_nos)]
        return sub_nos[kept], pubs[kept], reached

    @staticmethod
    def _unspilled(
        db: Db, floors: dict[int, int], upto_seq: int, caps: dict[int, int], from_seq: int = 0
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Subscriptions' matches after their floors in the feed rows not yet spilled (from seq
        `from_seq` on), in one pass over the rows, until each has its cap or the rows end: binary
        searches in each row's table of subscriptions (`matches_of`), so that a row's numpy work is
        what the subscriptions asked for, not its size (the store still reads the row whole). Also the
        seq from which a next pass must read: that of the row where the first of them filled up,
        `upto_seq` when none did."""
        wanted = np.fromiter(floors, np.int64, len(floors))
        floor = np.fromiter(floors.values(), np.int64, len(floors))
        needed = np.array([caps[number] for number in floors], np.int64)
        found_nos: list[np.ndarray] = []
        found_pubs: list[np.ndarray] = []
        rows = db.execute(
            f"SELECT seq, pairs FROM feed WHERE seq > {SPILLED} AND seq >= ? AND seq <= ? ORDER BY seq",
            (from_seq, upto_seq),
        )
        full: int | None = None
        for seq, pairs in rows:
            whose, pubs = matches_of(pairs, wanted)
            mine = pubs > floor[whose]
            whose, pubs = whose[mine], pubs[mine]
            kept = _ranks(whose) < needed[whose]
            whose, pubs = whose[kept], pubs[kept]
            if len(pubs):
                found_nos.append(wanted[whose])
                found_pubs.append(pubs)
                needed -= np.bincount(whose, minlength=len(wanted))
                if full is None and (needed <= 0).any():
                    full = seq  # the first to fill up may have more here: the next pass starts here
                if (needed <= 0).all():
                    break
        reached = upto_seq if full is None else full
        if not found_nos:
            return np.empty(0, np.int64), np.empty(0, np.int64), reached
        return np.concatenate(found_nos), np.concatenate(found_pubs), reached

    def cursor(self, sub_id: str) -> int:
        with self._read() as db:
            row = db.execute("SELECT pub FROM cursors WHERE sub_id = ?", (sub_id,)).fetchone()
        return row[0] if row else 0

    def save_cursors(
        self, cursors: dict[int, int], forwarded: int = 0, acked: dict[int, list[int]] | None = None
    ) -> None:
        # One statement per table, whatever the number of subscriptions. Serialized with subscription
        # changes: a save beside an unsubscription could write the cursor it deletes (left behind for a
        # later subscription of the id), and one beside a replacement would find no live version.
        # (The feed's order alone, which they hold too: it gives no log offsets, so in the store it
        # neither waits for the publications' group commits nor holds them up while it waits for a round.)
        live = f"EXISTS ({LIVE_NUMBER})"
        with self._tx(log=False) as db, self._pipelined(db):
            if forwarded:
                add_status(db, "forwarded", forwarded)
            if cursors:
                numbers = np.fromiter(cursors, np.int64, len(cursors))
                db.execute(
                    # by number: a cursor of an earlier subscription of the id never moves a later one's
                    f"INSERT INTO cursors(sub_id, pub) SELECT n.sub_id, MAX(j.pub) FROM {self.PAIRS} "
                    f"JOIN subscription_numbers n ON n.no = j.sub_no WHERE {live} GROUP BY n.sub_id "
                    f"ON CONFLICT (sub_id) DO UPDATE SET pub = {self.GREATEST}(cursors.pub, excluded.pub)",
                    self._pairs(numbers, np.fromiter(cursors.values(), np.int64, len(cursors))),
                )
            if acked:
                pairs = [(number, pub) for number, pubs in acked.items() for pub in pubs]
                db.execute(
                    f"INSERT INTO acked(sub_no, pub) SELECT DISTINCT n.no, j.pub FROM {self.PAIRS} "
                    f"JOIN subscription_numbers n ON n.no = j.sub_no WHERE {live} ON CONFLICT DO NOTHING",
                    self._pairs(np.array([n for n, _ in pairs], np.int64), np.array([p for _, p in pairs], np.int64)),
                )
                db.execute(
                    f"DELETE FROM acked WHERE sub_no {self.IN_IDS} AND pub <= (SELECT c.pub FROM cursors c "
                    "JOIN subscription_numbers n USING (sub_id) WHERE n.no = acked.sub_no)",
                    (self._ids(list(acked)),),
                )
            if cursors or acked:  # (a count of deliveries alone changes nothing compaction derived)
                count_change(db)

    def acked(self, numbers: Sequence[int]) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        with self._read() as db:
            rows = db.execute(
                f"SELECT sub_no, pub FROM acked WHERE sub_no {self.IN_IDS} ORDER BY sub_no, pub",
                (self._ids(np.asarray(numbers, np.int64)),),
            ).fetchall()
        for number, pub in rows:
            found.setdefault(number, []).append(pub)
        return found

    def last_feed_seq(self) -> int:
        with self._read() as db:
            return int(db.execute(LAST_FEED_SEQ).fetchone()[0])

    def record_round(self, done: Round) -> bool:
        sub_nos = np.asarray(done.sub_nos, np.int64)
        pubs = np.asarray(done.pubs, np.int64)
        processed, stateful, part = done.end, done.stateful, done.part
        matcher = part if done.owner is None else done.owner[0]
        now = time.time()
        # (the feed's order; the log's, the publications', only if it logs copies for stateful
        # subscriptions, taken once that is known, so that a partition holding some does not make
        # every group commit of publications wait for each of its rounds)
        with self._tx(log=False) as db:
            # matches of publications at or below the partition's processed offset were recorded by
            # an earlier run of this round: a replay adds only what is new (its own row, or where the
            # whole pipeline was when it had none: a store recorded before partitions kept their own)
            # (and whether any subscription is set aside, which the matches are checked against)
            own, whole, owner, any_set_aside = db.execute(
                f"SELECT {status_value(f'processed.{part}', None)}, {status_value('processed')}, "
                f"{status_value(f'owner.{matcher}', None)}, "
                f"EXISTS (SELECT 1 FROM quarantine WHERE kind = {KIND_SUBSCRIBE})"
            ).fetchone()
            recorded = own if own is not None else whole
            if done.start is not None and done.start != recorded:
                return False
            if done.owner is not None and owner != done.owner[1]:
                return False
            fresh = pubs > recorded
            sub_nos, pubs = sub_nos[fresh], pubs[fresh]
            copies = [copy for copy in done.copies if copy[1] > recorded]
            if processed > recorded:
                set_aside(db, done.quarantined, processed, now)
            any_set_aside = any_set_aside or any(entry.kind == KIND_SUBSCRIBE for entry in done.quarantined)
            dropped = set_aside_pairs(db, sub_nos, pubs, recorded) if len(pubs) and any_set_aside else None
            if dropped is not None:
                sub_nos, pubs = sub_nos[~dropped], pubs[~dropped]
                if copies:
                    kept = set(zip(sub_nos.tolist(), pubs.tolist(), strict=True))
                    copies = [copy for copy in copies if (copy[0], copy[1]) in kept]
            if stateful is not None and processed > recorded:
                if stateful.deliveries:
                    self._hold_log(db)
                logged = self._record_stateful(db, stateful, part) + [(n, p) for n, p, _ in stateful.initials]
                sub_nos = np.concatenate([sub_nos, np.array([n for n, _ in logged], np.int64)])
                pubs = np.concatenate([pubs, np.array([p for _, p in logged], np.int64)])
                copies += [(n, p, copy) for n, p, copy in stateful.initials if copy is not None]
            # the status rows written in a few statements, not one each
            counts = duration_counts([done.took_ms]) if done.took_ms is not None else {}
            values = {f"beat.{matcher}": now_ms()}  # a sign of life: compared by change, not by clock
            if done.built:
                counts["state_builds"] = 1
            if len(pubs):
                counts |= {"matched": distinct(pubs), "matches": len(pubs)}
                if processed > recorded:
                    values["matches_per_entry"] = -(-len(pubs) // (processed - recorded))
            with self._pipelined(db):  # the rest, written with the lock held, in one round trip
                if len(pubs):
                    rows = feed_rows(sub_nos, pubs)
                    # one statement for all rows (each with its own seq, in order): PostgreSQL's
                    # trigger signals the hubs once; the lock is held, so the last seq is this one's
                    # (`WHERE true`: SQLite reads an upsert's SELECT without one as a join)
                    db.execute(
                        "INSERT INTO feed(pairs, first, created, cropped) "
                        f"VALUES {', '.join(['(?, ?, ?, ?)'] * len(rows))}",
                        [item for pairs, first in rows for item in (pairs, first, now, bool(copies))],
                    )
                    db.execute(
                        "INSERT INTO status(name, value, updated) SELECT 'feed_seq', MAX(seq), ? FROM feed WHERE true "
                        f"ON CONFLICT (name) DO UPDATE SET value = {self.GREATEST}(status.value, excluded.value), "
                        "updated = excluded.updated",
                        (now,),
                    )
                if copies:
                    db.executemany(
                        "INSERT INTO copies(sub_no, pub, body) VALUES (?, ?, ?) "
                        "ON CONFLICT (sub_no, pub) DO UPDATE SET body = excluded.body",
                        copies,
                    )
                if counts:
                    add_statuses(db, counts)
                set_statuses(db, values)
                db.execute(
                    "INSERT INTO status(name, value, updated) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE "
                    f"SET value = {self.GREATEST}(status.value, excluded.value), updated = excluded.updated",
                    (f"processed.{part}", processed, now),
                )
                set_least(db, "processed", "processed.")
        return True

    def _record_stateful(self, db: Db, batch: StatefulBatch, part: int) -> list[tuple[int, int]]:
        """Log each delivery as a copy of its publication (the envelope keeps the original's id) and
        keep the stateful subscriptions' states; returns the (subscription number, copy offset) matches."""
        originals = {
            row[0]: row[1:]
            for row in db.execute(
                # (a replayed dead letter's copy keeps its original's id, and its cropping)
                f'SELECT "offset", body, client, key_id, signature, COALESCE(copy_of, "offset"), cropped FROM log '
                f'WHERE "offset" {self.IN_IDS}',
                (self._ids([pub for _, pub, _ in batch.deliveries]),),
            )
        }
        logged = []
        now = now_ms()
        for number, pub, cropped in batch.deliveries:
            if pub not in originals:  # kept while any state holds it: gone means nobody does
                continue
            body, client, key_id, signature, original, was_cropped = originals[pub]
            cut = cropped is not None or bool(was_cropped)
            offset = append_entry(
                db,
                "kind, body, client, key_id, signature, copy_of, cropped, time",
                (KIND_COPY, cropped or body, client, key_id, signature, original, cut, now),
            )
            logged.append((number, offset))
        db.executemany(
            "INSERT INTO subscription_state(number, blob) VALUES (?, ?) "
            "ON CONFLICT (number) DO UPDATE SET blob = excluded.blob",
            [(number, blob) for number, blob in batch.states if blob is not None],
        )
        db.executemany(
            "DELETE FROM subscription_state WHERE number = ?",
            [(number,) for number, blob in batch.states if blob is None],
        )
        for name, value in (("held", batch.held), ("due", batch.due)):
            if value is None:
                db.execute("DELETE FROM status WHERE name = ?", (f"{name}.{part}",))
            else:
                set_status(db, f"{name}.{part}", value)
            set_least(db, name, f"{name}.")
        return logged


def _ranks(keys: np.ndarray) -> np.ndarray:
    """Each element's place in its run of equal keys (the keys sorted)."""
    if not len(keys):
        return np.empty(0, np.int64)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return np.arange(len(keys)) - np.repeat(starts, np.diff(np.r_[starts, len(keys)]))


def _origin(row: Sequence[Any], cropped: bool = False) -> Origin:
    """An Origin from the ORIGIN columns; `cropped`: the subscriber gets a cropped copy."""
    publisher, key_id, signature, copy_of, was_cropped = row
    return Origin(publisher, key_id, signature, copy_of, bool(was_cropped or cropped))
