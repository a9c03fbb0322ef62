"""The match and authorize stages, inside executor tasks (mapInArrow over one matcher partition).

Each Python worker keeps the state of the partitions it served between micro-batches (the index,
who owns each subscription, the registry version compiled for authorization) and applies only the
log's changes. The state is taken out of the cache while a task uses it and put back tagged with the
offset it reflects; a task that finds no state at its start offset (another worker had the
partition, a retried or replayed batch) catches up from the store's subscription and registry
versions instead. Publications are matched and authorized under exactly the subscriptions and the
registry that preceded them in the log.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import orjson
import pyarrow as pa

from veil.matching import Predicate, SubscriptionIndex
from veil.pipeline.authorize import Authorizer, user_number
from veil.pipeline.partition import partition_of
from veil.pipeline.source import KIND_MARK
from veil.pipeline.stores import store_for
from veil.protocol import flatten
from veil.security.registry import registry_from_json
from veil.store import KIND_PUBLICATION, KIND_REGISTRY, KIND_SUBSCRIBE

MATCH_SCHEMA = "offset LONG, sub_no LONG, copy BINARY"
_OUT_SCHEMA = pa.schema([("offset", pa.int64()), ("sub_no", pa.int64()), ("copy", pa.binary())])
MARK = -1  # the sub_no of a row that only carries how far the log was processed
_FLUSH_ROWS = 65536
RUN_LIMIT = 4096  # publications matched per index call

_states: dict[tuple[str, int, int], tuple[_State, int]] = {}


def decode_subscription(body: bytes) -> list[Predicate]:
    return [Predicate(*p) for p in orjson.loads(body)]


class _State:
    """What a matcher partition holds: its subscriptions, their owners, the registry in force."""

    def __init__(self, registry_body: bytes | None, with_authorization: bool) -> None:
        self.index = SubscriptionIndex()
        self.owners = np.full(1024, -1, np.int64)  # subscription number -> owner's user number
        self.with_authorization = with_authorization
        self.registry_body = registry_body
        self.authorizer = Authorizer(registry_from_json(registry_body), with_authorization)

    def add(self, sub_id: str, number: int, owner: str, body: bytes) -> None:
        if number >= len(self.owners):
            grown = np.full(max(number + 1, 2 * len(self.owners)), -1, np.int64)
            grown[: len(self.owners)] = self.owners
            self.owners = grown
        self.owners[number] = user_number(owner)
        self.index.add(sub_id, decode_subscription(body), number)

    def set_registry(self, body: bytes | None) -> None:
        if body != self.registry_body:  # compiling a large registry costs: only when it changed
            self.authorizer = Authorizer(registry_from_json(body), self.with_authorization)
            self.registry_body = body


class MatchPartition:
    """Picklable task function; the `until` mark rows of its output tell the exit point how far the
    log was processed."""

    def __init__(self, url: str, partitions: int, by_publication: bool, with_authorization: bool = True) -> None:
        self.url = url
        self.partitions = partitions
        self.by_publication = by_publication
        self.with_authorization = with_authorization

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        state: _State | None = None
        key: tuple[str, int, int] | None = None
        end = 0
        changed = False
        run = _Run()
        out = _Output()
        for batch in batches:
            columns = batch.to_pydict()
            for part, offset, kind, sub_id, body, client, until in zip(
                columns["part"], columns["offset"], columns["kind"], columns["sub_id"], columns["body"],
                columns["client"], columns["until"], strict=True,
            ):  # fmt: skip
                if kind == KIND_MARK:
                    key = (self.url, self.partitions, -1 if self.by_publication else part)
                    state, fresh = self._state_at(key, part, offset)
                    changed, end = changed or fresh, until
                elif kind == KIND_PUBLICATION:
                    run.add(offset, body, client or "")
                    if len(run) >= RUN_LIMIT:
                        run.match(state, out)  # type: ignore[arg-type]
                else:
                    # publications before a change are matched and authorized before it applies
                    run.match(state, out)  # type: ignore[arg-type]
                    changed = True
                    if kind == KIND_REGISTRY:
                        state.set_registry(body)  # type: ignore[union-attr]
                    elif kind == KIND_SUBSCRIBE:
                        number = store_for(self.url).subscription_number(sub_id)
                        state.add(sub_id, number, client or "", body)  # type: ignore[union-attr, arg-type]
                    else:
                        state.index.remove(sub_id)  # type: ignore[union-attr]
            if len(out) >= _FLUSH_ROWS:
                yield from out.take()
        if state is not None and key is not None:
            run.match(state, out)
            _states[key] = (state, end)
            if changed:
                _settle()
            out.mark(end)
        yield from out.take()

    def _state_at(self, key: tuple[str, int, int], part: int, start: int) -> tuple[_State, bool]:
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
                state.index.remove(sub_id)
            state.set_registry(store.registry_at(start))
        else:
            state = _State(store.registry_at(start), self.with_authorization)
            added = store.subscriptions_at(start)
        for sub_id, number, owner, body in added:
            if mine(sub_id):
                state.add(sub_id, number, owner, body)
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
        self.documents: list[dict] = []
        self.bodies: list[bytes] = []
        self.publishers: list[str] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, body: bytes, publisher: str) -> None:
        self.offsets.append(offset)
        self.documents.append(flatten(orjson.loads(body)))
        self.bodies.append(body)
        self.publishers.append(publisher)

    def match(self, state: _State, out: _Output) -> None:
        if self.offsets:
            pubs, slots = state.index.match_pairs(self.documents)
            sub_nos = state.index.numbers(slots)
            keep, copies = state.authorizer.filter(
                self.documents, self.bodies, self.publishers, pubs, state.owners[sub_nos]
            )
            offsets = np.asarray(self.offsets, np.int64)
            if copies:
                cropped = np.array([pair for pair, _ in copies], np.int64)
                out.copies(offsets[pubs[cropped]], sub_nos[cropped], [copy for _, copy in copies])
                keep[cropped] = False
            out.offsets.append(offsets[pubs[keep]])
            out.sub_nos.append(sub_nos[keep])
            self.offsets, self.documents, self.bodies, self.publishers = [], [], [], []


class _Output:
    def __init__(self) -> None:
        self.offsets: list[np.ndarray] = []
        self.sub_nos: list[np.ndarray] = []
        self._copies: list[pa.RecordBatch] = []

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
