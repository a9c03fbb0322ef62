"""The match and authorize stages, inside executor tasks (mapInArrow over one matcher partition).

Each Python worker keeps the state of the partitions it served between micro-batches (the index,
who owns each subscription, the registry version compiled for authorization) and applies only the
log's changes. The state is taken out of the cache while a task uses it and put back tagged with the
offset it reflects; a task that finds no state at its start offset (another worker had the
partition, a retried or replayed batch) catches up from the store's subscription and registry
versions instead. Publications are matched and authorized under exactly the subscriptions and the
registry that preceded them in the log.

Top-k/w subscriptions (SPEC §5) are matched by the same index (their Boolean filter); the pairs it
finds for them, once authorized, go through their skybands in log order instead of being delivered,
and the log's times drive the windows (tick entries move the clock when nothing is published).
Their deliveries, the skybands that changed, the oldest publication still held and the next expiry
leave the task as one STATEFUL row, which the exit point records with the batch, atomically; a task
that had to rebuild its state reads the skybands back as of the processed offset.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator

import msgspec
import numpy as np
import orjson
import pyarrow as pa

from veil.matching import SubscriptionIndex, matches
from veil.matching.stored import decode_subscription
from veil.matching.topkw import NumericColumns, Skyband, TopKWSet, score, score_many
from veil.pipeline.authorize import Authorizer, user_number
from veil.pipeline.guard import FAULTS, attempt, isolate, rearm
from veil.pipeline.partition import partition_of
from veil.pipeline.source import KIND_MARK
from veil.pipeline.stores import store_for
from veil.protocol import flatten
from veil.security.registry import registry_from_json
from veil.store import KIND_PUBLICATION, KIND_REGISTRY, KIND_SUBSCRIBE, KIND_TICK, Quarantined, StatefulBatch

MATCH_SCHEMA = "offset LONG, sub_no LONG, copy BINARY"
_OUT_SCHEMA = pa.schema([("offset", pa.int64()), ("sub_no", pa.int64()), ("copy", pa.binary())])
MARK = -1  # the sub_no of a row that only carries how far the log was processed
STATEFUL = -2  # the sub_no of a row whose copy is the task's top-k/w output (see `encode_stateful`)
QUARANTINE = -3  # the sub_no of a row whose copy is an entry the task set aside (see `encode_quarantined`)
LATEST_DUE = 2**62  # ms: later expiries are reported as this one (msgpack and SQLite hold int64)
_FLUSH_ROWS = 65536
RUN_LIMIT = 4096  # publications matched per index call

_states: dict[tuple[str, int, int], tuple[_State, int]] = {}


def encode_stateful(batch: StatefulBatch) -> bytes:
    return msgspec.msgpack.encode(batch)


def encode_quarantined(entry: Quarantined) -> bytes:
    return msgspec.msgpack.encode(entry)


def decode_quarantined(blob: bytes) -> Quarantined:
    return Quarantined(*msgspec.msgpack.decode(blob))


def decode_stateful(blob: bytes) -> StatefulBatch:
    deliveries, initials, bands, held, due = msgspec.msgpack.decode(blob)
    return StatefulBatch(
        [tuple(d) for d in deliveries],
        [tuple(i) for i in initials],
        [tuple(b) for b in bands],
        held,
        due,  # type: ignore[misc]
    )


class _State:
    """What a matcher partition holds: its subscriptions, their owners, the registry in force."""

    def __init__(self, registry_body: bytes | None, with_authorization: bool) -> None:
        self.index = SubscriptionIndex()
        self.owners = np.full(1024, -1, np.int64)  # subscription number -> owner's user number
        self.with_authorization = with_authorization
        self.registry_body = registry_body
        self.authorizer = Authorizer(registry_from_json(registry_body), with_authorization)
        self.topk = TopKWSet()
        self.topk_numbers: dict[str, int] = {}  # id -> number of the top-k/w subscriptions
        self.is_topk = np.zeros(1024, bool)  # by subscription number
        self.crops: dict[int, dict[int, bytes]] = {}  # number -> publication -> cropped copy a skyband holds
        # set when applying a change failed half-way: the next batch rebuilds from the store instead
        self.suspect = False

    def add(self, sub_id: str, number: int, owner: str, body: bytes) -> None:
        predicates, topk = decode_subscription(body)  # before anything changes: a bad body changes nothing
        if number >= len(self.owners):
            size = max(number + 1, 2 * len(self.owners))
            self.owners = np.concatenate([self.owners, np.full(size - len(self.owners), -1, np.int64)])
            self.is_topk = np.concatenate([self.is_topk, np.zeros(size - len(self.is_topk), bool)])
        self.owners[number] = user_number(owner)
        self.remove(sub_id)
        self.index.add(sub_id, predicates, number)
        if topk is not None:
            self.topk.add(number, topk)
            self.topk_numbers[sub_id] = number
            self.is_topk[number] = True

    def remove(self, sub_id: str) -> None:
        self.index.remove(sub_id)
        number = self.topk_numbers.pop(sub_id, None)
        if number is not None:
            self.topk.remove(number)
            self.is_topk[number] = False
            self.crops.pop(number, None)

    def load_bands(self, store) -> None:  # type: ignore[no-untyped-def]
        """Put back the skybands saved with the last recorded batch."""
        for number, blob in store.topk_bands(list(self.topk_numbers.values())).items():
            band, crops = msgspec.msgpack.decode(blob)
            self.topk.restore(number, Skyband.restore(band))
            if crops:
                self.crops[number] = {int(pub): copy for pub, copy in crops.items()}
        self.topk.touched.clear()

    def stateful_output(
        self, deliveries: list[tuple[int, int, bytes | None]], initials: list[tuple[int, int, bytes | None]]
    ) -> StatefulBatch | None:
        """The batch's stateful output; the touched skybands are saved with their cropped copies."""
        if not deliveries and not initials and not self.topk_numbers and not self.topk.touched:
            return None
        bands: list[tuple[int, bytes | None]] = []
        for number in sorted(self.topk.touched):
            band = self.topk.bands.get(number)
            if band is None:
                bands.append((number, None))
                continue
            crops = self.crops.get(number, {})
            held = {pub: crops[pub] for pub in band.seqs if pub in crops}
            if len(held) < len(crops):
                self.crops[number] = held
            bands.append((number, msgspec.msgpack.encode([band.state(), held])))
        self.topk.touched.clear()
        due = self.topk.next_expiry()
        due = None if due is None else min(math.ceil(due), LATEST_DUE)
        return StatefulBatch(deliveries, initials, bands, self.topk.oldest_held(), due)

    def set_registry(self, body: bytes | None) -> None:
        if body != self.registry_body:  # compiling a large registry costs: only when it changed
            self.authorizer = Authorizer(registry_from_json(body), self.with_authorization)
            self.registry_body = body


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
        state: _State | None = None
        key: tuple[str, int, int] | None = None
        end = clock = 0
        changed = replaying = False
        run = _Run()
        out = _Output()
        for batch in batches:
            columns = batch.to_pydict()
            for part, offset, kind, sub_id, body, client, time, until in zip(
                columns["part"], columns["offset"], columns["kind"], columns["sub_id"], columns["body"],
                columns["client"], columns["time"], columns["until"], strict=True,
            ):  # fmt: skip
                clock = max(clock, time or 0)
                if kind == KIND_MARK:
                    key = (self.url, self.partitions, -1 if self.by_publication else part)
                    state, fresh = self._state_at(key, part, offset, out)
                    changed, end = changed or fresh, until
                    # a batch the exit point already recorded, replayed: its skybands were saved past it
                    replaying = fresh and store_for(self.url).processed_offset() != offset
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
                    self._apply(state, out, offset, kind, sub_id, client or "", body, clock)  # type: ignore[arg-type]
            if len(out) >= _FLUSH_ROWS:
                yield from out.take()
        if state is not None and key is not None:
            run.match(state, out, self.entry_timeout)
            out.expired(state, clock)
            if replaying:  # what it computed is dropped: rebuild from the store next time
                _states.pop(key, None)
            else:
                out.stateful_row(state)
                if state.suspect:  # a change failed half-way: the next batch rebuilds from the store
                    _states.pop(key, None)
                else:
                    _states[key] = (state, end)
            if changed:
                _settle()
            out.mark(end)
        yield from out.take()

    def _apply(
        self, state: _State, out: _Output, offset: int, kind: int, sub_id: str | None, client: str, body: bytes,
        clock: int,
    ) -> None:  # fmt: skip
        """A subscription or registry change; one that fails (or runs past the bound) is set aside and
        leaves the subscription out (the registry as it was)."""
        store = store_for(self.url)

        def change() -> None:
            if kind == KIND_REGISTRY:
                state.set_registry(body)
            elif kind == KIND_SUBSCRIBE:
                FAULTS.check(body)
                number = store.subscription_number(sub_id)  # type: ignore[arg-type]
                state.add(sub_id, number, client, body)  # type: ignore[arg-type]
                if not state.is_topk[number]:
                    out.initial(state, number, body, store.valid_at(offset, clock))
            else:
                state.remove(sub_id)  # type: ignore[arg-type]

        _, error = attempt(self.entry_timeout, change)
        if error is not None:
            state.suspect = True
            if kind == KIND_SUBSCRIBE:
                state.remove(sub_id)  # type: ignore[arg-type]
            out.quarantine(Quarantined(offset, kind, sub_id, client, error))

    def _state_at(self, key: tuple[str, int, int], part: int, start: int, out: _Output) -> tuple[_State, bool]:
        """The partition's state as of `start`, and whether it had to be built or caught up."""
        cached = _states.pop(key, None)
        if cached is not None and cached[1] == start:
            return cached[0], False
        store = store_for(self.url)

        def mine(sub_id: str) -> bool:
            return self.by_publication or partition_of(sub_id, self.partitions) == part

        if cached is not None and cached[1] < start:
            state = cached[0]
            dropped, added = store.subscription_changes(cached[1], start)
            for sub_id in dropped:
                state.remove(sub_id)
            state.set_registry(store.registry_at(start))
        else:
            state = _State(store.registry_at(start), self.with_authorization)
            added = store.subscriptions_at(start)
        for sub_id, number, owner, body in added:
            if mine(sub_id):
                _, error = attempt(self.entry_timeout, lambda: state.add(sub_id, number, owner, body))  # noqa: B023
                if error is not None:
                    state.remove(sub_id)
                    out.quarantine(Quarantined(0, KIND_SUBSCRIBE, sub_id, owner, error))
        state.load_bands(store)
        return state, True


