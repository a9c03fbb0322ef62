"""One matcher partition's long-running task: it follows the log for an epoch, one round per commit.

A Spark task that matched one micro-batch paid Spark's fixed cost per batch (planning, offset and
commit logs, scheduling, two Python workers' hand-over), 250-350 ms on two cores, however few
publications it carried. Here each partition's task runs for a whole epoch instead (Spark's
real-time mode does the same: long batches whose tasks process records as they arrive; it rejects
Python sources, so this one is built on the Python data source). A round waits for the log's head
to move, reads what is new for the partition, matches and authorizes it under the partition's state
(`MatchPartition`, as any batch) and records the matches with the partition's processed offset in
one transaction (`exit_point`), then looks again: a publication waits for the round in progress,
not for the next micro-batch.

With publication partitioning every partition holds all subscriptions, so they take turns instead:
each claims the next range of the log (`claim_range`), matches it while the others match theirs,
and records it once the ranges before it are recorded, so that each subscription's matches still
queue in publication order.

Progress lives in the store, per partition, in the transaction that records the round: a task
killed at any point, a retried task or the next epoch's task starts from there, and a round
recorded twice delivers nothing twice.
"""

from __future__ import annotations

import logging
import secrets
import time

import numpy as np
import pyarrow as pa

from veil.monitoring import trace
from veil.pipeline.exit_point import record_round
from veil.pipeline.match import MatchPartition
from veil.pipeline.partition import partition_of
from veil.pipeline.rows import LOG_ARROW, MARK, MATCH_ARROW
from veil.pipeline.store_handle import store_for
from veil.store import (
    KIND_CANCEL,
    KIND_COPY,
    KIND_PUBLICATION,
    KIND_REGISTRY,
    KIND_TICK,
    LogEntry,
    PipelineStore,
    StoreUnavailable,
)

log = logging.getLogger("veil.pipeline")
HEAD_POLL = 0.002  # seconds between looks at the log's head while waiting for a commit
IDLE_BEAT = 0.5  # seconds a waiting partition lets pass between saying it is alive
STORE_RETRY = 0.5  # seconds before a round the store refused is tried again
# A partition nothing was heard from for this long is adopted by a task that runs: its own task died
# with its executor or waits for a core. Longer than any pause of a live task but a round's, and a
# live task's round done twice is recorded once.
SILENT_MS = 10_000
ORDER_WAIT = 1.0  # seconds a matched range waits for the ranges before it, before the task looks around
# What a round costs downstream grows with the subscriptions it delivers to: the gateway offers its
# feed entry to each of their sessions and writes to their connections. Up to PACED_SUBSCRIPTIONS
# of them the gap is `round_gap`; beyond, it grows in proportion (up to GAP_GROWTH times), and it
# applies even when the partition caught up. Without that, with 20,000 subscriptions and a quarter
# matching each reading, every group commit made a round that woke thousands of sessions, and the
# gateway's event loop, busy with them, acknowledged ever fewer publications (16-27 readings/s of
# 1,000 offered).
PACED_SUBSCRIPTIONS = 1_000
GAP_GROWTH = 10


