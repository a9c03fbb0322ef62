"""One task of the `rounds` trigger: it follows the log for an epoch, one round per commit, for the
matcher partitions it was given.

A Spark task that matched one micro-batch paid Spark's fixed cost per batch (planning, offset and
commit logs, scheduling, two Python workers' hand-over), 250-350 ms on two cores, however few
publications it carried. Here each task runs for a whole epoch instead. A round waits for the log's
head to move, reads what is new for the partition, runs the round core on it (`Matcher`) and records
the `Round` with the partition's processed offset in one transaction, then looks again: a
publication waits for the round in progress, not for the next micro-batch.

With publication partitioning every partition holds all subscriptions, so they take turns instead:
each claims the next range of the log (`claim_range`), matches it while the others match theirs,
and records it once the ranges before it are recorded, so that each subscription's matches still
queue in publication order.

Spark places, starts and (with task retries) restarts these tasks; progress lives in the store, per
partition, in the transaction that records the round, so a task killed at any point, a retried task
or the next epoch's task starts from there, and a round recorded twice delivers nothing twice.
Liveness is the store's too: a thread of each task says every BEAT seconds that its partitions are
alive, however long a round takes; a partition silent for SILENT_MS (its task's worker died or is
stopped) is adopted by a task that runs. Ownership is fenced: a round is recorded only while the task
that made it owns the partition, and a task given a partition takes it back when it finds another
holding it (it was paused and came back), so two tasks never both decide a partition's deliveries.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from veil.monitoring import trace
from veil.pipeline import worker_state
from veil.pipeline.matcher import Matcher
from veil.pipeline.store_handle import store_for
from veil.store import PipelineStore, Round, StoreUnavailable
from veil.store.queues import distinct

log = logging.getLogger("veil.pipeline")
ORDER_POLL = 0.002  # seconds between looks at the ranges before a matched one, while it waits for them
BEAT = 1.0  # seconds between a task's signs of life, and between its looks at who owns what
FINISH_POLL = 0.02  # seconds between looks for the epoch's end, past its deadline
STORE_RETRY = 0.5  # seconds before a round the store refused is tried again
# A partition nothing was heard from for this long is adopted by a task that runs: its own task's
# worker died or is stopped. Beats come from a thread of their own, so a long round is no silence;
# what is left is a worker that cannot run Python at all for this long, or a store that cannot take
# a beat (a write lock held as long). Silence is timed by the observer's own clock, from the moment
# it saw a partition's last beat, since the beats' clocks are other machines'.
SILENT_MS = 5_000
# A task whose rounds have not moved for this long (or twice the entry timeout, if longer) stops
# beating: its main thread hangs (a connection that never answers), and its partitions need adopting.
STUCK = 60.0
ORDER_WAIT = 1.0  # seconds a matched range waits for the ranges before it, before the task looks around
ARRIVAL_WAIT = 1.0  # seconds a task waits for the epoch's others to claim what their workers hold
# What a round costs downstream grows with the subscriptions it delivers to: the gateway offers its
# feed entry to each of their connections and writes to their connections. Up to PACED_SUBSCRIPTIONS
# of them the gap is `round_gap`; beyond, it grows in proportion (up to GAP_GROWTH times), and it
# applies even when the partition caught up. Without that, with 20,000 subscriptions and a quarter
# matching each reading, every group commit made a round that woke thousands of connections, and the
# gateway's event loop, busy with them, acknowledged ever fewer publications (16-27 readings/s of
# 1,000 offered).
PACED_SUBSCRIPTIONS = 1_000
GAP_GROWTH = 10
# Rounds are paced once a partition's log moves at PACED_RATE entries a second or more (over the
# last RATE_WINDOW seconds). Below, a round per commit costs the gateway little, and pacing made a
# commit that landed while a round ran wait the whole gap: at 200 publications/s with 512
# subscriptions, committed -> seen p99 was 98-99 ms paced and 2-3 ms not. Above, at saturation, a
# round per commit made 1.6 times the rounds per publication, each a feed entry offered to every
# connection it matches, and throughput end to end fell 13 % (512 subscriptions).
PACED_RATE = 500
RATE_WINDOW = 1.0


class Silence:
    """How long each matcher partition's sign of life has stayed the same, by this process's clock
    from the moment it saw the value change: a beat is another machine's clock reading, compared
    only for change."""

    def __init__(self) -> None:
        self._heard: dict[int, tuple[int | None, float]] = {}  # partition -> (its last beat, seen since)

    def hear(self, beats: Mapping[int, int], parts: Iterable[int]) -> dict[int, float]:
        """Take in the beats just read; returns each of `parts`' silence in seconds."""
        now = time.monotonic()
        for part in parts:
            heard = self._heard.get(part)
            if heard is None or heard[0] != beats.get(part):
                self._heard[part] = (beats.get(part), now)
        return {part: now - self._heard[part][1] for part in parts}

    def seconds(self, part: int) -> float:
        """`part`'s silence as of now, from what was last heard (0 if nothing was)."""
        heard = self._heard.get(part)
        return 0.0 if heard is None else time.monotonic() - heard[1]