def _settle() -> None:
    """PySpark's worker daemon runs a full `gc.collect()` after every task, and over an index of many
    thousands of Python objects that collection was most of a worker's CPU. Collect once when the
    index changed and move what survives (the index) out of the collector's sight."""
    gc.collect()
    gc.freeze()


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

    def _matched(self, state: _State, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
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
            part, self.bodies[lo:hi], self.publishers[lo:hi], pubs, state.owners[sub_nos]
        )
        return pubs + lo, sub_nos, keep, copies

    def match(self, state: _State, out: _Output, seconds: float = 0) -> None:
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
        self, state: _State, out: _Output, pubs: np.ndarray, sub_nos: np.ndarray, pairs: np.ndarray,
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

    def initial(self, state: _State, number: int, body: bytes, valid: list[tuple[int, bytes, str]]) -> None:
        """A new subscription's initial matches: the still-valid publications it matches and may see.
        They are older than the subscription and than all its other matches, so they queue as
        plain matches ahead of those."""
        if not valid:
            return
        predicates, _ = decode_subscription(body)
        documents = [flatten(orjson.loads(published)) for _, published, _ in valid]
        found = [i for i, document in enumerate(documents) if matches(predicates, document)]
        if not found:
            return
        positions = np.array(found, np.int64)
        owners = np.full(len(found), state.owners[number], np.int64)
        keep, copies = state.authorizer.filter(
            [documents[i] for i in found], [valid[i][1] for i in found], [valid[i][2] for i in found],
            np.arange(len(found), dtype=np.int64), owners,
        )  # fmt: skip
        crops = dict(copies)
        for pair in np.flatnonzero(keep).tolist():
            self.initials.append((number, valid[int(positions[pair])][0], crops.get(pair)))

    def expired(self, state: _State, now: int) -> None:
        """What the expiries up to `now` promote into the top k of their subscriptions."""
        for number, delivery in state.topk.advance(now):
            self.logged.append((number, delivery.seq, state.crops.get(number, {}).get(delivery.seq)))

    def stateful_row(self, state: _State) -> None:
        batch = state.stateful_output(self.logged, self.initials)
        if batch is not None:
            self._copies.append(
                pa.RecordBatch.from_arrays(
                    [
                        pa.array([0], pa.int64()),
                        pa.array([STATEFUL], pa.int64()),
                        pa.array([encode_stateful(batch)], pa.binary()),
                    ],
                    schema=_OUT_SCHEMA,
                )
            )
        self.logged = []

    def quarantine(self, entry: Quarantined) -> None:
        """An entry set aside: it leaves in a row of its own, for the exit point to record."""
        self._copies.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array([entry.offset], pa.int64()),
                    pa.array([QUARANTINE], pa.int64()),
                    pa.array([encode_quarantined(entry)], pa.binary()),
                ],
                schema=_OUT_SCHEMA,
            )
        )

    def __len__(self) -> int:
        return sum(len(chunk) for chunk in self.sub_nos)

    def mark(self, end: int) -> None:
        self.offsets.append(np.array([end], np.int64))
        self.sub_nos.append(np.array([MARK], np.int64))

    def copies(self, offsets: np.ndarray, sub_nos: np.ndarray, bodies: list[bytes]) -> None:
        """Matches that deliver a cropped copy: they travel with it."""
        self._copies.append(
            pa.RecordBatch.from_arrays([offsets, sub_nos, pa.array(bodies, pa.binary())], schema=_OUT_SCHEMA)
        )

    def take(self) -> list[pa.RecordBatch]:
        def joined(chunks: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(chunks) if chunks else np.empty(0, np.int64)

        sub_nos = joined(self.sub_nos)
        plain = pa.RecordBatch.from_arrays(
            [joined(self.offsets), sub_nos, pa.nulls(len(sub_nos), pa.binary())], schema=_OUT_SCHEMA
        )
        batches, self._copies = [plain, *self._copies], []
        self.offsets, self.sub_nos = [], []
        return batches