class PartitionTask:
    """Picklable: built on the driver, run in an executor's Python worker."""

    def __init__(
        self, url: str, part: int, partitions: int, by_publication: bool, with_authorization: bool,
        entry_timeout: float, max_rows: int, max_matches: int, round_gap: float = 0.0,
    ) -> None:  # fmt: skip
        self.url = url
        self.part = part
        self.partitions = partitions
        self.by_publication = by_publication
        self.max_rows = max_rows
        self.max_matches = max_matches
        self.round_gap = round_gap
        self._began: dict[int, float] = {}  # when each held partition's last round began (monotonic)
        self._caught_up: dict[int, bool] = {}  # whether its last look found nothing to do
        # the gap before its next round, and whether it applies even when caught up
        self._gap: dict[int, tuple[float, bool]] = {}
        # publication partitioning: a claimed range matched and waiting for the ranges before it
        self._waiting: dict[int, tuple[int, int, pa.Table]] = {}
        self.matcher = MatchPartition(url, partitions, by_publication, with_authorization, entry_timeout)

    def run(self, deadline: float) -> tuple[int, int]:
        """Follow the log until `deadline` (Unix time: a task that waited for a core past it ends at
        once); returns (the offset processed, rounds recorded). The task holds its own partition and
        any it adopted, one round each in turn, and lets go of one another task took back."""
        store = store_for(self.url)
        token = secrets.randbits(62)
        held: set[int] = set()
        looked, started = 0.0, time.time() * 1000
        rounds, failing = 0, False
        while (left := deadline - time.time()) > 0:
            try:
                if not looked:
                    store.own_partition(self.part, token)
                    held.add(self.part)
                if time.monotonic() - looked > IDLE_BEAT:
                    held = self._look_around(store, token, held, started)
                    looked = time.monotonic()
                idle = [self._round(store, part) for part in sorted(held)]
                rounds += idle.count(None)
                if not held:  # another task took the partition back; this one looks for silent ones
                    time.sleep(min(IDLE_BEAT, left))
                elif None not in idle:
                    self._head_after(store, min(idle), min(IDLE_BEAT, left))  # type: ignore[type-var]
                    store.partition_beat(sorted(held))
                failing = False
            except StoreUnavailable as exc:
                if not failing:
                    log.error("matcher partition %d cannot reach the store: %s", self.part, exc)
                failing = True
                time.sleep(min(STORE_RETRY, max(0.0, deadline - time.time())))
        return _offset_or(store, self.progress(self.part), 0), rounds

    def _look_around(self, store: PipelineStore, token: int, held: set[int], started: float) -> set[int]:
        """The partitions this task holds now: those whose owner it still is, and any silent one.
        Silent counts from this task's start at the earliest: the epoch's other tasks start a moment
        apart, and two tasks matching one partition at once would each decide its top-k/w
        deliveries from a state of their own."""
        owners = store.partition_owners()
        held = {part for part in held if owners.get(part) == token}
        beats, now = store.partition_beats(), time.time() * 1000
        for part in range(self.partitions):
            silent = now - max(beats.get(part, 0), started)
            if part not in held and silent > SILENT_MS and store.adopt_partition(part, token, SILENT_MS):
                log.warning("partition %d adopts partition %d, silent for %.0f s", self.part, part, silent / 1000)
                held.add(part)
        return held

    def progress(self, part: int) -> int:
        """The partition whose progress records `part`'s rounds (publication partitioning: one for all)."""
        return 0 if self.by_publication else part

    def _round(self, store: PipelineStore, part: int) -> int | None:
        """A round of `part`: None if it recorded one, else the log offset past which there is work."""
        idle = self._claimed_round(store, part) if self.by_publication else self._own_round(store, part)
        self._caught_up[part] = idle is not None
        return idle

    def _paced(self, part: int) -> float:
        """Wait, while publications keep coming, until the gap has passed since `part`'s last round
        began: at a high rate a round per commit would make a feed entry, and a write to every
        subscriber it matches, every few milliseconds; a partition that caught up starts at once,
        unless its last round reached many subscriptions. Returns when this round begins."""
        gap, wide = self._gap.get(part, (self.round_gap, False))
        if wide or not self._caught_up.get(part, True):
            time.sleep(max(0.0, self._began.get(part, 0.0) + gap - time.monotonic()))
        self._began[part] = began = time.monotonic()
        return began

    def _own_round(self, store: PipelineStore, part: int) -> int | None:
        """Subscription partitioning: the partition's next range, from its own progress to the head."""
        start = store.partition_offset(part)
        if store.head_offset() <= start:
            return start
        began = self._paced(part)
        head = store.head_offset()
        end = round_end(start, head, self.max_rows, self.max_matches, store.matches_per_entry())
        self._record(store, self._matched(store, part, start, end), part, start, end, began)
        return None

    def _claimed_round(self, store: PipelineStore, part: int) -> int | None:
        """Publication partitioning: the next range no other partition has claimed (or the one this
        partition claimed and never recorded), matched while the others match theirs, recorded
        once the ranges before it are. If they are not soon, the range stays claimed and the task
        looks around: the partition that claimed them may need adopting."""
        began = self._paced(part)
        rows = round_end(0, self.max_rows, self.max_rows, self.max_matches, store.matches_per_entry())
        start, end = store.claim_range(rows, part)
        if end <= start:
            return start  # everything up to `start` is claimed
        waiting = self._waiting.pop(part, None)
        if waiting is not None and waiting[:2] == (start, end):
            table = waiting[2]  # matched before: matching it again would also rebuild the state
        else:
            table = self._matched(store, part, start, end)
        waited = time.monotonic() + ORDER_WAIT
        while store.partition_offset(0) < start:
            if time.monotonic() > waited:
                self._waiting[part] = (start, end, table)
                return 0  # tried again after a look around
            time.sleep(HEAD_POLL)
        self._record(store, table, part, start, end, began)
        return None

    def _matched(self, store: PipelineStore, part: int, start: int, end: int) -> pa.Table:
        trace.mark("seen", start, end)
        # the pipeline's own output (copies) and withdrawals are not its input
        entries = store.log_range(start, end, (KIND_COPY, KIND_CANCEL))
        trace.mark("read", start, end)
        batch = log_batch(part, start, end, [e for e in entries if self._wanted(e, part)])
        return pa.Table.from_batches(list(self.matcher(iter([batch]))), MATCH_ARROW)

    def _record(self, store: PipelineStore, table: pa.Table, part: int, start: int, end: int, began: float) -> None:
        record_round(store, table, self.progress(part), int((time.monotonic() - began) * 1000), start)
        reached = len(np.unique(table.column("sub_no").to_numpy()))
        growth = min(GAP_GROWTH, max(1.0, reached / PACED_SUBSCRIPTIONS))
        self._gap[part] = (self.round_gap * growth, reached >= PACED_SUBSCRIPTIONS)
        trace.mark("recorded", start, end)

    def _wanted(self, entry: LogEntry, part: int) -> bool:
        """Subscription partitioning: every partition matches every publication against 1/N of the
        subscriptions. Publication partitioning: every partition holds all subscriptions and
        matches the ranges it claimed."""
        if self.by_publication or entry.kind in (KIND_PUBLICATION, KIND_REGISTRY, KIND_TICK):
            return True
        return partition_of(entry.sub_id, self.partitions) == part  # type: ignore[arg-type]

    @staticmethod
    def _head_after(store: PipelineStore, offset: int, wait: float) -> int:
        """The log's head, waiting up to `wait` seconds for it to move past `offset`. Polled: a head
        read is a few microseconds of an index's last page, and the gateways that commit may be
        other processes or machines."""
        head = store.head_offset()
        deadline = time.monotonic() + wait
        while head <= offset and time.monotonic() < deadline:
            time.sleep(HEAD_POLL)
            head = store.head_offset()
        return head


