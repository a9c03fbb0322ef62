"""The `micro-batch` trigger: a pipeline Spark owns, from the log's offsets to the recorded rounds.

The source's offsets are log positions: each micro-batch is a range of the log, planned by Spark,
written to its offset log and committed when recorded, so Spark's progress metrics (input rows,
batch durations) mean what they say. The plan has no shuffle:

1. `LogRanges`: one row per matcher partition, the part of the batch's range it matches (every
   partition the whole range with subscription partitioning; consecutive slices of it with
   publication partitioning);
2. `mapInArrow(MatchRanges)`: in the executors, each matcher partition's round over its range, by
   the same round core as the `rounds` trigger (`Matcher`), out as one row carrying the `Round`;
3. `foreachBatch(RecordRounds)`: on the driver, each round recorded by the store with the same
   compare-and-set as the `rounds` trigger, in log order, so a batch Spark replays (after a
   failure between recording and its commit) delivers nothing twice.

Every batch pays Spark's fixed cost (planning, the offset and commit logs, two stages of Python
workers), which is why `rounds` is the default; this trigger serves where Spark should own the
batches: its retries, its metrics, a cluster's dynamic allocation (an idle executor runs nothing).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit

from veil.monitoring import trace
from veil.pipeline.matcher import Matcher
from veil.pipeline.partition_task import BEAT, round_end
from veil.pipeline.store_handle import store_for
from veil.store import PipelineStore, Quarantined, Round, StatefulBatch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RANGES_SCHEMA = "part INT, start LONG, end LONG"
ROUNDS_SCHEMA = "part INT, round BINARY"
_ROUNDS_ARROW = pa.schema([("part", pa.int32()), ("round", pa.binary())])

# A Round on its way from an executor to the driver: (part, start, end, sub_nos, pubs, copies,
# stateful, quarantined, took_ms, built), the matches as the raw bytes of int64 arrays
_Wire = tuple[
    int, int, int, bytes, bytes, list[tuple[int, int, bytes]], StatefulBatch | None, list[Quarantined], int | None,
    bool,
]
_decoder = msgspec.msgpack.Decoder(_Wire)


def encode_round(done: Round) -> bytes:
    return msgspec.msgpack.encode(
        (
            done.part, done.start or 0, done.end, np.asarray(done.sub_nos, np.int64).tobytes(),
            np.asarray(done.pubs, np.int64).tobytes(), list(done.copies), done.stateful, list(done.quarantined),
            done.took_ms, done.built,
        )
    )  # fmt: skip


def decode_round(blob: bytes) -> Round:
    part, start, end, sub_nos, pubs, copies, stateful, quarantined, took_ms, built = _decoder.decode(blob)
    return Round(
        np.frombuffer(sub_nos, np.int64), np.frombuffer(pubs, np.int64), end, copies, stateful, quarantined,
        part, took_ms, start, built=built,
    )  # fmt: skip


class Range(InputPartition):
    """Matcher partition `part`'s share of a batch: the log range (start, end]."""

    def __init__(self, part: int, start: int, end: int) -> None:
        super().__init__(part)
        self.part, self.start, self.end = part, start, end


class LogRanges(DataSource):
    @classmethod
    def name(cls) -> str:
        return "veil_log_ranges"

    def schema(self) -> str:
        return RANGES_SCHEMA

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return RangeReader(self.options)


