"""The `rounds` trigger's source: a PySpark Python data source whose micro-batches are epochs.

This uses Spark to place, start and retry long-running tasks, not to stream: an offset is an epoch
number, and each epoch is one micro-batch whose tasks follow the log for the epoch's length
(`PartitionTask`), recording their rounds in the store as they go, and report where they got to.
Spark checkpoints the epochs; which log entries were processed is the store's to know (per
partition, in the transactions that record them), so a restarted query, a replayed epoch or a
retried task resumes where the partition's last recorded round ended.

An epoch has one task per matcher partition, or in local mode one per task thread if those are
fewer (`slots`, from the driver): each task then runs several partitions in turn from the start,
rather than leaving some to wait for a core until a running task adopts them by their silence.
Which partitions a task runs it claims when it starts (`PartitionTask`): those whose state its
Python worker already holds first, whichever worker Spark gave it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit

from veil.pipeline.matcher import Matcher
from veil.pipeline.partition_task import PartitionTask
from veil.pipeline.store_handle import store_for

EPOCH_SCHEMA = "parts STRING, processed LONG, rounds LONG"


class Lease(InputPartition):
    """A task of an epoch: follow the log until `deadline` (Unix time), the same for all the epoch's
    tasks, so that one started late (it waited for a core while another task adopted its
    partitions) does not hold the epoch open for a whole epoch more."""

    def __init__(self, index: int, task: PartitionTask, deadline: float, cuts: tuple[int, int]) -> None:
        super().__init__(index)
        self.task = task
        self.deadline = deadline
        self.cuts = cuts  # the store's count of epoch cuts when it was planned: a later one cuts it


class EventLogSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "veil_log"

    def schema(self) -> str:
        return EPOCH_SCHEMA

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return EpochReader(self.options)


class EpochReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.url = options["store"]
        self.partitions_n = int(options.get("partitions", "1"))
        self.seconds = float(options.get("epochSeconds", "300"))
        self.by_publication = options.get("partitionMode", "subscriptions") == "publications"
        self.with_authorization = options.get("authorization", "true") == "true"
        self.entry_timeout = float(options.get("entryTimeout", "60"))
        self.max_rows = int(options.get("maxRowsPerRound", "50000"))
        self.round_gap = int(options.get("roundGapMs", "100")) / 1000
        self.max_matches = int(options.get("maxMatchesPerRound", "2000000"))
        self.slots = max(1, int(options.get("slots", str(self.partitions_n))))

    def initialOffset(self) -> dict:
        return {"epoch": 0}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Always the next epoch: the next batch starts as soon as the last one ends."""
        return {"epoch": start.get("epoch", 0) + 1}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        deadline = time.time() + self.seconds
        tasks = min(self.slots, self.partitions_n)
        cuts = store_for(self.url).epoch_cuts()
        return [Lease(i, self._task(i, tasks), deadline, cuts) for i in range(tasks)]

    def _task(self, task: int, tasks: int) -> PartitionTask:
        matcher = Matcher(self.url, self.partitions_n, self.by_publication, self.with_authorization, self.entry_timeout)
        return PartitionTask(matcher, task, tasks, self.max_rows, self.max_matches, self.round_gap)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Lease)
        processed, rounds = partition.task.run(partition.deadline, partition.cuts)
        yield pa.RecordBatch.from_pydict(
            {"parts": [",".join(map(str, partition.task.parts))], "processed": [processed], "rounds": [rounds]},
            schema=pa.schema([("parts", pa.string()), ("processed", pa.int64()), ("rounds", pa.int64())]),
        )
