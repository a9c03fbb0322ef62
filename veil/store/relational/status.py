"""What the pipeline reports besides deliveries: its registration and heartbeat, its progress, the
stateful subscriptions' states it keeps, and the entries it set aside in the quarantine."""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence

import numpy as np

from veil.store.base import (
    BATCH_BOUNDS_MS,
    DEAD_LETTER_REASONS,
    KIND_SUBSCRIBE,
    BatchDurations,
    Ownership,
    PipelineStatus,
    Quarantined,
    QuarantineRecord,
    Totals,
)
from veil.store.relational.dialect import (
    Db,
    Dialect,
    add_status,
    get_status,
    now_ms,
    partition_progress,
    set_least,
    set_status,
    set_statuses,
)
from veil.store.relational.log import HEAD

QUARANTINE_PREVIEW = 4096  # bytes of a quarantined entry kept for the operator to look at
QUARANTINE_COLUMNS = 'seq, "offset", kind, sub_id, owner, error, body, time'


class StatusSql(Dialect):
    def quarantine(self, after: int = 0, limit: int = 1000) -> list[QuarantineRecord]:
        with self._read() as db:
            rows = db.execute(
                f"SELECT {QUARANTINE_COLUMNS} FROM quarantine WHERE seq > ? AND released IS NULL ORDER BY seq LIMIT ?",
                (after, limit),
            ).fetchall()
        return [QuarantineRecord(*row) for row in rows]

    def quarantined_at(self, offset: int) -> QuarantineRecord | None:
        with self._read() as db:
            row = db.execute(
                f'SELECT {QUARANTINE_COLUMNS} FROM quarantine WHERE "offset" = ? AND released IS NULL', (offset,)
            ).fetchone()
        return None if row is None else QuarantineRecord(*row)

    def release_quarantined(self, offset: int) -> bool:
        with self._tx() as db:
            return (
                db.execute(  # what the operator looked at goes: the row only says the entry was dropped
                    'UPDATE quarantine SET released = ?, body = NULL WHERE "offset" = ? AND released IS NULL',
                    (time.time(), offset),
                ).rowcount
                > 0
            )

    def subscription_refusal(self, sub_id: str) -> str | None:
        with self._read() as db:
            row = db.execute(
                'SELECT q.error FROM subscriptions s JOIN quarantine q ON q."offset" = s.created '
                "WHERE s.sub_id = ? AND s.deleted IS NULL AND q.released IS NULL",
                (sub_id,),
            ).fetchone()
        return row[0] if row else None

    def subscription_states(self, numbers: Sequence[int]) -> dict[int, bytes]:
        with self._read() as db:
            rows = db.execute(
                f"SELECT number, blob FROM subscription_state WHERE number {self.IN_IDS}", (self._ids(numbers),)
            ).fetchall()
        return dict(rows)

    def totals(self) -> Totals:
        with self._read() as db:
            reasons = [f"dead_lettered.{reason}" for reason in DEAD_LETTER_REASONS]
            counters = ["received", "matched", "matches", "forwarded", "dead_letters_expired", *reasons]
            names = ", ".join(f"'{name}'" for name in counters)
            counted = {
                name: int(value)
                for name, value in db.execute(f"SELECT name, value FROM status WHERE name IN ({names})")
            }
            subscriptions, subscribers = db.execute(
                "SELECT COUNT(*), COUNT(DISTINCT owner) FROM subscriptions WHERE deleted IS NULL"
            ).fetchone()
        dead_lettered = tuple(counted.pop(name, 0) for name in reasons)
        return Totals(**counted, subscriptions=subscriptions, subscribers=subscribers, dead_lettered=dead_lettered)

    def batch_durations(self) -> BatchDurations:
        buckets = [f"batch_{i}" for i in range(len(BATCH_BOUNDS_MS) + 1)]
        names = ", ".join(f"'{name}'" for name in [*buckets, "batch_ms", "state_builds"])
        with self._read() as db:
            kept = dict(db.execute(f"SELECT name, value FROM status WHERE name IN ({names})").fetchall())
        counts = tuple(int(kept.get(name, 0)) for name in buckets)
        return BatchDurations(counts, int(kept.get("batch_ms", 0)), int(kept.get("state_builds", 0)))

    def processed_offset(self) -> int:
        with self._read() as db:
            return get_status(db, "processed") or 0

    def matches_per_entry(self) -> int:
        with self._read() as db:
            return get_status(db, "matches_per_entry") or 0

    def due(self) -> int | None:
        with self._read() as db:
            return get_status(db, "due")

    def register_pipeline(self, pid: int) -> None:
        with self._tx() as db:
            set_status(db, "pipeline", pid)

    def expect_pipeline(self) -> None:
        self.register_pipeline(0)

    def heartbeat(self, quiet_since: int, dark: Sequence[int] | None = ()) -> None:
        if dark is None:
            with self._alone() as db:
                set_status(db, "heartbeat", quiet_since)
            return
        with self._tx() as db:
            set_status(db, "heartbeat", quiet_since)
            db.execute("DELETE FROM status WHERE name LIKE ?", ("dark.%",))
            for part in dark:
                set_status(db, f"dark.{part}", 1)

    def set_partitions(self, partitions: int) -> list[int]:
        with self._tx() as db:
            kept = _numbered(db, "processed.")
            if set(kept) != set(range(partitions)):
                # a subscription's partition follows from the count: all restart where the slowest was
                start = min(kept.values()) if kept else get_status(db, "processed") or 0
                db.execute("DELETE FROM status WHERE name LIKE ? OR name LIKE ?", ("processed.%", "beat.%"))
                for part in range(partitions):
                    set_status(db, f"processed.{part}", start)
                kept = dict.fromkeys(range(partitions), start)
                set_least(db, "processed", "processed.")
                # the stateful subscriptions moved too: each partition holds what all held, until its
                # first round says what it holds (a row of a partition that is gone would stay for ever)
                for name in ("held", "due"):
                    least = get_status(db, name)
                    db.execute("DELETE FROM status WHERE name LIKE ?", (f"{name}.%",))
                    if least is not None:
                        for part in range(partitions):
                            set_status(db, f"{name}.{part}", least)
                    set_least(db, name, f"{name}.")
            # the claims of tasks that are gone: ranges are handed out again from the recorded progress
            db.execute(
                "DELETE FROM status WHERE name = 'claimed' OR name LIKE ? OR name LIKE ?", ("claim.%", "claimend.%")
            )
            return [kept[part] for part in range(partitions)]

    def claim_range(self, rows: int, part: int) -> tuple[int, int]:
        # (the feed's order alone, as the rounds recording the ranges: the log's head is read, and
        # offsets become visible in order, so no group commit of publications need wait for it)
        with self._tx(log=False) as db:
            progress = partition_progress(db, 0)
            start, end = get_status(db, f"claim.{part}"), get_status(db, f"claimend.{part}")
            if start is not None and end is not None and end > progress:
                return start, end  # claimed by an earlier task of the partition, never recorded
            start = max(get_status(db, "claimed") or 0, progress)
            head = db.execute(HEAD).fetchone()[0]
            end = max(start, min(head, start + rows))
            if end > start:
                set_status(db, "claimed", end)
                set_status(db, f"claim.{part}", start)
                set_status(db, f"claimend.{part}", end)
        return start, end

    def partition_offset(self, part: int) -> int:
        with self._read() as db:
            return partition_progress(db, part)

    def partition_beat(self, parts: Sequence[int]) -> None:
        if not parts:
            return
        now = now_ms()
        with self._alone() as db:
            set_statuses(db, {f"beat.{part}": now for part in parts})

    def partition_beats(self) -> dict[int, int]:
        return self._numbered("beat.")

    def own_partition(self, part: int, token: int) -> None:
        with self._tx() as db:
            set_status(db, f"owner.{part}", token)
            set_status(db, f"beat.{part}", now_ms())

    def adopt_partition(self, part: int, token: int, beat: int | None) -> bool:
        with self._tx() as db:
            row = db.execute(f"SELECT value FROM status WHERE name = ?{self.ROW_LOCK}", (f"beat.{part}",)).fetchone()
            if (row[0] if row else None) != beat:
                return False
            set_status(db, f"owner.{part}", token)
            set_status(db, f"beat.{part}", now_ms())
            return True

    def partition_owners(self) -> dict[int, int]:
        return self._numbered("owner.")

    def partition_ownership(self) -> Ownership:
        with self._read() as db:
            rows = db.execute(
                "SELECT name, value FROM status WHERE name LIKE ? OR name LIKE ? OR name IN (?, ?)",
                ("owner.%", "beat.%", "epoch_cuts", "epoch_losses"),
            ).fetchall()
        owners: dict[int, int] = {}
        beats: dict[int, int] = {}
        cuts = {"epoch_cuts": 0, "epoch_losses": 0}
        for name, value in rows:
            if name in cuts:
                cuts[name] = value
                continue
            kind, part = name.split(".", 1)
            (owners if kind == "owner" else beats)[int(part)] = value
        return Ownership(owners, beats, (cuts["epoch_cuts"], cuts["epoch_losses"]))

    def claim_partitions(self, epoch: int, task: int, tasks: int, partitions: int, wanted: Sequence[int]) -> list[int]:
        with self._tx() as db:  # write transactions are serialized: two tasks never claim one partition
            started, claimant = _numbered(db, "started."), _numbered(db, "claimant.")
            claimed = {part for part, value in started.items() if value == epoch}
            holders = collections.Counter(claimant.get(part) for part in claimed)
            mine = [part for part in claimed if claimant.get(part) == task]
            # shares as even as they go: `extra` tasks run one partition more than the others
            base, extra = divmod(partitions, max(1, tasks))
            larger = sum(1 for holder, count in holders.items() if holder != task and count > base)
            share = base + 1 if larger < extra else base
            for part in wanted:
                if len(mine) >= share:
                    break
                if part not in claimed:
                    set_status(db, f"started.{part}", epoch)
                    set_status(db, f"claimant.{part}", task)
                    claimed.add(part)
                    mine.append(part)
            set_status(db, f"arrived.{task}", epoch)
        return sorted(mine)

    def arrivals(self, epoch: int) -> int:
        with self._read() as db:
            row = db.execute("SELECT COUNT(*) FROM status WHERE name LIKE ? AND value = ?", ("arrived.%", epoch))
            return int(row.fetchone()[0])

    def end_leases(self, parts: Sequence[int], epoch: int) -> None:
        with self._tx() as db:
            for part in parts:
                set_status(db, f"ended.{part}", epoch)

    def leases(self, epoch: int) -> tuple[set[int], set[int]]:
        with self._read() as db:
            started, ended = _numbered(db, "started."), _numbered(db, "ended.")
        return (
            {part for part, value in started.items() if value == epoch},
            {part for part, value in ended.items() if value == epoch},
        )

    def cut_epoch(self, lost: bool) -> None:
        with self._tx() as db:
            add_status(db, "epoch_cuts", 1)
            if lost:
                add_status(db, "epoch_losses", 1)

    def epoch_cuts(self) -> tuple[int, int]:
        with self._read() as db:
            return get_status(db, "epoch_cuts") or 0, get_status(db, "epoch_losses") or 0

    def _numbered(self, prefix: str) -> dict[int, int]:
        with self._read() as db:
            return _numbered(db, prefix)

    def pipeline_status(self) -> PipelineStatus:
        # the quarantine's figures ride along, so that /health follows them at every look at the
        # pipeline without a statement of their own
        with self._read() as db:
            rows = {
                name: (value, updated)
                for name, value, updated in db.execute(
                    "SELECT name, value, updated FROM status WHERE name IN ('pipeline', 'heartbeat') OR name LIKE ? "
                    "UNION ALL SELECT 'quarantine', COUNT(*), COALESCE(MAX(seq), 0) FROM quarantine "
                    "WHERE released IS NULL",
                    ("dark.%",),
                )
            }
        dark = tuple(sorted(_partition(name) for name in rows if name.startswith("dark.")))
        quarantined, last_quarantined = rows["quarantine"]
        (pid, registered), beat = rows.get("pipeline", (0, 0.0)), rows.get("heartbeat")
        return PipelineStatus(
            pid, registered, beat[0] if beat else 0, beat[1] if beat else None, dark, quarantined, int(last_quarantined)
        )


