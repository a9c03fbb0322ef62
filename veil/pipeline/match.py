"""The match stage, inside executor tasks (mapInArrow over one matcher partition).

Each Python worker keeps the index of the partitions it served between micro-batches and applies only
the log's changes. The index is taken out of the cache while a task uses it and put back tagged with
the offset it reflects; a task that finds no index at its start offset (another worker had the
partition, a retried or replayed batch) catches up from the store's subscription versions instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pyarrow as pa

from veil.matching import Predicate, SubscriptionIndex
from veil.pipeline.partition import partition_of
from veil.pipeline.source import KIND_MARK
from veil.pipeline.stores import store_for
from veil.protocol import flatten
from veil.store import KIND_PUBLICATION, KIND_SUBSCRIBE

MATCH_SCHEMA = "offset LONG, sub_id STRING"
_OUT_SCHEMA = pa.schema([("offset", pa.int64()), ("sub_id", pa.string())])
_FLUSH_ROWS = 65536

_indexes: dict[tuple[str, int, int], tuple[SubscriptionIndex, int]] = {}


def decode_subscription(body: bytes) -> list[Predicate]:
    return [Predicate(*p) for p in orjson.loads(body)]


class MatchPartition:
    """Picklable task function; the `until` mark rows of its output tell the exit point how far the
    log was processed."""

    def __init__(self, url: str, partitions: int) -> None:
        self.url = url
        self.partitions = partitions

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        index: SubscriptionIndex | None = None
        key: tuple[str, int, int] | None = None
        end = 0
        offsets: list[int] = []
        subs: list[str | None] = []
        for batch in batches:
            columns = batch.to_pydict()
            for part, offset, kind, sub_id, body, until in zip(
                columns["part"], columns["offset"], columns["kind"], columns["sub_id"], columns["body"],
                columns["until"], strict=True,
            ):  # fmt: skip
                if kind == KIND_MARK:
                    key = (self.url, self.partitions, part)
                    index, end = self._index_at(key, part, offset), until
                elif kind == KIND_PUBLICATION:
                    for match in index.match(flatten(orjson.loads(body))):  # type: ignore[union-attr]
                        offsets.append(offset)
                        subs.append(match)
                elif kind == KIND_SUBSCRIBE:
                    index.add(sub_id, decode_subscription(body))  # type: ignore[union-attr]
                else:
                    index.remove(sub_id)  # type: ignore[union-attr]
            if len(offsets) >= _FLUSH_ROWS:
                yield _batch(offsets, subs)
                offsets, subs = [], []
        if index is not None and key is not None:
            _indexes[key] = (index, end)
            offsets.append(end)
            subs.append(None)
        yield _batch(offsets, subs)

    def _index_at(self, key: tuple[str, int, int], part: int, start: int) -> SubscriptionIndex:
        cached = _indexes.pop(key, None)
        if cached is not None and cached[1] == start:
            return cached[0]
        store = store_for(self.url)
        mine = lambda sub_id: partition_of(sub_id, self.partitions) == part  # noqa: E731
        if cached is not None and cached[1] < start:
            index = cached[0]
            dropped, added = store.subscription_changes(cached[1], start)
            for sub_id in dropped:
                index.remove(sub_id)
        else:
            index = SubscriptionIndex()
            added = store.subscriptions_at(start)
        for sub_id, body in added:
            if mine(sub_id):
                index.add(sub_id, decode_subscription(body))
        return index


def _batch(offsets: list[int], subs: list[str | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(offsets, pa.int64()), pa.array(subs, pa.string())], schema=_OUT_SCHEMA)