class RangeReader(DataSourceStreamReader):
    """Offsets are log positions; a batch is at most `maxRowsPerRound` entries (fewer after rounds
    with many matches per entry, as in the `rounds` trigger)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.url = options["store"]
        self.partitions_n = int(options.get("partitions", "1"))
        self.by_publication = options.get("partitionMode", "subscriptions") == "publications"
        self.max_rows = int(options.get("maxRowsPerRound", "50000"))
        self.max_matches = int(options.get("maxMatchesPerRound", "2000000"))
        self._beaten = 0.0
        self._ticked = 0  # the tick last logged for stateful subscriptions that were due

    @property
    def store(self) -> PipelineStore:
        return store_for(self.url)

    def initialOffset(self) -> dict:
        """Where the store's progress is: a query started on a store others matched before (or with
        a checkpoint lost) begins there, not at the log's start."""
        return {"offset": self.store.processed_offset()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The next batch's end: from the store's progress, if it is past Spark's (a checkpoint
        older than the store: the entries between were matched by the other trigger). With nothing
        new, a tick once stateful subscriptions are due: the clock moves their windows even when
        nothing is published."""
        store = self.store
        begin = max(start["offset"], store.processed_offset())
        head = store.head_offset()
        if head <= begin and self._ticked <= begin:
            due = store.due()
            if due is not None and due <= time.time() * 1000:
                self._ticked = head = store.append_tick()
        end = round_end(begin, head, self.max_rows, self.max_matches, store.matches_per_entry())
        if end == start["offset"] and time.monotonic() - self._beaten > BEAT:
            # nothing to match: the partitions are alive, waiting for the log
            store.partition_beat(range(self.partitions_n))
            self._beaten = time.monotonic()
        return {"offset": end}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """Ranges begin where the store's progress is, not at Spark's start: past it when the other
        trigger matched further, short of it when the store is older than the checkpoint (restored
        from a backup), whose entries are then matched, not skipped."""
        store, until = self.store, end["offset"]
        if not self.by_publication:
            return [Range(part, min(store.partition_offset(part), until), until) for part in range(self.partitions_n)]
        # the slices share out what is left to match
        begin = min(store.processed_offset(), until)
        cuts = np.linspace(begin, until, self.partitions_n + 1).round().astype(np.int64).tolist()
        return [Range(part, cuts[part], cuts[part + 1]) for part in range(self.partitions_n)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, int]]:
        assert isinstance(partition, Range)
        yield partition.part, partition.start, partition.end


class MatchRanges:
    """The mapInArrow function: each range's round, by the matcher of its partition. A range whose
    partition already recorded past its start (a batch replayed after its rounds were recorded)
    starts where the partition is. Spark gives a batch's ranges to whichever workers are free, so
    a worker keeps the states of the partitions it ran: with subscription partitioning at most the
    whole index in parts, with publication partitioning one state for all (`Matcher.state_key`)."""

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = store_for(self.matcher.url)
        parts, rounds = [], []
        for batch in batches:
            for part, start, end in zip(*(batch.column(i).to_pylist() for i in range(3)), strict=True):
                # a later slice of publication partitioning begins past the progress: the slices
                # before it are in this batch too, and recorded before it
                begin = max(start, store.partition_offset(self.matcher.progress(part)))
                if begin >= end:
                    continue
                began = time.monotonic()
                done = self.matcher.round(store, part, begin, end)
                parts.append(part)
                rounds.append(encode_round(done._replace(took_ms=int((time.monotonic() - began) * 1000))))
        columns = [pa.array(parts, pa.int32()), pa.array(rounds, pa.binary())]
        yield pa.RecordBatch.from_arrays(columns, schema=_ROUNDS_ARROW)


class RecordRounds:
    """The foreachBatch function: the batch's rounds recorded in log order (publication partitioning
    records each slice as the one progress it shares, so the order is the slices')."""

    def __init__(self, url: str, partitions: int) -> None:
        self.url = url
        self.partitions = partitions

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        store = store_for(self.url)
        rounds = sorted((decode_round(row["round"]) for row in frame.collect()), key=lambda done: done.start or 0)
        for done in rounds:
            if not store.record_round(done):
                # its range began where the progress is not: Spark must not commit the batch
                raise RuntimeError(f"round of partition {done.part} from {done.start} was refused by the store")
            trace.mark("recorded", done.start or 0, done.end)
        store.partition_beat(range(self.partitions))