def _offset_or(store: PipelineStore, part: int, fallback: int) -> int:
    """Where the partition's recorded progress is (a failed commit may have landed after all)."""
    try:
        return store.partition_offset(part)
    except StoreUnavailable:
        return fallback


def round_end(start: int, head: int, max_rows: int, max_matches: int, seen: int) -> int:
    """Where a round starting after `start` ends: at the head, unless that is more than `max_rows`
    entries or, at `seen` matches per entry in the last round that had any, more than about
    `max_matches` matches (a round holds its matches in memory until they are recorded: with a
    quarter of 100,000 subscriptions matching each publication, a backlog of a few thousand
    publications is over a billion matches). At least one entry."""
    rows = max_rows if seen <= 0 else min(max_rows, max(1, max_matches // seen))
    return max(start, min(head, start + rows))


def log_batch(part: int, start: int, end: int, entries: list[LogEntry]) -> pa.RecordBatch:
    """A round's input for `MatchPartition`: a mark row carrying the range (start, end], then the
    partition's entries of it."""
    def column(name: str) -> list:
        return [None, *(getattr(entry, name) for entry in entries)]

    offsets = [start, *(e.offset for e in entries)]
    until = [None] * len(offsets)
    until[0] = end
    kinds = [MARK, *(e.kind for e in entries)]
    return pa.RecordBatch.from_arrays(
        [pa.array([part] * len(offsets), pa.int32()), pa.array(offsets, pa.int64()), pa.array(kinds, pa.int32()),
         pa.array(column("sub_id"), pa.string()), pa.array(column("number"), pa.int64()),
         pa.array(column("body"), pa.binary()), pa.array(column("client"), pa.string()),
         pa.array(column("time"), pa.int64()), pa.array(until, pa.int64())],
        schema=LOG_ARROW,
    )  # fmt: skip