class PartitionTask:
    """Picklable: built on the driver, run in an executor's Python worker."""

    def __init__(
        self, matcher: Matcher, task: int, tasks: int, max_rows: int, max_matches: int, round_gap: float = 0.0,
    ) -> None:  # fmt: skip
        self.matcher = matcher
        self.task = task  # its number among the epoch's `tasks`, the same for a retried attempt
        self.tasks = tasks
        self.parts: list[int] = []  # the partitions it claimed (more than one when cores are fewer)
        self.max_rows = max_rows
        self.max_matches = max_matches
        self.round_gap = round_gap
        self._began: dict[int, float] = {}  # when each held partition's last round began (monotonic)
        self._recent: dict[int, deque[tuple[float, int]]] = {}  # its rounds in the last RATE_WINDOW: (when, entries)
        # the gap before its next round, and whether it applies even when caught up
        self._gap: dict[int, tuple[float, bool]] = {}
        # matches per log entry in its last round that had any, which sizes the next round: read from
        # the store once (another task's rounds), then known from this task's own (a read a round less)
        self._per_entry: dict[int, int] = {}
        # when each held partition's stateful subscriptions are next due (ms), and the tick logged for it
        self._due: dict[int, int | None] = {}
        self._ticked: dict[int, int] = {}
        # publication partitioning: a claimed range matched and waiting for the ranges before it
        self._waiting: dict[int, Round] = {}
        self.held: set[int] = set()  # the partitions this task owns now
        # the log's head as last read (a lower bound of the next offset), and how far each held partition
        # has recorded it (only its owner records it): an idle task reads neither between its waits
        self._head = 0
        self._offsets: dict[int, int] = {}
        self._claimed_to: dict[int, int] = {}  # publication partitioning: all of the log claimed up to here
        self._silence = Silence()
        self._moved = time.monotonic()  # when the task's loop last went round

    def run(self, deadline: float, cuts: tuple[int, int] | None = None) -> tuple[int, int]:
        """Follow the log until the epoch ends: `deadline` (Unix time, the same for all the epoch's
        tasks) has passed and every partition's task has reached it. A task past it goes on with
        its partitions, and adopts silent ones, until then: the epoch's next tasks start only when
        all of this one's have ended, and a task stopped or waiting for a core past the deadline
        would otherwise leave every partition dark until it came back.

        The driver cuts the epoch (`cuts`: the store's count of cuts when it was planned) when
        executors come or go, so that a new one runs tasks without waiting for the deadline: the
        tasks then end at once. When executors were lost, a task also stops waiting for the lease
        of a partition it adopted or that has been silent for SILENT_MS: its task was on a lost
        executor, and its retry needs the cores the waiting tasks hold to run and end it. Returns
        (the least offset its partitions processed, rounds recorded)."""
        store = store_for(self.matcher.url)
        token = secrets.randbits(62)
        epoch = int(deadline * 1000)
        lost = False  # its epoch was cut because executors were lost
        ended = threading.Event()
        beats = threading.Thread(target=self._beat, args=(store, ended), name="veil-beats", daemon=True)
        looked = settle_by = 0.0
        rounds, failing, leased, settled, over = 0, False, False, False, False
        try:
            while True:
                self._moved = time.monotonic()
                try:
                    if not leased:
                        self._claim(store, epoch, self._warm())
                        leased, settle_by = True, time.monotonic() + ARRIVAL_WAIT
                    # settled before the deadline's step: the leases it ends are all it claimed
                    if not settled and (
                        time.monotonic() > settle_by or time.time() >= deadline or store.arrivals(epoch) >= self.tasks
                    ):
                        self._claim(store, epoch, range(self.matcher.partitions))
                        settled = True
                        looked = 0.0  # what it claimed now it runs now, not after the next BEAT
                    if not over and time.time() >= deadline:
                        store.end_leases(self.parts, epoch)
                        over = True
                    if over and self._epoch_over(store, epoch, lost):
                        break
                    if time.monotonic() - looked > BEAT:
                        now = self._look_around(store, token)
                        looked = time.monotonic()
                        if cuts is not None and not lost:
                            if now[0] > cuts[0] and deadline > time.time():
                                deadline = time.time()
                                continue  # it ends now: no round first
                            lost = now[1] > cuts[1]
                        if beats.ident is None:
                            beats.start()
                    idle = [self._round(store, part, token) for part in sorted(self.held)]
                    rounds += idle.count(None)
                    waiting = [offset for offset in idle if offset is not None]
                    if not idle:  # none held (yet, or another task runs them all): only looks around
                        time.sleep(FINISH_POLL if over or not settled else max(0.0, min(BEAT, deadline - time.time())))
                    elif len(waiting) == len(idle):
                        # past the deadline, look often for the epoch's end
                        wait = FINISH_POLL if over else min(BEAT, deadline - time.time(), self._until_due())
                        self._head = store.wait_for_log(min(waiting, default=0), wait)
                    failing = False
                except StoreUnavailable as exc:
                    self._offsets.clear()  # a commit that failed may have landed after all
                    if not failing:
                        log.error("matcher task of partitions %s cannot reach the store: %s", self.parts, exc)
                    failing = True
                    time.sleep(STORE_RETRY)
        finally:
            ended.set()
            self.held = set()
        return min((_offset_or(store, self.matcher.progress(part), 0) for part in self.parts), default=0), rounds

    def _claim(self, store: PipelineStore, epoch: int, wanted: Sequence[int]) -> None:
        """Claim the partitions this task runs in the epoch, up to its share, and keep only their
        states. Spark hands an epoch's tasks to whichever Python workers are free, and a task given
        the partition the other worker held would build that state from the store (seconds with
        100,000 subscriptions) while the other built this one's. So a task claims first what its
        worker holds and starts on it at once, then the rest of its share once every task of the
        epoch has claimed what its worker holds, or ARRIVAL_WAIT after it came (a task slow to
        start). What a task that never starts would have claimed is adopted by its silence, as a
        stopped task's partitions are."""
        self.parts = store.claim_partitions(epoch, self.task, self.tasks, self.matcher.partitions, wanted)
        # a worker keeps the states of the partitions it runs, not of every one it ever ran
        worker_state.keep({self.matcher.state_key(part) for part in self.parts})

    def _warm(self) -> list[int]:
        """The partitions whose state this task's worker holds (one state serves them all with
        publication partitioning)."""
        held = worker_state.held(self.matcher.url, self.matcher.partitions)
        return list(range(self.matcher.partitions)) if held and self.matcher.by_publication else sorted(held)

    def _epoch_over(self, store: PipelineStore, epoch: int, lost: bool) -> bool:
        """Whether every task of the epoch that started has reached the deadline. One that never
        started (it waits for a core the running tasks hold) is not waited for: it starts once they
        end, past the deadline, and ends at once. With executors `lost`, nor is one whose
        partitions have been silent for SILENT_MS."""
        started, ended = store.leases(epoch)
        if lost:  # adopted here, or silent: its task is not coming back in this epoch
            started = {part for part in started - self.held if self._silence.seconds(part) * 1000 <= SILENT_MS}
        return started <= ended

    def _beat(self, store: PipelineStore, ended: threading.Event) -> None:
        """Say every BEAT seconds that the held partitions are alive, until the task ends or its
        loop stops going round."""
        stuck = max(STUCK, 2 * self.matcher.entry_timeout)
        while not ended.wait(BEAT):
            if time.monotonic() - self._moved > stuck:
                continue
            try:
                store.partition_beat(sorted(self.held))
            except StoreUnavailable:
                pass  # the rounds report it; the others see silence
            except Exception:  # a beat thread that died would leave its partitions to be adopted and taken back
                log.exception("matcher task of partitions %s could not beat", self.parts)

    def _look_around(self, store: PipelineStore, token: int) -> tuple[int, int]:
        """Bring `held` up to date: the partitions this task was given, taken (back) when another task
        holds them; those it adopted that it still owns; and any silent one. Silent counts from this
        task's first look at the earliest: the epoch's other tasks start a moment apart, and two
        tasks matching one partition at once would each decide its stateful deliveries from a state
        of their own. Returns the store's counts of epoch cuts (`epoch_cuts`), read with the rest."""
        owners, beats, cuts = store.partition_ownership()
        retaken = set()
        for part in self.parts:
            if owners.get(part) != token:
                retaken.add(part)
                if part in self.held:
                    log.warning("partition %d was adopted while its task was stopped: it takes it back", part)
                store.own_partition(part, token)
                owners[part] = token
        held = {part for part in (*self.held, *self.parts) if owners.get(part) == token}
        for part, silent in self._silence.hear(beats, range(self.matcher.partitions)).items():
            if part not in held and silent * 1000 > SILENT_MS and store.adopt_partition(part, token, beats.get(part)):
                log.warning("partitions %s adopt partition %d, silent for %.1f s", self.parts, part, silent)
                held.add(part)
        # another task took it: its state here is not kept up (unless it serves one still held)
        kept = {self.matcher.state_key(part) for part in held}
        for key in {self.matcher.state_key(part) for part in self.held - held} - kept:
            worker_state.discard(key)
        for part in (held ^ self.held) | retaken:  # another task may have recorded rounds of it meanwhile
            self._due.pop(part, None)
            self._offsets.pop(part, None)
            self._claimed_to.pop(part, None)
            self._ticked.pop(part, None)
            self._per_entry.pop(part, None)
        self.held = held
        return cuts

    def _round(self, store: PipelineStore, part: int, token: int) -> int | None:
        """A round of `part`: None if it recorded one, else the log offset past which there is work."""
        if self.matcher.by_publication:
            idle = self._claimed_round(store, part, token)
        else:
            idle = self._own_round(store, part, token)
        return idle

    def _paced(self, part: int) -> float:
        """Wait, while publications come fast (PACED_RATE), until the gap has passed since `part`'s
        last round began: at a high rate a round per commit would make a feed entry, and a write to
        every subscriber it matches, every few milliseconds. Below that rate a round starts at once,
        unless the last one reached many subscriptions. Returns when this round begins."""
        gap, wide = self._gap.get(part, (self.round_gap, False))
        if wide or self._rate(part) >= PACED_RATE:
            time.sleep(max(0.0, self._began.get(part, 0.0) + gap - time.monotonic()))
        self._began[part] = began = time.monotonic()
        return began

    def _own_round(self, store: PipelineStore, part: int, token: int) -> int | None:
        """Subscription partitioning: the partition's next range, from its own progress to the head.
        With nothing new, a tick once its stateful subscriptions are due: the clock moves their
        windows even when nothing is published."""
        start = self._offsets.get(part)
        if start is None:
            start = self._offsets[part] = store.partition_offset(part)
        if self._head <= start:  # the wait for the log reads the head first: it returns at once if it moved
            if part not in self._due:
                self._due[part] = store.due()  # until its first round here says
            due = self._due[part]
            if due is not None and due <= time.time() * 1000 and self._ticked.get(part, 0) <= start:
                self._ticked[part] = store.append_tick()
            return start
        began = self._paced(part)
        head = self._head = store.head_offset()
        end = round_end(start, head, self.max_rows, self.max_matches, self._matches_per_entry(store, part))
        self._record(store, self.matcher.round(store, part, start, end), part, token, began)
        return None

    def _claimed_round(self, store: PipelineStore, part: int, token: int) -> int | None:
        """Publication partitioning: the next range no other partition has claimed (or the one this
        partition claimed and never recorded), matched while the others match theirs, recorded
        once the ranges before it are. If they are not soon, the range stays claimed and the task
        looks around: the partition that claimed them may need adopting."""
        claimed_to = self._claimed_to.get(part)
        if claimed_to is not None and self._head <= claimed_to and part not in self._waiting:
            return claimed_to  # nothing appended since all was claimed: no claim (a write) to try
        began = self._paced(part)
        rows = round_end(0, self.max_rows, self.max_rows, self.max_matches, self._matches_per_entry(store, part))
        start, end = store.claim_range(rows, part)
        if end <= start:
            self._claimed_to[part] = start
            return start  # everything up to `start` is claimed
        self._claimed_to.pop(part, None)
        done = self._waiting.pop(part, None)
        if done is None or (done.start, done.end) != (start, end):
            done = self.matcher.round(store, part, start, end)
        waited = time.monotonic() + ORDER_WAIT
        while store.partition_offset(0) < start:
            if time.monotonic() > waited:
                self._waiting[part] = done  # matching it again would also rebuild the state
                return 0  # tried again after a look around
            time.sleep(ORDER_POLL)
        self._record(store, done, part, token, began)
        return None

    def _matches_per_entry(self, store: PipelineStore, part: int) -> int:
        if part not in self._per_entry:
            self._per_entry[part] = store.matches_per_entry()
        return self._per_entry[part]

    def _rate(self, part: int) -> float:
        """Log entries a second that `part`'s rounds took in over the last RATE_WINDOW."""
        recent = self._recent.get(part)
        if not recent:
            return 0.0
        while recent and recent[0][0] < time.monotonic() - RATE_WINDOW:
            recent.popleft()
        return sum(entries for _, entries in recent) / RATE_WINDOW

    def _record(self, store: PipelineStore, done: Round, part: int, token: int, began: float) -> None:
        entries = done.end - (done.end if done.start is None else done.start)
        self._recent.setdefault(part, deque()).append((began, entries))
        took_ms = int((time.monotonic() - began) * 1000)
        if not store.record_round(done._replace(took_ms=took_ms, owner=(part, token))):
            # another task recorded past it, or owns the partition now: this worker's state of it
            # went where the round did, which the store did not take
            worker_state.discard(self.matcher.state_key(part))
            self._due.pop(part, None)  # read again from the store
            self._offsets.pop(part, None)
        else:
            self._offsets[part] = done.end
            self._due[part] = None if done.stateful is None else done.stateful.due
            if len(done.sub_nos) and entries > 0:
                self._per_entry[part] = -(-len(done.sub_nos) // entries)
        reached = distinct(np.asarray(done.sub_nos, np.int64))
        growth = min(GAP_GROWTH, max(1.0, reached / PACED_SUBSCRIPTIONS))
        self._gap[part] = (self.round_gap * growth, reached >= PACED_SUBSCRIPTIONS)
        trace.mark("recorded", done.start or 0, done.end)

    def _until_due(self) -> float:
        """Seconds until the held partitions' stateful subscriptions are next due (at least 0)."""
        due = min((self._due.get(part) or math.inf for part in self.held), default=math.inf)
        return max(0.0, due / 1000 - time.time())


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