def _numbered(db: Db, prefix: str) -> dict[int, int]:
    """The status rows `prefix`<partition>, by partition."""
    rows = db.execute("SELECT name, value FROM status WHERE name LIKE ?", (prefix + "%",)).fetchall()
    return {_partition(name): value for name, value in rows}


def _partition(name: str) -> int:
    """The partition a status row `<prefix>.<partition>` is of."""
    return int(name.rsplit(".", 1)[1])


def set_aside(db: Db, entries: Sequence[Quarantined], processed: int, now: float) -> None:
    """Set entries aside; a subscription named without its offset is the version in force at
    `processed` (the one a matcher held when it failed), unless it has been removed or replaced
    since: a matcher reloading its state before it reaches the removal fails on it again, and
    setting that aside would bring back a quarantine the operator has just dropped."""
    for entry in entries:
        offset, owner, body = entry.offset, entry.owner, None
        if entry.kind == KIND_SUBSCRIBE:
            row = db.execute(
                "SELECT created, owner, substr(body, 1, ?) FROM subscriptions WHERE sub_id = ? AND created <= ? "
                "AND deleted IS NULL",
                (QUARANTINE_PREVIEW, entry.sub_id, processed),
            ).fetchone()
            if row is None:
                continue  # replaced or removed since: nothing is left to set aside
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


