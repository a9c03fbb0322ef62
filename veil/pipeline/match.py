"""The match stage, inside executor tasks (mapInArrow over one matcher partition).

Each Python worker keeps the index of the partitions it served between micro-batches and applies only
the log's changes. The index is taken out of the cache while a task uses it and put back tagged with
the offset it reflects; a task that finds no index at its start offset (another worker had the
partition, a retried or replayed batch) catches up from the store's subscription versions instead.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import orjson
import pyarrow as pa

from veil.matching import Predicate, SubscriptionIndex
from veil.pipeline.partition import partition_of
from veil.pipeline.source import KIND_MARK
from veil.pipeline.stores import store_for
from veil.protocol import flatten
from veil.store import KIND_PUBLICATION, KIND_SUBSCRIBE

MATCH_SCHEMA = "offset LONG, sub_no LONG"
_OUT_SCHEMA = pa.schema([("offset", pa.int64()), ("sub_no", pa.int64())])
MARK = -1  # the sub_no of a row that only carries how far the log was processed
_FLUSH_ROWS = 65536
RUN_LIMIT = 4096  # publications matched per index call

_indexes: dict[tuple[str, int, int], tuple[SubscriptionIndex, int]] = {}


def decode_subscription(body: bytes) -> list[Predicate]:
    return [Predicate(*p) for p in orjson.loads(body)]


class MatchPartition:
    """Picklable task function; the `until` mark rows of its output tell the exit point how far the
    log was processed."""

    def __init__(self, url: str, partitions: int, by_publication: bool) -> None:
        self.url = url
        self.partitions = partitions
        self.by_publication = by_publication

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        index: SubscriptionIndex | None = None
        key: tuple[str, int, int] | None = None
        end = 0
        changed = False
        run = _Run()
        out = _Output()
        for batch in batches:
            columns = batch.to_pydict()
            for part, offset, kind, sub_id, body, until in zip(
                columns["part"], columns["offset"], columns["kind"], columns["sub_id"], columns["body"],
                columns["until"], strict=True,
            ):  # fmt: skip
                if kind == KIND_MARK:
                    key = (self.url, self.partitions, -1 if self.by_publication else part)
                    index, fresh = self._index_at(key, part, offset)
                    changed, end = changed or fresh, until
                elif kind == KIND_PUBLICATION:
                    run.add(offset, body)
                    if len(run) >= RUN_LIMIT:
                        run.match(index, out)  # type: ignore[arg-type]
                else:
                    # publications before a subscription change are matched before it applies
                    run.match(index, out)  # type: ignore[arg-type]
                    changed = True
                    if kind == KIND_SUBSCRIBE:
                        number = store_for(self.url).subscription_number(sub_id)
                        index.add(sub_id, decode_subscription(body), number)  # type: ignore[union-attr]
                    else:
                        index.remove(sub_id)  # type: ignore[union-attr]
            if len(out) >= _FLUSH_ROWS:
                yield out.take()
        if index is not None and key is not None:
            run.match(index, out)
            _indexes[key] = (index, end)
            if changed:
                _settle()
            out.mark(end)
        yield out.take()

    def _index_at(self, key: tuple[str, int, int], part: int, start: int) -> tuple[SubscriptionIndex, bool]:
        """The partition's index as of `start`, and whether it had to be built or caught up."""
        cached = _indexes.pop(key, None)
        if cached is not None and cached[1] == start:
            return cached[0], False
        store = store_for(self.url)

        def mine(sub_id: str) -> bool:
            return self.by_publication or partition_of(sub_id, self.partitions) == part

        if cached is not None and cached[1] < start:
            index = cached[0]
            dropped, added = store.subscription_changes(cached[1], start)
            for sub_id in dropped:
                index.remove(sub_id)
        else:
            index = SubscriptionIndex()
            added = store.subscriptions_at(start)
        for sub_id, number, body in added:
            if mine(sub_id):
                index.add(sub_id, decode_subscription(body), number)
        return index, True


def _settle() -> None:
    """PySpark's worker daemon runs a full `gc.collect()` after every task, and over an index of many
    thousands of Python objects that collection was most of a worker's CPU. Collect once when the
    index changed and move what survives (the index) out of the collector's sight."""
    gc.collect()
    gc.freeze()


class _Run:
    """Consecutive publications with no subscription change between them: matched as one batch."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.documents: list[dict] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, body: bytes) -> None:
        self.offsets.append(offset)
        self.documents.append(flatten(orjson.loads(body)))

    def match(self, index: SubscriptionIndex, out: _Output) -> None:
        if self.offsets:
            pubs, slots = index.match_pairs(self.documents)
            out.offsets.append(np.asarray(self.offsets, np.int64)[pubs])
            out.sub_nos.append(index.numbers(slots))
            self.offsets, self.documents = [], []


class _Output:
    def __init__(self) -> None:
        self.offsets: list[np.ndarray] = []
        self.sub_nos: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(chunk) for chunk in self.sub_nos)

    def mark(self, end: int) -> None:
        self.offsets.append(np.array([end], np.int64))
        self.sub_nos.append(np.array([MARK], np.int64))

    def take(self) -> pa.RecordBatch:
        def joined(chunks: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(chunks) if chunks else np.empty(0, np.int64)

        batch = pa.RecordBatch.from_arrays([joined(self.offsets), joined(self.sub_nos)], schema=_OUT_SCHEMA)
        self.offsets, self.sub_nos = [], []
        return batch
