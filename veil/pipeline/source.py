"""The event log as a Spark streaming source (PySpark Python data source).

Offsets are log positions, so Spark's checkpoint records exactly which entries a micro-batch
covered and a restarted query replays from there. `partitions(start, end)` is the partition stage:
each matcher partition gets every publication and registry change of the range and only the
subscription changes routed to it, preceded by a mark row carrying the range (see `rows`), which
lets the matcher check that its in-memory state is at `start` before applying the batch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from veil.monitoring import trace
from veil.pipeline.partition import partition_of
from veil.pipeline.rows import LOG_ARROW, LOG_SCHEMA, MARK
from veil.pipeline.store_handle import store_for
from veil.store import KIND_CANCEL, KIND_COPY, KIND_PUBLICATION, KIND_REGISTRY, KIND_TICK, PipelineStore

HEAD_POLL = 0.003  # seconds between looks at the log's head while waiting for a commit


class LogRange(InputPartition):
    """One matcher task's share of a micro-batch: the log range (start, end], of which it matches the
    publications in (low, high] and applies the subscription changes routed to it."""

    def __init__(self, part: int, partitions: int, start: int, end: int, low: int, high: int, by_publication: bool):
        super().__init__((part, start, end))
        self.part = part
        self.partitions = partitions
        self.start = start
        self.end = end
        self.low = low
        self.high = high
        self.by_publication = by_publication


class EventLogSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "veil_log"

    def schema(self) -> str:
        return LOG_SCHEMA

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return EventLogReader(self.options)


class EventLogReader(DataSourceStreamReader):
    def __init__(self, options: dict) -> None:
        self.url = options["store"]
        self.partitions_n = int(options.get("partitions", "1"))
        self.max_rows = int(options.get("maxRowsPerBatch", "50000"))
        self.max_matches = int(options.get("maxMatchesPerBatch", "2000000"))
        self.by_publication = options.get("partitionMode", "subscriptions") == "publications"
        self.wait = int(options.get("waitMs", "0")) / 1000

    def initialOffset(self) -> dict:
        # Without a checkpoint, resume after what the store says was already delivered.
        return {"offset": store_for(self.url).processed_offset()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """A batch's matches all pass through the driver on their way to the store: with a quarter of
        100,000 subscriptions matching each publication, a backlog of a few thousand publications
        is over a billion matches. So batches are sized by the matches per entry that the last
        batch with matches saw, as well as by the row limit."""
        store = store_for(self.url)
        head = self._head_after(store, start["offset"])
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else head - start["offset"]
        seen = store.matches_per_entry()
        if seen > 0:
            rows = min(rows, max(1, self.max_matches // seen))
        end = max(min(head, start["offset"] + rows), start["offset"])
        if end > start["offset"]:
            trace.mark("seen", start["offset"], end)
        return {"offset": end}

    def _head_after(self, store: PipelineStore, offset: int) -> int:
        """The log's head, waiting up to `waitMs` for it to move past `offset`: Spark asks again only
        at its next trigger, so the batch starts when a commit lands rather than up to a trigger
        interval later. Polled: a head read is a few microseconds of an index's last page, and the
        gateways that commit may be other processes or machines."""
        head = store.head_offset()
        deadline = time.monotonic() + self.wait
        while head <= offset and time.monotonic() < deadline:
            time.sleep(HEAD_POLL)
            head = store.head_offset()
        return head

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """Subscription partitioning: every task sees every publication and 1/N of the subscriptions.
        Publication partitioning: every task holds all subscriptions and matches 1/N of the range."""
        low, high, n = start["offset"], end["offset"], self.partitions_n
        if low >= high:
            return []
        if not self.by_publication:
            return [LogRange(p, n, low, high, low, high, False) for p in range(n)]
        cuts = [low + (high - low) * p // n for p in range(n + 1)]
        return [LogRange(p, n, low, high, cuts[p], cuts[p + 1], True) for p in range(n) if cuts[p] < cuts[p + 1]]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogRange)
        trace.mark("read", partition.start, partition.end)
        part, n = partition.part, partition.partitions
        offsets, kinds, sub_ids, numbers = [partition.start], [MARK], [None], [None]
        bodies, clients, times = [None], [None], [None]
        # the pipeline's own output (copies) and withdrawals are not its input
        for entry in store_for(self.url).log_range(partition.start, partition.end, (KIND_COPY, KIND_CANCEL)):
            if entry.kind == KIND_PUBLICATION:
                wanted = partition.low < entry.offset <= partition.high
            elif entry.kind in (KIND_REGISTRY, KIND_TICK):
                wanted = True
            else:
                wanted = partition.by_publication or partition_of(entry.sub_id, n) == part  # type: ignore[arg-type]
            if wanted:
                offsets.append(entry.offset)
                kinds.append(entry.kind)
                sub_ids.append(entry.sub_id)
                numbers.append(entry.number)
                bodies.append(entry.body)
                clients.append(entry.client)
                times.append(entry.time)
        until = [None] * len(offsets)
        until[0] = partition.end
        yield pa.RecordBatch.from_arrays(
            [pa.array([part] * len(offsets), pa.int32()), pa.array(offsets, pa.int64()),
             pa.array(kinds, pa.int32()), pa.array(sub_ids, pa.string()), pa.array(numbers, pa.int64()),
             pa.array(bodies, pa.binary()), pa.array(clients, pa.string()), pa.array(times, pa.int64()),
             pa.array(until, pa.int64())],
            schema=LOG_ARROW,
        )  # fmt: skip
