"""The match and authorize stages, inside executor tasks (mapInArrow over one matcher partition).

Each task takes its partition's state from the worker's cache as of its batch's start and applies
only the log's changes (the contract is `worker_state`'s), so publications are matched and
authorized under exactly the subscriptions and the registry that preceded them in the log.

Top-k/w subscriptions (SPEC §5) are matched by the same index (their Boolean filter); the pairs it
finds for them, once authorized, go through their skybands in log order instead of being delivered,
and the log's times drive the windows (tick entries move the clock when nothing is published).
Their deliveries, the skybands that changed, the oldest publication still held and the next expiry
leave the task as one STATEFUL row (`rows`), which the exit point records with the batch,
atomically; a task that had to rebuild its state reads the skybands back as of the processed offset.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import orjson
import pyarrow as pa

from veil.matching import matches
from veil.matching.stored import decode_subscription
from veil.matching.topkw import NumericColumns, score, score_many
from veil.monitoring import trace
from veil.pipeline import worker_state
from veil.pipeline.guard import FAULTS, attempt, isolate, rearm
from veil.pipeline.partition import partition_of
from veil.pipeline.rows import MARK, MATCH_ARROW, QUARANTINE, STATEFUL, encode_quarantined, encode_stateful, marker
from veil.pipeline.store_handle import store_for
from veil.pipeline.worker_state import State
from veil.protocol import flatten
from veil.store import KIND_PUBLICATION, KIND_REGISTRY, KIND_SUBSCRIBE, KIND_TICK, LogEntry, Quarantined

_FLUSH_ROWS = 65536
RUN_LIMIT = 4096  # publications matched per index call


class MatchPartition:
    """Picklable task function; the `until` mark rows of its output tell the exit point how far the
    log was processed."""

    def __init__(
        self, url: str, partitions: int, by_publication: bool, with_authorization: bool = True,
        entry_timeout: float = 60.0,
    ) -> None:  # fmt: skip
        self.url = url
        self.partitions = partitions
        self.by_publication = by_publication
        self.with_authorization = with_authorization
        self.entry_timeout = entry_timeout  # seconds one log entry may take before it is set aside

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        state: State | None = None
        key: worker_state.Key | None = None
        begin = end = clock = 0
        changed = replaying = False
        run = _Run()
        out = _Output()
        for batch in batches:
            columns = batch.to_pydict()
            for part, offset, kind, sub_id, number, body, client, time, until in zip(
                columns["part"], columns["offset"], columns["kind"], columns["sub_id"], columns["number"],
                columns["body"], columns["client"], columns["time"], columns["until"], strict=True,
            ):  # fmt: skip
                clock = max(clock, time or 0)
                if kind == MARK:
                    trace.mark("task", offset, until)
                    key = (self.url, self.partitions, part)
                    state, fresh, failed = worker_state.checkout(
                        key, offset, store_for(self.url), self._routed_here(part), self.with_authorization,
                        self.entry_timeout,
                    )  # fmt: skip
                    for entry in failed:
                        out.quarantine(entry)
                    changed, begin, end = changed or fresh, offset, until
                    # a round already recorded, replayed: its skybands were saved past it
                    progress = 0 if self.by_publication else part  # the progress row its rounds record
                    replaying = fresh and store_for(self.url).partition_offset(progress) > offset
                elif kind == KIND_PUBLICATION:
                    run.add(offset, body, client or "", clock)
                    if len(run) >= RUN_LIMIT:
                        run.match(state, out, self.entry_timeout)  # type: ignore[arg-type]
                else:
                    # publications before a change are matched and authorized before it applies
                    run.match(state, out, self.entry_timeout)  # type: ignore[arg-type]
                    if kind == KIND_TICK:
                        out.expired(state, clock)  # type: ignore[arg-type]
                        continue
                    changed = True
                    self._apply(state, out, LogEntry(offset, kind, sub_id, body, client or "", clock, number))
            if len(out) >= _FLUSH_ROWS:
                yield from out.take()
        if state is not None and key is not None:
            run.match(state, out, self.entry_timeout)
            out.expired(state, clock)
            if replaying:  # what it computed is dropped: rebuild from the store next time
                worker_state.discard(key)
            else:
                out.stateful_row(state)
                if state.suspect:  # a change failed half-way: the next batch rebuilds from the store
                    worker_state.discard(key)
                else:
                    worker_state.checkin(key, state, end)
            if changed:
                worker_state.settle()
            out.mark(end)
            trace.mark("matched", begin, end)
        yield from out.take()

    def _routed_here(self, part: int) -> Callable[[str], bool]:
        """Whether a subscription id is held by partition `part`."""
        return lambda sub_id: self.by_publication or partition_of(sub_id, self.partitions) == part

    def _apply(self, state: State, out: _Output, entry: LogEntry) -> None:
        """A subscription or registry change (`entry.time`: the clock of the log at it); one that fails
        (or runs past the bound) is set aside and leaves the subscription out (the registry as it was)."""
        kind, sub_id, body = entry.kind, entry.sub_id, entry.body

        def change() -> None:
            if kind == KIND_REGISTRY:
                state.set_registry(body)
            elif kind == KIND_SUBSCRIBE:
                FAULTS.check(body)
                number: int = entry.number  # type: ignore[assignment]
                state.add(sub_id, number, entry.client, body)  # type: ignore[arg-type]
                if not state.is_topk[number]:
                    out.initial(state, number, body, store_for(self.url).valid_at(entry.offset, entry.time))  # type: ignore[arg-type]
            else:
                state.remove(sub_id)  # type: ignore[arg-type]

        _, error = attempt(self.entry_timeout, change)
        if error is not None:
            state.suspect = True
            if kind == KIND_SUBSCRIBE:
                state.remove(sub_id)  # type: ignore[arg-type]
            out.quarantine(Quarantined(entry.offset, kind, sub_id, entry.client, error))


class _Run:
    """Consecutive publications with no subscription or registry change between them: matched and
    authorized as one batch."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.documents: list[dict | None] = []  # parsed on first use, inside the guard
        self.bodies: list[bytes] = []
        self.publishers: list[str] = []
        self.times: list[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, body: bytes, publisher: str, time: int) -> None:
        self.offsets.append(offset)
        self.documents.append(None)
        self.bodies.append(body)
        self.publishers.append(publisher)
        self.times.append(time)

    def _matched(self, state: State, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
        """Match and authorize publications [lo, hi): (publication positions, subscription numbers, which
        pairs are kept, cropped copies by pair position). Nothing outside the return value changes
        but the parsed documents, so a failed attempt can be retried on a part of the range."""
        documents = self.documents
        for i in range(lo, hi):
            if documents[i] is None:
                FAULTS.check(self.bodies[i])
                documents[i] = flatten(orjson.loads(self.bodies[i]))
        part: list[dict] = documents[lo:hi]  # type: ignore[assignment]
        pubs, slots = state.index.match_pairs(part)
        sub_nos = state.index.numbers(slots)
        keep, copies = state.authorizer.filter(
            part, self.bodies[lo:hi], self.publishers[lo:hi], pubs, state.owners[sub_nos], state.scopes[sub_nos],
            state.admitted[sub_nos],
        )  # fmt: skip
        return pubs + lo, sub_nos, keep, copies

    def match(self, state: State, out: _Output, seconds: float = 0) -> None:
        if not self.offsets:
            return
        pieces, failed = isolate(0, len(self.offsets), seconds, lambda lo, hi: self._matched(state, lo, hi))
        for position, error in failed:
            offset, publisher = self.offsets[position], self.publishers[position]
            out.quarantine(Quarantined(offset, KIND_PUBLICATION, None, publisher, error))
        if pieces:
            pubs = np.concatenate([piece[0] for _, _, piece in pieces])
            sub_nos = np.concatenate([piece[1] for _, _, piece in pieces])
            keep = np.concatenate([piece[2] for _, _, piece in pieces])
            crops: dict[int, bytes] = {}
            shift = 0
            for _, _, piece in pieces:
                crops.update((pair + shift, copy) for pair, copy in piece[3])
                shift += len(piece[0])
            offsets = np.asarray(self.offsets, np.int64)
            if state.topk_numbers:
                ranked = state.is_topk[sub_nos]
                self._rank(state, out, pubs, sub_nos, np.flatnonzero(ranked & keep), crops, seconds)
                keep &= ~ranked
                crops = {pair: copy for pair, copy in crops.items() if not ranked[pair]}
            if crops:
                cropped = np.fromiter(crops, np.int64, len(crops))
                out.copies(offsets[pubs[cropped]], sub_nos[cropped], list(crops.values()))
                keep[cropped] = False
            out.offsets.append(offsets[pubs[keep]])
            out.sub_nos.append(sub_nos[keep])
        self.offsets, self.documents, self.bodies, self.publishers, self.times = [], [], [], [], []

    def _rank(
        self, state: State, out: _Output, pubs: np.ndarray, sub_nos: np.ndarray, pairs: np.ndarray,
        crops: dict[int, bytes], seconds: float,
    ) -> None:  # fmt: skip
        """Authorized matches of top-k/w subscriptions through their skybands, each subscription's
        in log order; a cropped copy is ranked on what its subscriber would see, and kept while the
        skyband holds it. A subscription whose ranking fails (or runs past the bound) is set aside."""
        pairs = pairs[np.argsort(sub_nos[pairs] * len(self.offsets) + pubs[pairs])]  # each pair once
        numbers = sub_nos[pairs]
        columns = NumericColumns([document or {} for document in self.documents])
        bounds = np.flatnonzero(np.diff(numbers)) + 1
        all_offsets, all_times = np.asarray(self.offsets, np.int64), np.asarray(self.times, np.int64)

        def rank(mine: np.ndarray) -> list[tuple[int, int, bytes | None]]:
            number = int(sub_nos[mine[0]])
            positions = pubs[mine]
            terms = state.topk.specs[number].terms
            scores = score_many(terms, columns, positions)
            offsets = all_offsets[positions].tolist()
            for i, pair in enumerate(mine.tolist() if crops else ()):
                copy = crops.get(pair)
                if copy is not None:
                    ranked = score(terms, flatten(orjson.loads(copy)))
                    scores[i] = math.nan if ranked is None else ranked
                    state.crops.setdefault(number, {})[offsets[i]] = copy
            times = all_times[positions].tolist()
            kept = state.crops.get(number, {})
            return [
                (number, delivery.seq, kept.get(delivery.seq))
                for delivery in state.topk.arrive_many(number, offsets, times, scores)
            ]

        groups = np.split(pairs, bounds) if len(pairs) else []
        done = 0

        def rest() -> None:
            nonlocal done
            for mine in groups[done:]:
                rearm()  # each subscription has the bound to itself
                out.logged.extend(rank(mine))
                done += 1

        while done < len(groups):
            _, error = attempt(seconds, rest)
            if error is None or done >= len(groups):
                break
            number = int(sub_nos[groups[done][0]])  # the subscription that failed: set aside, the rest go on
            sub_id = next(sub_id for sub_id, n in state.topk_numbers.items() if n == number)
            state.remove(sub_id)
            out.quarantine(Quarantined(0, KIND_SUBSCRIBE, sub_id, None, error))
            done += 1


class _Output:
    """A task's output: plain matches as columns, cropped copies beside them; top-k/w deliveries
    (`logged`) and initial matches, which leave in one STATEFUL row."""

    def __init__(self) -> None:
        self.offsets: list[np.ndarray] = []
        self.sub_nos: list[np.ndarray] = []
        self._copies: list[pa.RecordBatch] = []
        self.logged: list[tuple[int, int, bytes | None]] = []  # (number, publication, cropped copy)
        self.initials: list[tuple[int, int, bytes | None]] = []  # (number, publication, cropped copy)

    def initial(self, state: State, number: int, body: bytes, valid: list[tuple[int, bytes, str]]) -> None:
        """A new subscription's initial matches: the still-valid publications it matches and may see.
        They are older than the subscription and than all its other matches, so they queue as
        plain matches ahead of those."""
        if not valid:
            return
        predicates = decode_subscription(body).predicates
        documents = [flatten(orjson.loads(published)) for _, published, _ in valid]
        found = [i for i, document in enumerate(documents) if matches(predicates, document)]
        if not found:
            return
        positions = np.array(found, np.int64)

        def each(column: np.ndarray) -> np.ndarray:
            return np.full(len(found), column[number], column.dtype)

        keep, copies = state.authorizer.filter(
            [documents[i] for i in found], [valid[i][1] for i in found], [valid[i][2] for i in found],
            np.arange(len(found), dtype=np.int64), each(state.owners), each(state.scopes), each(state.admitted),
        )  # fmt: skip
        crops = dict(copies)
        for pair in np.flatnonzero(keep).tolist():
            self.initials.append((number, valid[int(positions[pair])][0], crops.get(pair)))

    def expired(self, state: State, now: int) -> None:
        """What the expiries up to `now` promote into the top k of their subscriptions."""
        for number, delivery in state.topk.advance(now):
            self.logged.append((number, delivery.seq, state.crops.get(number, {}).get(delivery.seq)))

    def stateful_row(self, state: State) -> None:
        batch = state.stateful_output(self.logged, self.initials)
        if batch is not None:
            self._copies.append(marker(STATEFUL, 0, encode_stateful(batch)))
        self.logged = []

    def quarantine(self, entry: Quarantined) -> None:
        """An entry set aside: it leaves in a row of its own, for the exit point to record."""
        self._copies.append(marker(QUARANTINE, entry.offset, encode_quarantined(entry)))

    def __len__(self) -> int:
        return sum(len(chunk) for chunk in self.sub_nos)

    def mark(self, end: int) -> None:
        self.offsets.append(np.array([end], np.int64))
        self.sub_nos.append(np.array([MARK], np.int64))

    def copies(self, offsets: np.ndarray, sub_nos: np.ndarray, bodies: list[bytes]) -> None:
        """Matches that deliver a cropped copy: they travel with it."""
        self._copies.append(
            pa.RecordBatch.from_arrays([offsets, sub_nos, pa.array(bodies, pa.binary())], schema=MATCH_ARROW)
        )

    def take(self) -> list[pa.RecordBatch]:
        def joined(chunks: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(chunks) if chunks else np.empty(0, np.int64)

        sub_nos = joined(self.sub_nos)
        plain = pa.RecordBatch.from_arrays(
            [joined(self.offsets), sub_nos, pa.nulls(len(sub_nos), pa.binary())], schema=MATCH_ARROW
        )
        batches, self._copies = [plain, *self._copies], []
        self.offsets, self.sub_nos = [], []
        return batches