def set_aside_pairs(db: Db, sub_nos: np.ndarray, pubs: np.ndarray, since: int) -> np.ndarray | None:
    """Which matches go to a subscription version that is set aside (None: none do): with
    publication partitioning every matcher partition holds every subscription, and one that failed
    on a version sets it aside while the others, matching later ranges at the same time, still
    hold it. Their matches for it are dropped here, so a set-aside subscription gets nothing from
    any round recorded after it. `since`: the partition's recorded progress (older versions are
    done). Only plain matches are given: a later version of the id (same number) has initial
    matches older than itself, which are its own."""
    versions = db.execute(
        # CROSS JOIN: SQLite's planner, without statistics, would walk every live subscription; the
        # kind as a literal, which the partial index covers
        "SELECT l.number, s.created, s.deleted FROM quarantine q CROSS JOIN subscriptions s CROSS JOIN log l "
        f'WHERE s.created = q."offset" AND l."offset" = s.created AND q.kind = {KIND_SUBSCRIBE} '
        "AND (s.deleted IS NULL OR s.deleted > ?)",
        (since,),
    ).fetchall()
    if not versions:
        return None
    hit = np.isin(sub_nos, [number for number, _, _ in versions])
    if not hit.any():
        return None
    present = set(np.unique(sub_nos[hit]).tolist())
    dropped = np.zeros(len(pubs), bool)
    for number, created, deleted in versions:
        if number in present:
            dropped |= (sub_nos == number) & (pubs > created) & (pubs < (deleted or np.iinfo(np.int64).max))
    return dropped
